"""metrics.jsonl is strict JSON (RFC 8259): a non-finite figure (the gradient norm of a
skipped step) is written as null, which every strict reader accepts and the curves skip."""

from __future__ import annotations

import json
import math

from transformer_nmt.plot.curves import _series, read_metrics
from transformer_nmt.train.metrics import MetricsLog


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_a_nan_gradient_norm_is_written_as_null_and_skipped_by_the_curves(tmp_path):
    log = MetricsLog(tmp_path, enabled=True)
    log.write("train", 1, {"loss": 5.0, "grad_norm": float("nan")})
    log.write("train", 2, {"loss": 4.0, "grad_norm": float("inf")})
    log.write("train", 3, {"loss": 3.5, "grad_norm": 1.25})
    log.close()
    lines = [_strict(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["grad_norm"] for r in lines] == [None, None, 1.25]
    history = read_metrics(tmp_path / "metrics.jsonl")
    steps, values = _series(history["train"], "grad_norm")
    assert steps.tolist() == [3] and values.tolist() == [1.25]
    assert all(math.isfinite(v) for v in _series(history["train"], "loss")[1])
