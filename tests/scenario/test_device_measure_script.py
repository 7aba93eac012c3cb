"""scripts/cluster/device_measure.py (the whole GPU measurement in one call) on the CPU: the
carried wheels are installed into a temporary folder its children import from, Multi30k is
prepared from the bundle, every configuration of the smoke plan runs through gpu_profile.py and
the report is written; without a GPU or without the Multi30k files it says so in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cluster" / "device_measure.py"
sys.path.insert(0, str(SCRIPT.parent))
import device_measure  # noqa: E402  (found on the sys.path entry above)


def _probe_wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel whose module records that it was imported."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "measure_probe-0.1-py3-none-any.whl"
    info = "measure_probe-0.1.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("measure_probe/__init__.py", "CARRIED = True\n")
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: measure-probe\n"
                   "Version: 0.1\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                   "Root-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", f"measure_probe/__init__.py,,\n{info}/METADATA,,\n"
                   f"{info}/WHEEL,,\n{info}/RECORD,,\n")
    return path


def test_carried_wheels_are_installed_where_the_children_import_them(tmp_path):
    _probe_wheel(tmp_path / "wheels")
    site = tmp_path / "site"
    assert device_measure.install_wheels(tmp_path / "wheels", site) == [
        "measure_probe-0.1-py3-none-any.whl"]
    env = device_measure.child_env(site)
    proc = subprocess.run(
        [sys.executable, "-c", "import measure_probe, transformer_nmt, sys; "
         "print(measure_probe.CARRIED, transformer_nmt.__file__)"],
        env=env, capture_output=True, text=True, check=True)
    carried, package = proc.stdout.split()
    assert carried == "True" and Path(package).is_relative_to(REPO / "src")
    assert device_measure.install_wheels(tmp_path / "none", site) == []  # nothing carried


def test_the_plan_covers_both_sizes_budgets_and_batch_kinds():
    plan = device_measure.PLAN
    assert len(plan) == len(set(plan)) == 12
    assert {(s, t) for s, t, _ in plan} == {(s, t) for s in ("base", "big")
                                            for t in (3100, 30712)}
    assert plan[0] == ("base", 3100, "padded")  # the host-bound batch first
    cmd = device_measure.profile_command("big", 30712, "graphed", Path("o"), Path("d"), False)
    assert cmd[cmd.index("--max-tokens") + 1] == "30712"
    assert "--packing" in cmd and "--cuda-graphs" in cmd and "--smoke" not in cmd
    padded = device_measure.profile_command("base", 3100, "padded", Path("o"), Path("d"), False)
    assert "--packing" not in padded and "--cuda-graphs" not in padded


def _smoke(tmp_path: Path, mirror: Path, parts: str, *extra: str) -> tuple[dict, Path]:
    """Run the CPU path with ``--parts parts`` (and ``extra`` arguments) from a bundle of the
    Multi30k files and a probe wheel, its work folder ``tmp_path/work``: (the report, the
    output folder)."""
    bundle = tmp_path / "bundle"
    (bundle / "multi30k").parent.mkdir(parents=True)
    (bundle / "multi30k").symlink_to(mirror)
    _probe_wheel(bundle / "wheels")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--parts", parts, "--bundle", str(bundle),
         "--out", str(out), "--work", str(tmp_path / "work"), *extra], cwd=REPO,
        capture_output=True, text=True, timeout=600,
        check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "device_measure.json").read_text()), out


@pytest.mark.heavy
def test_smoke_run_prepares_measures_and_reports(tmp_path, multi30k_mirror):
    report, out = _smoke(tmp_path, multi30k_mirror, "step", "--prewarm", "0")
    assert "decode" not in report and "prewarm" not in report
    assert report["installed"] == ["measure_probe-0.1-py3-none-any.whl"]
    configs = report["configurations"]
    assert list(configs) == ["base-256-padded", "base-256-packed", "base-256-graphed"]
    for name, entry in configs.items():
        assert entry["status"] == "ran", (name, entry)
        result = entry["result"]
        assert result["speed"]["target_tokens"] > 0 and result["speed"]["steps"] == 3
        assert result["profile"]["host_ms_per_step"] > 0 and result["profile"]["top_host_ops"]
    assert configs["base-256-packed"]["result"]["packing"] is True
    graphed = configs["base-256-graphed"]["result"]
    assert graphed["packing"] is True and graphed["cuda_graphs"] is True
    assert graphed["speed"]["graphs_compiled_while_timed"] == 0  # one shape, compiled once
    rows, cols = configs["base-256-packed"]["result"]["packed_shape"]
    assert rows >= 1 and cols >= 2
    padded = configs["base-256-padded"]["result"]
    assert padded["packing"] is False
    # gpu_profile.py's other parts, on the padded configuration
    speed = padded["speed"]
    assert speed["graphs_compiled"] >= 1 and speed["graphs_compiled_while_timed"] == 0
    assert padded["profile"]["steps"] == 2  # the profiler's warm-up steps are left out
    shares = padded["profile"]["share_by_kind"]
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3) and shares["matmul"] > 0
    assert padded["loss"]["ms_fwd_bwd"] > 0 and padded["loss"]["vocab"] == 200
    memory = padded["memory"]["rows"]
    assert [r["max_tokens"] for r in memory] == [256, 512]
    assert all(0 < r["padded_tokens"] <= r["max_tokens"] for r in memory)
    assert sorted(f.name for f in out.iterdir()) == ["device_measure.json", "device_measure.md"]
    profile_md = (tmp_path / "work" / "profiles" / "base-256-padded" / "gpu_profile.md"
                  ).read_text()
    assert "| base | padded 256 |" in profile_md and "host time by op, base" in profile_md
    assert f"| `{padded['profile']['top_host_ops'][0][0]}` |" in profile_md
    markdown = (out / "device_measure.md").read_text()
    assert "| base-256-padded | ran |" in markdown and "| base-256-packed | ran |" in markdown


@pytest.mark.heavy
def test_the_decoding_part_trains_a_model_and_times_ours_against_marian(tmp_path,
                                                                        multi30k_mirror):
    report, out = _smoke(tmp_path, multi30k_mirror, "decode", "--checks", "",
                         "--decode-toolkits", "ours,marian,ours_compiled")
    assert list(report["configurations"]) == []  # the step part was not asked for
    # the model trained, and the compiled step decoded once, in the untimed phase
    job = "decode training and compiling"
    assert report["prewarm"] == {job: {"status": "ran",
                                       "seconds": report["prewarm"][job]["seconds"]}}
    prewarmed = json.loads((tmp_path / "work" / "decode_prewarm" / "decode" / "results.json"
                            ).read_text())["toolkits"]
    assert list(prewarmed) == ["ours_compiled"]
    assert len(prewarmed["ours_compiled"]["all_seconds"]) == 1
    # the decoding part found its checkpoint
    decode = report["decode"]
    assert decode["status"] == "ran" and decode["checkpoint_steps"] == 10
    toolkits = decode["toolkits"]
    ours, marian = toolkits["ours"], toolkits["marian"]
    assert ours["same_as_ours"] == 1.0 and 0.0 <= marian["same_as_ours"] <= 1.0
    assert toolkits["ours_compiled"]["same_as_ours"] == 1.0  # the compiled step: same search
    # one graph for every bucket (compiled by the timed process's warm-up); on a CPU no CUDA
    # graph, so none skipped
    assert toolkits["ours_compiled"]["compiler"] == {"graphs": 1, "cudagraph_skips": 0}
    assert toolkits["ours"]["compiler"] is None
    assert ours["target_tokens_per_s"] > 0 and marian["target_tokens_per_s"] > 0
    # one profiled pass over 4 sentences per toolkit, per decoding step (one decoder call);
    # the tiny model's 4 sentences need at least max_len_b + 1 = 7 steps at most, 1 at least
    for name in ("ours", "marian", "ours_compiled"):
        profile = toolkits[name]["profile"]
        assert profile["sentences"] == 4 and 1 <= profile["steps"] <= 7, (name, profile)
        assert profile["host_ms_per_step"] > 0 and profile["top_host_ops"]
        assert profile["kernel_ms_per_step"] > 0
        assert profile["kernels_per_step"] is None and "gpu_busy_share" not in profile  # CPU
        assert toolkits[name]["decoder_calls"] >= profile["steps"]  # 8 sentences timed
    markdown = (out / "device_measure.md").read_text()
    assert "| marian |" in markdown and "| ours_compiled |" in markdown
    assert "ours_compiled: 1 graphs compiled, 0 skipped by CUDA graphs" in markdown
    assert f"| {toolkits['marian']['decoder_calls']} | {marian['profile']['wall_ms_per_step']} |" \
        in markdown


def test_the_decoding_part_keeps_the_toolkits_that_finished(tmp_path, monkeypatch):
    """A bench that fails (or meets the budget) after some toolkits: their figures are kept,
    with the failure as the status; an earlier call's results are never taken for new ones."""
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "checkpoint_7.pt").write_bytes(b"")
    results = tmp_path / "decode" / "results.json"
    results.parent.mkdir()
    results.write_text("stale")
    seen = []

    def bench(cmd, **kw):
        seen.append(cmd)
        if len(seen) == 2:
            raise subprocess.TimeoutExpired(cmd, 1.0)
        results.write_text(json.dumps({"toolkits": {"ours": {
            "sentences_per_s": 10.0, "target_tokens_per_s": 100.0, "bleu": 1.0,
            "same_as_ours": 1.0, "all_seconds": [0.2, 0.1]}}}))
        return subprocess.CompletedProcess(cmd, 1, "", "ours_compiled: boom")

    monkeypatch.setattr(device_measure.subprocess, "run", bench)
    entry = device_measure.run_decode(tmp_path, tmp_path / "data", tmp_path, {}, True, 60.0,
                                      "ours,ours_compiled", repeats="5")
    assert entry["status"] == "bench exit 1" and entry["stderr_tail"] == "ours_compiled: boom"
    assert entry["checkpoint_steps"] == 7 and list(entry["toolkits"]) == ["ours"]
    assert entry["toolkits"]["ours"]["all_seconds"] == [0.2, 0.1]
    cmd = seen[0]
    assert cmd[cmd.index("--toolkits") + 1] == "ours,ours_compiled"
    assert cmd[cmd.index("--repeats") + 1] == "5"
    assert cmd[cmd.index("--checkpoint") + 1].endswith("checkpoint_7.pt")
    assert "| ours | 10.0 | 100 | 1.00 | 1.000 | 0.20, 0.10 | - | - | - | - | - | - |" == \
        device_measure.decode_row("ours", entry["toolkits"]["ours"])  # not profiled
    profiled = {**entry["toolkits"]["ours"], "decoder_calls": 173, "profile": {
        "wall_ms_per_step": 5.9, "kernel_ms_per_step": 1.2, "kernels_per_step": 210.0,
        "host_ms_per_step": 4.1, "gpu_busy_share": 0.21}}
    assert device_measure.decode_row("ours", profiled).endswith(
        "| 0.20, 0.10 | 173 | 5.9 | 1.2 | 210.0 | 4.1 | 21% |")
    # stopped at the budget before writing anything: the earlier results are gone, not shown
    entry = device_measure.run_decode(tmp_path, tmp_path / "data", tmp_path, {}, True, 60.0)
    assert entry == {"status": "stopped after 60 s (budget)"} and not results.exists()


