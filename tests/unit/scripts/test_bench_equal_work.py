"""The log readers of scripts/bench/bench_equal_work.py: per-epoch figures from runs that were
interrupted and resumed must count every step and every epoch exactly once."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "bench"))
import bench_equal_work as ew


def _train(step: int, epoch: float, loss: float, ntok: float) -> str:
    # tokens_per_s x seconds_per_step = the step's target tokens
    return json.dumps({"split": "train", "step": step, "epoch": epoch, "loss": loss,
                       "tokens_per_s": ntok / 2.0, "seconds_per_step": 2.0})


def test_ours_epoch_losses_weight_by_tokens_and_count_a_resumed_step_once(tmp_path):
    lines = [
        _train(1, 0.5, 4.0, 100), _train(2, 1.0, 2.0, 300),  # epoch 1: (400 + 600) / 400
        _train(3, 1.5, 1.0, 50),                            # logged, then lost at a kill
        _train(3, 1.5, 1.5, 50), _train(4, 2.0, 0.5, 50),   # resumed: step 3 again
        json.dumps({"split": "valid", "step": 2, "ppl": 9.0}),
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert ew.ours_epoch_losses(tmp_path) == pytest.approx([2.5, 1.0])
    assert [r["ppl"] for r in ew.metrics_by_step(tmp_path, "valid")] == [9.0]


def test_fairseq_epoch_logs_take_the_later_attempt_and_convert_to_nats(tmp_path):
    first = tmp_path / "fairseq_train.1.log"
    second = tmp_path / "fairseq_train.2.log"
    first.write_text(
        '2026-11-23 | INFO | train | {"epoch": 1, "train_loss": "8", "train_ppl": "256"}\n'
        '2026-11-23 | INFO | valid | {"epoch": 1, "valid_loss": "7", "valid_ppl": "100.5"}\n'
        '2026-11-23 | INFO | train_inner | {"epoch": 2, "loss": "6.5"}\n')  # killed in epoch 2
    second.write_text(
        '2026-11-23 | INFO | train | {"epoch": 2, "train_loss": "6", "train_ppl": "64"}\n'
        'not json {\n'
        '2026-11-23 | INFO | valid | {"epoch": 2, "valid_loss": "5", "valid_ppl": "30.25"}\n')
    losses, ppls = ew.fairseq_epoch_logs([first, second])
    assert losses == pytest.approx([8 * math.log(2), 6 * math.log(2)])
    assert ppls == [100.5, 30.25]


def test_fairseq_hypotheses_in_id_order_as_text(tmp_path):
    class Pieces:
        @staticmethod
        def decode_pieces(pieces):
            return "".join(pieces).replace("\u2581", " ").strip()

    log = tmp_path / "generate.log"
    log.write_text("S-1\tx\nH-1\t-0.5\t\u2581zwei\u2581Hunde\nH-0\t-0.2\t\u2581ein\u2581Mann\n"
                   "D-0\t-0.2\tignored\nH-2\t-1.0\t\n")
    assert ew.fairseq_hypotheses(log, Pieces()) == ["ein Mann", "zwei Hunde", ""]


def test_ours_is_initialised_as_fairseq_and_xavier_is_its_own_row(tmp_path):
    args = ew.argparse.Namespace(init="fairseq", dropout=0.1, max_tokens=4096, epochs=20,
                                 warmup=1000, lr_multiplier=1.0, average=5, beam=4, lenpen=0.6,
                                 max_train_pairs=None, vocab_size=2000)
    assert ew.ours_name(args) == "ours"
    assert "model.init=fairseq" in ew.ours_overrides(args, tmp_path / "ours")
    args.init = "xavier"
    assert ew.ours_name(args) == "ours_xavier"
    assert "model.init=xavier" in ew.ours_overrides(args, tmp_path / "ours_xavier")
    row = {"train_loss_per_epoch": [5.0, 4.0], "valid_ppl_per_epoch": [20.0, 10.0]}
    table = ew.markdown({"fairseq": row, "ours_xavier": row, "ours": row})
    names = [line.split("|")[1].strip() for line in table.splitlines()[2:5]]
    assert names == ["ours", "ours_xavier", "fairseq"]
