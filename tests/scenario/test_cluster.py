"""The cluster, simulated on one machine (gloo, 127.0.0.1): two nodes, a killed worker, SLURM's
SIGTERM.

Each test starts real ``torchrun`` agents (``python -m torch.distributed.run``) that run
``transformer_nmt.cli.train`` on a synthetic corpus (copy / reversal of random token strings,
``data=custom``), prepared once for the module, so nothing here needs the Multi30k mirror.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from helpers import TINY_MODEL
from unit.train.test_distributed import TRAINER, assert_same_training

from transformer_nmt.checkpoint import (
    checkpoint_dir,
    latest_checkpoint,
    load_checkpoint,
    step_checkpoints,
)
from transformer_nmt.config import compose
from transformer_nmt.data.batching import LengthBucketSampler
from transformer_nmt.data.binarize import TokenDataset
from transformer_nmt.fileio import bin_prefix
from transformer_nmt.train.distributed import group_namespace

pytestmark = [pytest.mark.slow, pytest.mark.heavy]

MICRO = [*TINY_MODEL, *TRAINER]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TRAIN = ["-m", "transformer_nmt.cli.train"]
WORDS = [f"{c}{v}" for c in "bdgklmnprst" for v in "aeiou"]  # 55 syllables


def _write_task(prefix: Path, n: int, seed: int) -> None:
    """``n`` pairs: a random string of syllables and its reversal (every third one copied)."""
    rng = random.Random(seed)
    src, tgt = [], []
    for i in range(n):
        words = rng.choices(WORDS, k=rng.randint(2, 12))
        src.append(" ".join(words))
        tgt.append(" ".join(words if i % 3 == 0 else reversed(words)))
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    Path(f"{prefix}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def data_overrides(tmp_path_factory) -> list[str]:
    """A 400-pair synthetic corpus with a 120-piece vocabulary, prepared once for the module."""
    from transformer_nmt.data.prepare import prepare

    root = tmp_path_factory.mktemp("cluster")
    for split, n, seed in (("train", 400, 1), ("valid", 20, 2), ("test", 20, 3)):
        _write_task(root / "corpus" / split, n, seed)
    ov = ["data=custom", "data.name=synthetic", "data.src_lang=en", "data.tgt_lang=de",
          f"data.root={root / 'data'}", "data.vocab_size=120", "data.num_workers=1",
          *(f"+data.custom_files.{s}={root / 'corpus' / s}" for s in ("train", "valid", "test"))]
    prepare(compose(ov))
    return ov


def _env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK"):
        env.pop(key, None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _finish(proc: subprocess.Popen, what: str, timeout: float = 300) -> str:
    """Wait for ``proc``; fail with its output unless it exited 0. Returns its stderr."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"{what} did not finish in {timeout} s:\n{err[-4000:]}")
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{err[-5000:]}"
    return err