def test_without_a_gpu_or_the_corpus_it_says_so_in_one_line(tmp_path):
    for args in (["--bundle", str(tmp_path)], ["--smoke", "--bundle", str(tmp_path)]):
        proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(tmp_path / "o")],
                              cwd=REPO, capture_output=True, text=True, timeout=300,
                              check=False)
        assert proc.returncode == 2
        assert proc.stderr.startswith("error: no ") and proc.stderr.count("\n") == 1


def _job(tmp_path: Path, name: str, seconds: float, gib: float = 0.0,
         log: Path | None = None) -> device_measure.Job:
    """A job that appends ``start <name>`` and ``end <name>`` to ``log`` around a sleep."""
    log = log or tmp_path / "events"
    code = (f"import time; open({str(log)!r}, 'a').write('start {name}\\n'); "
            f"time.sleep({seconds}); open({str(log)!r}, 'a').write('end {name}\\n')")
    return device_measure.Job(name, [sys.executable, "-c", code], tmp_path / f"{name}.log",
                              dict(os.environ), gib=gib)


def test_the_prewarm_phase_keeps_to_its_slots_memory_and_deadline(tmp_path):
    events = tmp_path / "events"
    jobs = [_job(tmp_path, "a", 0.5, gib=30), _job(tmp_path, "b", 0.5, gib=30),
            _job(tmp_path, "c", 0.5, gib=30), _job(tmp_path, "d", 0.2, gib=5)]
    chain = [_job(tmp_path, "x", 0.3, gib=5), _job(tmp_path, "y", 0.3, gib=5)]
    result = device_measure.run_concurrently(jobs, chain, slots=3, memory_gib=70.0,
                                             deadline=time.monotonic() + 60)
    assert {k: v["status"] for k, v in result.items()} == dict.fromkeys("abcdxy", "ran")
    running, most, gib = set(), 0, {"a": 30, "b": 30, "c": 30, "d": 5, "x": 5, "y": 5}
    for line in events.read_text().split("\n")[:-1]:
        what, name = line.split()
        running.add(name) if what == "start" else running.discard(name)
        assert sum(gib[n] for n in running) <= 70  # c waited for a or b
        assert len(running & set("abcd")) <= 3 and len(running & set("xy")) <= 1
        most = max(most, len(running))
    assert most >= 3  # the jobs ran side by side
    # at the deadline what runs is stopped (its process group killed), the rest not started
    slow = [_job(tmp_path, "slow", 30), _job(tmp_path, "late", 0.1)]
    t0 = time.monotonic()
    result = device_measure.run_concurrently(slow, [], slots=1, memory_gib=1.0,
                                             deadline=t0 + 1.0)
    assert time.monotonic() - t0 < 10
    assert result["slow"]["status"] == "stopped at the deadline"
    assert result["late"] == {"status": "not started (deadline)", "seconds": 0.0}
    assert "end slow" not in events.read_text()


