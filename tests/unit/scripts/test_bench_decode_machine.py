"""What scripts/bench/bench_decode.py records about the machine and about CTranslate2's own
choices: the CPU's int8-relevant flags, and the instruction set and GEMM backends
CTranslate2 logs when it loads a model (read from a real load of an exported model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import new_model, write_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts" / "bench"))
import bench_common as bc  # noqa: E402
import bench_decode as bd  # noqa: E402

CPUINFO = """processor\t: 0
model name\t: AMD EPYC
flags\t\t: fpu sse avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 avx512vbmi
processor\t: 1
flags\t\t: fpu sse
"""


def test_cpu_flags_keep_the_int8_ones_of_the_first_core_in_a_fixed_order():
    assert bc.cpu_flags(CPUINFO) == ["avx2", "avx512f", "avx512bw", "avx512_vnni",
                                     "avx512_bf16"]
    assert bc.cpu_flags("processor\t: 0\n") == []  # no flags line (not x86)


def test_machine_info_names_the_dispatch_level_and_flags():
    info = bc.machine_info()
    assert info["cpu_capability"]  # e.g. AVX2, AVX512, DEFAULT
    assert set(info["cpu_flags"]) <= set(bc.INT8_FLAGS)


def test_ct2_runtime_reads_only_the_three_choices():
    log = ("[2026-11-28 14:16:35.174] [ctranslate2] [thread 1] [info] CPU: AuthenticAMD "
           "(AVX2=true)\n"
           "[2026-11-28 14:16:35.174] [ctranslate2] [thread 1] [info]  - Selected ISA: AVX2\n"
           "[2026-11-28 14:16:35.174] [ctranslate2] [thread 1] [info]  - Use Intel MKL: false\n"
           "[2026-11-28 14:16:35.174] [ctranslate2] [thread 1] [info]  - GEMM_S8 backend: DNNL "
           "(packed: false, u8s8 preferred: true)\n"
           "[bench_decode] no such line: here\n")
    assert bd.ct2_runtime(log) == {"isa": "AVX2",
                                   "gemm_s8": "DNNL (packed: false, u8s8 preferred: true)"}
    assert bd.ct2_runtime("") == {}


def test_ct2_runtime_reads_what_ctranslate2_logs_at_load(workspace, tokenizer, tmp_path):
    pytest.importorskip("ctranslate2")
    from transformer_nmt.fileio import spm_model_path
    from transformer_nmt.interop.ctranslate2 import export_ctranslate2

    _, cfg = workspace
    ckpt = tmp_path / "averaged.pt"
    write_checkpoint(ckpt, new_model(cfg, tokenizer.vocab_size, seed=3), cfg, 1)
    folder = export_ctranslate2(ckpt, spm_model_path(cfg.data), tmp_path / "ct2")
    load = ("import ctranslate2, sys; "
            "ctranslate2.Translator(sys.argv[1], device='cpu', compute_type='int8')")
    env = {**os.environ, "CT2_VERBOSE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", load, str(folder)], env=env,
                          capture_output=True, text=True, timeout=120, check=True)
    found = bd.ct2_runtime(proc.stdout + proc.stderr)
    assert set(found) == {"isa", "sgemm", "gemm_s8"}, proc.stderr[-2000:]
    assert found["isa"] in {"GENERIC", "AVX", "AVX2", "AVX512", "NEON"}


def _result(sent_per_s: float, **extra) -> dict:
    return {"sentences": 100, "seconds": 100 / sent_per_s, "sentences_per_s": sent_per_s,
            "target_tokens_per_s": 10 * sent_per_s, "row_steps": None, "peak_rss_mib": 500.0,
            "bleu": 30.0, "same_as_ours": 1.0, **extra}


def _row(table: str, name: str) -> list[str]:
    line = next(x for x in table.splitlines() if x.startswith(f"| {name} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_table_times_a_peer_int8_against_ours_int8_and_the_rest_against_ours():
    results = {"machine": {"cpu": "x", "cpu_flags": ["avx2"], "cpu_capability": "AVX2"},
               "toolkits": {"ours": _result(200.0), "ours_int8": _result(300.0),
                            "ct2_float32": _result(100.0),
                            "ct2_int8": _result(150.0, ct2_runtime={"isa": "AVX2"},
                                                ct2_env={"CT2_VERBOSE": "1"})}}
    table = bd.markdown(results)
    assert _row(table, "ct2_int8")[5:7] == ["1.33", "2.00"]  # ours / it, ours_int8 / it
    assert _row(table, "ct2_float32")[5:7] == ["2.00", "-"]
    assert _row(table, "ours_int8")[5:7] == ["0.67", "-"]
    assert "ct2_int8: CTranslate2 ran isa AVX2" in table and "CT2_VERBOSE" not in table
    del results["toolkits"]["ours"]  # without ours, the first of ours' toolkits that ran
    table = bd.markdown(results)
    assert "ours_int8 / toolkit (sent/s)" in table.splitlines()[0]
    assert _row(table, "ct2_float32")[5] == "3.00"