def _start(args: list[str]) -> subprocess.Popen:
    """Start a command in its own session (process group), as a batch system does."""
    return subprocess.Popen(args, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _children(pid: int) -> list[int]:
    """Process ids whose parent is ``pid`` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    found = [int(e[5:]) for e in env if e.startswith(b"RANK=")]
    return found[0] if found else None


def _wait(cond, proc: subprocess.Popen, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            pytest.fail(f"exited ({proc.returncode}) before {what}:\n"
                        f"{proc.communicate()[1][-4000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.01)


def _batches(cfg, max_tokens: int) -> int:
    d = cfg.data
    return LengthBucketSampler(TokenDataset(bin_prefix(d, "train", d.src_lang)).sizes,
                               TokenDataset(bin_prefix(d, "train", d.tgt_lang)).sizes, max_tokens,
                               seed=int(cfg.trainer.seed)).num_batches


def _store_client(port: int) -> torch.distributed.TCPStore:
    return torch.distributed.TCPStore("127.0.0.1", port, is_master=False,
                                      timeout=timedelta(seconds=60))


def _group_tokens(port: int, world_size: int, late: int, delay: float) -> list[str]:
    """``group_namespace`` on ``world_size`` threads (rank ``late`` starts ``delay`` s late)."""
    tokens: list[str | BaseException | None] = [None] * world_size

    def rank_main(rank: int) -> None:
        if rank == late:
            time.sleep(delay)
        try:
            tokens[rank] = group_namespace(_store_client(port), rank, world_size,
                                           timedelta(seconds=60), poll_s=0.001)
        except BaseException as e:  # noqa: BLE001 - reported by the test below
            tokens[rank] = e

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=90)
    assert all(isinstance(t, str) for t in tokens), tokens
    return tokens  # type: ignore[return-value]


def test_group_namespace_is_shared_by_the_group_and_unknown_to_earlier_groups():
    server = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                        timeout=timedelta(seconds=60))
    seen: set[str] = set()
    # the same store for four groups in a row (torchrun's restarts), a different rank late
    # each time: every rank of a group gets the same token, never an earlier group's
    for late in (1, 0, 2, 0):
        tokens = _group_tokens(server.port, 3, late, delay=0.3)
        assert len(set(tokens)) == 1 and len(tokens[0]) == 16, tokens
        assert tokens[0] not in seen
        seen.add(tokens[0])

    with pytest.raises(TimeoutError, match=r"ranks \[1\] of 2 did not join"):
        group_namespace(_store_client(server.port), 0, 2, timedelta(seconds=0.3))


RANK_SCRIPT = '''\
"""One rank of a 2-process gloo group set up by init_distributed; prints the all-reduced sum."""
import sys, time
import torch
from transformer_nmt.train import distributed

time.sleep(float(sys.argv[1]))
info = distributed.init_distributed(device="cpu")
total = distributed.all_reduce_sum(torch.tensor([info.rank + 1]))
print(int(total))
distributed.cleanup()
'''


def test_a_group_on_torchruns_shared_store_reads_nothing_an_earlier_group_left(tmp_path):
    """torchrun (c10d rendezvous) hosts one store for all its restarts: a restarted group
    must not read the addresses its killed predecessor published there. Every key the first
    group left is overwritten with garbage before the second group starts, with rank 1
    late, so reading any of them fails the set-up."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    server = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                        timeout=timedelta(seconds=60))

    def group(delay_rank1: float) -> None:
        procs = []
        try:
            for rank, delay in ((0, 0.0), (1, delay_rank1)):
                env = {**_env(), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(server.port),
                       "TORCHELASTIC_USE_AGENT_STORE": "True"}
                procs.append(subprocess.Popen([sys.executable, str(script), str(delay)],
                                              env=env, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True))
            for rank, proc in enumerate(procs):
                try:
                    out, err = proc.communicate(timeout=120)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"rank {rank} did not finish in 120 s")
                assert proc.returncode == 0 and out.split() == ["3"], f"rank {rank}:\n{err[-3000:]}"
        finally:  # a failed rank leaves the other one waiting for it
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()

    group(0.0)
    stale = server.list_keys()
    assert stale
    for key in stale:
        server.set(key, "stale")
    group(1.5)


def test_two_nodes_of_two_processes_equal_one_process_with_update_freq_4(tmp_path, data_overrides):
    cfg = compose(data_overrides)
    # Batches per epoch not a multiple of 4: in the last round some ranks run a dummy batch.
    max_tokens = next(m for m in range(300, 900, 8)
                      if (n := _batches(cfg, m)) % 4 != 0 and 12 <= n <= 40)
    steps_per_epoch = math.ceil(_batches(cfg, max_tokens) / 4)
    max_steps = 2 * steps_per_epoch + 1  # cross two epoch boundaries
    common = [*data_overrides, *MICRO, f"trainer.max_tokens={max_tokens}",
              f"trainer.max_steps={max_steps}"]

    ddp_dir = tmp_path / "nodes"
    port = _free_port()
    agents = [
        _start([*TORCHRUN, "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d",
                f"--rdzv_endpoint=127.0.0.1:{port}", "--rdzv_id=two-nodes",
                "--local_addr=127.0.0.1", *TRAIN, *common, f"run_dir={ddp_dir}",
                "trainer.update_freq=1"])
        for _node in range(2)
    ]
    one_dir = tmp_path / "one"
    single = _start([sys.executable, *TRAIN, *common, f"run_dir={one_dir}",
                     "trainer.update_freq=4"])
    for i, agent in enumerate(agents):
        _finish(agent, f"torchrun agent {i}")
    _finish(single, "the single process")

    assert_same_training(ddp_dir, one_dir, max_steps, world_size=4)
    ranks = load_checkpoint(latest_checkpoint(ddp_dir))["rng"]
    assert not torch.equal(ranks[0]["torch"], ranks[3]["torch"])  # four distinct RNG streams


LATE_RANK = '''\
"""Run nmt-train; in a restarted group (TORCHELASTIC_RESTART_COUNT > 0) rank 1 starts late."""
import os, runpy, sys, time

if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0" and os.environ["RANK"] == "1":
    time.sleep(float(sys.argv[1]))
sys.argv = ["nmt-train", *sys.argv[2:]]
runpy.run_module("transformer_nmt.cli.train", run_name="__main__")
'''


