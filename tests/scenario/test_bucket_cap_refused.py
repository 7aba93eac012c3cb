"""``trainer.bucket_cap_mb`` below 1 MB (which crashes compiled DDP with an AssertionError)
is refused on every run with one ``error:`` line and exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from transformer_nmt.errors import UserError
from transformer_nmt.train.setup import check_bucket_cap_mb


@pytest.mark.parametrize("value", [0.0, 0.5, -1.0, float("nan")])
def test_small_buckets_are_refused(value):
    with pytest.raises(UserError, match=r"trainer.bucket_cap_mb=.*at least 1 MB"):
        check_bucket_cap_mb(value)


def test_one_mb_and_more_are_accepted():
    check_bucket_cap_mb(1.0)
    check_bucket_cap_mb(25.0)


def test_nmt_train_refuses_it_with_one_error_line(synthetic_corpus, tiny_model, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-m", "transformer_nmt.cli.train", "experiment=multi30k_en_de",
            *synthetic_corpus.overrides, *tiny_model, f"run_dir={tmp_path / 'run'}",
            "trainer.max_steps=1", "trainer.bucket_cap_mb=0.5"]
    proc = subprocess.run(args, check=False, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: trainer.bucket_cap_mb=0.5") and "Traceback" not in proc.stderr