def test_the_prewarm_decodes_once_with_the_compiled_step_on_a_gpu_machine(tmp_path,
                                                                         monkeypatch):
    """The prewarm's decoding job as a GPU machine runs it (not the smoke path): the model
    trains when no checkpoint is there, then one untimed pass of ``ours_compiled`` without a
    warm-up, on CUDA in bf16."""
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        if len(calls) == 1:  # the training writes its checkpoint
            (tmp_path / "run" / "checkpoints").mkdir(parents=True)
            (tmp_path / "run" / "checkpoints" / "checkpoint_300.pt").write_bytes(b"")
        else:
            results = tmp_path / "decode_prewarm" / "decode" / "results.json"
            results.parent.mkdir(parents=True, exist_ok=True)
            results.write_text(json.dumps({"toolkits": {"ours_compiled": {
                "sentences_per_s": 1.0, "target_tokens_per_s": 2.0, "bleu": 0.0,
                "all_seconds": [30.0]}}}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(device_measure.subprocess, "run", fake_run)
    assert device_measure.decode_prewarm(tmp_path, smoke=False) == 0
    train, bench = calls
    assert "model=base" in train and "trainer.precision=bf16" in train
    flags = {a: bench[i + 1] for i, a in enumerate(bench) if a.startswith("--")}
    assert flags["--toolkits"] == "ours_compiled" and flags["--repeats"] == "1"
    assert flags["--warmup-sentences"] == "0" and flags["--device"] == "cuda"
    assert flags["--precision"] == "bf16" and flags["--checkpoint"].endswith("checkpoint_300.pt")
    assert flags["--out"] == str(tmp_path / "decode_prewarm" / "decode")
