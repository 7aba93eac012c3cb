"""scripts/micro/packed_memory.py: each mode runs in its own process and reports its peak memory
and the row counts its product met; the packed layer meets only packed_rows' sizes."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from transformer_nmt.decode import prepack

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "micro"))
import packed_memory  # noqa: E402


@pytest.mark.skipif(not prepack.prepack_supported(),
                    reason="this PyTorch build packs no weights with oneDNN")
def test_each_mode_reports_its_memory_and_the_row_counts_met(capsys):
    results = packed_memory.main(["--shape", "16x32", "--counts", "40", "--max-rows", "200",
                                  "--threads", "1"])
    assert [r["mode"] for r in results] == list(packed_memory.MODES)
    rows = random.Random(0).sample(range(1, 201), 40)
    met = {r["mode"]: r["row_counts_met"] for r in results}
    assert met == {"plain": 40, "packed_exact": 40,
                   "packed": len({prepack.packed_rows(m) for m in rows})}
    assert met["packed"] < 40
    for r in results:
        assert 0 < r["rss_before_mib"] <= r["rss_after_mib"]
    assert "| packed | " in capsys.readouterr().out


def test_more_counts_than_rows_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        packed_memory.main(["--counts", "10", "--max-rows", "5"])
    assert e.value.code == 2 and "exceeds --max-rows" in capsys.readouterr().err