def test_killed_worker_restarts_and_ends_identical_to_an_uninterrupted_run(tmp_path,
                                                                           data_overrides):
    common = [*data_overrides, *MICRO, "trainer.max_tokens=400", "trainer.max_steps=60",
              "trainer.save_every_steps=5", "trainer.keep_last=20"]
    standalone = [*TORCHRUN, "--standalone", "--nproc_per_node=2", "--max-restarts=1",
                  "--monitor-interval=0.1"]
    # The restarted rank 1 joins 2 s after rank 0, as ranks of a real job do (other nodes,
    # slower file systems): torchrun's store still holds the killed group's addresses, and
    # a rank that read them failed ("connectFullMesh ... Connection refused") or waited
    # forever for a peer that never connected.
    late = tmp_path / "late_rank.py"
    late.write_text(LATE_RANK)
    ref_dir, run_dir = tmp_path / "reference", tmp_path / "killed"
    reference = _start([*standalone, *TRAIN, *common, f"run_dir={ref_dir}"])
    proc = _start([*standalone, str(late), "2", *common, f"run_dir={run_dir}"])
    _wait(lambda: (checkpoint_dir(run_dir) / "checkpoint_5.pt").exists(), proc, "checkpoint_5.pt")
    victim = next(pid for pid in _children(proc.pid) if _rank_of(pid) == 1)
    os.kill(victim, signal.SIGKILL)
    err = _finish(proc, "torchrun with a killed worker")
    _finish(reference, "the uninterrupted run")

    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["steps"] == 60 and summary["resumed_from"] is not None, err[-3000:]
    resumed = load_checkpoint(summary["resumed_from"])["train_state"]["step"]
    assert 5 <= resumed < 60 and resumed % 5 == 0
    a = load_checkpoint(latest_checkpoint(run_dir))
    b = load_checkpoint(latest_checkpoint(ref_dir))
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), f"{key} differs after the restart"
    for k, state in a["optimizer"]["state"].items():
        assert torch.equal(state["exp_avg"], b["optimizer"]["state"][k]["exp_avg"])
        assert torch.equal(state["exp_avg_sq"], b["optimizer"]["state"][k]["exp_avg_sq"])
    for key in ("step", "micro_step", "tokens_seen", "src_sq_seen", "tgt_sq_seen", "skipped_steps"):
        assert a["train_state"][key] == b["train_state"][key], key
    consumed = a["sampler"].pop("consumed"), b["sampler"].pop("consumed")
    assert a["sampler"] == b["sampler"] and torch.equal(*consumed)
    for r_a, r_b in zip(a["rng"], b["rng"], strict=True):
        assert torch.equal(r_a["torch"], r_b["torch"])


WRAPPER = '''\
"""Run nmt-train and write this rank's exit status to <status_dir>/rank<RANK>."""
import os, runpy, sys
from pathlib import Path

status_dir = Path(sys.argv[1])
sys.argv = ["nmt-train", *sys.argv[2:]]
code = 1
try:
    runpy.run_module("transformer_nmt.cli.train", run_name="__main__")
    code = 0
except SystemExit as e:
    code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    raise
finally:
    (status_dir / f"rank{os.environ['RANK']}").write_text(str(code))
'''


def test_sigterm_to_the_process_group_checkpoints_once_and_resumes(tmp_path, data_overrides):
    wrapper, status = tmp_path / "worker.py", tmp_path / "status"
    wrapper.write_text(WRAPPER)
    status.mkdir()
    run_dir = tmp_path / "run"
    common = [*data_overrides, *MICRO, "trainer.max_tokens=400", "trainer.num_workers=2",
              "trainer.log_every_steps=1", f"run_dir={run_dir}"]
    standalone = [*TORCHRUN, "--standalone", "--nproc_per_node=2"]
    proc = _start([*standalone, str(wrapper), str(status), *common, "trainer.max_steps=100000"])
    metrics = run_dir / "metrics.jsonl"
    _wait(lambda: metrics.is_file() and '"train"' in metrics.read_text(), proc, "a training step")
    os.killpg(proc.pid, signal.SIGTERM)  # SLURM signals every process of the job step
    try:
        _, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("torchrun did not stop within 240 s of SIGTERM")
    assert sorted((p.name, p.read_text()) for p in status.iterdir()) == [
        ("rank0", "0"), ("rank1", "0")], err[-4000:]
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["stopped_by"] == "signal SIGTERM" and summary["world_size"] == 2
    [saved] = step_checkpoints(run_dir)  # one checkpoint, at the step where it stopped
    assert saved.name == f"checkpoint_{summary['steps']}.pt"
    stopped_at = load_checkpoint(saved)["train_state"]["step"]
    assert stopped_at == summary["steps"] >= 1

    # the requeued job resumes from it
    again = _start([*standalone, str(wrapper), str(status), *common,
                    f"trainer.max_steps={stopped_at + 3}"])
    _finish(again, "the resumed run")
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["resumed_from"] == str(saved) and summary["steps"] == stopped_at + 3
    assert summary["stopped_by"] == "max_steps"
