"""Decode numbers are checked at start-up: a NaN or infinite float of any group, a length
penalty or length limit out of range, is one line naming the key, before anything runs."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from transformer_nmt.config import compose


@pytest.mark.parametrize("override, message", [
    ("decode.lenpen=nan", "decode.lenpen=nan must be a finite number"),
    ("decode.lenpen=inf", "decode.lenpen=inf must be a finite number"),
    ("decode.lenpen=11", "decode.lenpen=11.0 must be in [0, 10]"),
    ("decode.lenpen=-0.5", "decode.lenpen=-0.5 must be in [0, 10]"),
    ("decode.max_len_a=nan", "decode.max_len_a=nan must be a finite number"),
    ("decode.max_len_a=1e30", "decode.max_len_a=1e+30 must be in [0, 100]"),
    ("decode.max_len_b=99999999999999999999",
     "decode.max_len_b=99999999999999999999 must be in [-1e+06, 1e+06]"),
    ("trainer.lr_multiplier=nan", "trainer.lr_multiplier=nan must be a finite number"),
    ("data.max_ratio=inf", "data.max_ratio=inf must be a finite number"),
])
def test_a_non_finite_or_out_of_range_number_is_refused_naming_the_key(override, message):
    from transformer_nmt.errors import UserError

    with pytest.raises((ValueError, UserError)) as e:
        compose([override])  # validates
    assert message in str(e.value)


def test_the_paper_and_the_presets_values_pass():
    from transformer_nmt.config import validate

    for overrides in ([], ["experiment=multi30k_en_de"], ["decode=greedy"],
                      ["decode.lenpen=0", "decode.max_len_a=0", "decode.max_len_b=1"]):
        validate(compose(overrides))


def test_nmt_evaluate_with_a_nan_length_penalty_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "transformer_nmt.cli.evaluate",
                        "decode.lenpen=nan", f"run_dir={tmp_path / 'run'}"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, check=False,
                       env={**os.environ, "HYDRA_FULL_ERROR": "0"})
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "error: invalid configuration: decode.lenpen=nan must be a finite number"]
    assert not (tmp_path / "run").exists()
