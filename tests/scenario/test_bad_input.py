"""Bad input and killed runs: each case asserts the exact outcome (docs/reliability.md).

Numbers in the test names are the rows of the table in docs/reliability.md.
"""

from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import sentencepiece as spm
import torch

from transformer_nmt import checkpoint, fileio
from transformer_nmt.checkpoint import average_run, check_vocab, load_checkpoint, save_checkpoint
from transformer_nmt.config import compose
from transformer_nmt.data import bpe
from transformer_nmt.data.binarize import TokenDataset
from transformer_nmt.data.corpora import DataError, read_lines
from transformer_nmt.data.prepare import prepare
from transformer_nmt.errors import NoSpaceError, UserError
from transformer_nmt.fileio import bin_prefix, raw_path, spm_model_path

REPO = Path(__file__).resolve().parents[2]
EN = ["the", "a", "man", "woman", "dog", "cat", "runs", "walks", "park", "street", "red", "blue"]
DE = ["der", "die", "mann", "frau", "hund", "katze", "läuft", "geht", "park", "straße", "rot",
      "blau"]
FR = ["le", "la", "homme", "femme", "chien", "chat", "court", "marche", "parc", "rue", "rouge",
      "bleu"]


def write_pairs(prefix: Path, n: int, seed: int, tgt_words=DE) -> None:
    rng = random.Random(seed)
    src, tgt = [], []
    for _ in range(n):
        idx = [rng.randrange(len(EN)) for _ in range(rng.randint(3, 10))]
        src.append(" ".join(EN[i] for i in idx) + " .")
        tgt.append(" ".join(tgt_words[i] for i in idx) + " .")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{prefix}.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    Path(f"{prefix}.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")


def corpus_cfg(tmp_path: Path, corpus: Path, *extra: str):
    """data=custom under the default name ``custom``, files <corpus>/{train,valid,test}.{en,de}."""
    return compose([
        "data=custom", "data.src_lang=en", "data.tgt_lang=de", f"data.root={tmp_path / 'data'}",
        "data.vocab_size=60", "data.num_workers=1",
        f"+data.custom_files.train={corpus / 'train'}",
        f"+data.custom_files.valid={corpus / 'valid'}",
        f"+data.custom_files.test={corpus / 'test'}", *extra,
    ])


def make_corpus(folder: Path, seed: int, tgt_words=DE, n_train: int = 200) -> Path:
    write_pairs(folder / "train", n_train, seed, tgt_words)
    write_pairs(folder / "valid", 10, seed + 1, tgt_words)
    write_pairs(folder / "test", 10, seed + 2, tgt_words)
    return folder


def statuses(summary: dict) -> dict[str, str]:
    return {k: v["status"] for k, v in summary["stages"].items()}


# --- 2, 3, 14: prepared data ---------------------------------------------------------------------


def test_02_second_custom_corpus_with_older_files_rebuilds(tmp_path):
    first = make_corpus(tmp_path / "first", seed=1)
    prepare(corpus_cfg(tmp_path, first))
    # a second corpus, prepared under the same name, whose files are older than the outputs
    second = make_corpus(tmp_path / "second", seed=7, tgt_words=FR)
    for p in second.iterdir():
        os.utime(p, (1_000_000_000, 1_000_000_000))  # 2001
    cfg = corpus_cfg(tmp_path, second)
    summary = prepare(cfg)
    assert statuses(summary) == {"download": "skipped", "clean": "done", "bpe": "done",
                                 "binarize": "done"}
    d = cfg.data
    assert (raw_path(d, "train", "de").read_text(encoding="utf-8")
            == (second / "train.de").read_text(encoding="utf-8"))
    tok = bpe.SentencePieceTokenizer(spm_model_path(d))
    ds = TokenDataset(bin_prefix(d, "train", "de"))
    first_line = (second / "train.de").read_text(encoding="utf-8").split("\n")[0]
    assert tok.decode(ds[0]) == first_line and tok.unk_id not in ds[0].tolist()
    # the same corpus again: nothing to do, and a touched but identical file rebuilds nothing
    os.utime(second / "train.en")
    assert set(statuses(prepare(cfg)).values()) == {"skipped"}


class Killed(BaseException):
    """Stands for SIGKILL between two renames."""


def test_03_spm_json_renamed_before_a_killed_spm_model_is_not_current(tmp_path, monkeypatch):
    corpus = make_corpus(tmp_path / "c", seed=1)
    prepare(corpus_cfg(tmp_path, corpus))
    cfg = corpus_cfg(tmp_path, corpus, "data.vocab_size=50")
    model = spm_model_path(cfg.data)
    old_model = model.read_bytes()
    real = bpe.atomic_write

    def kill_at_model(path, *a, **k):
        if Path(path) == model:
            raise Killed
        return real(path, *a, **k)

    monkeypatch.setattr(bpe, "atomic_write", kill_at_model)
    with pytest.raises(Killed):
        prepare(cfg)
    monkeypatch.setattr(bpe, "atomic_write", real)
    # the kill left a new spm.json (vocab_size 50) beside the old spm.model (60 pieces)
    assert json.loads(bpe.meta_path(model).read_text())["params"]["vocab_size"] == 50
    assert model.read_bytes() == old_model
    summary = prepare(cfg)
    assert summary["stages"]["bpe"]["status"] == "done"
    assert bpe.SentencePieceTokenizer(model).vocab_size == 50 == summary["vocab_size"]


def test_14_orphaned_temporary_files_removed_when_the_stage_starts(tmp_path):
    corpus = make_corpus(tmp_path / "c", seed=1)
    cfg = corpus_cfg(tmp_path, corpus)
    prepare(cfg)
    d = cfg.data
    raw_dir, spm_dir = raw_path(d, "train", "en").parent, spm_model_path(d).parent
    bin_dir = bin_prefix(d, "train", "en").parent
    (raw_dir / "orig").mkdir()
    orphans = [raw_dir / "orig" / ".train.en.gz.p2.tmp", raw_dir / ".train.en.k2j3.tmp",
               spm_dir / ".spm_sample.x81k.txt",
               spm_dir / ".spm.model.q9.tmp", bin_dir / ".train.de.bin.zz.tmp"]
    for p in orphans:
        p.write_text("left by a killed run")
    kept = sorted(p for p in (tmp_path / "data").rglob("*") if p.is_file() and p not in orphans)
    summary = prepare(cfg)
    assert set(statuses(summary).values()) == {"skipped"}
    assert [p for p in orphans if p.exists()] == []
    assert sorted(p for p in (tmp_path / "data").rglob("*") if p.is_file()) == kept


# --- 4: the checkpoint's vocabulary ---------------------------------------------------------------


def _spm(tmp_path: Path, name: str, words: list[str],
         vocab: int = 40) -> bpe.SentencePieceTokenizer:
    text = tmp_path / f"{name}.txt"
    rng = random.Random(len(name))
    text.write_text("\n".join(" ".join(rng.choices(words, k=8)) for _ in range(200)) + "\n")
    path = tmp_path / name / "spm.model"
    path.parent.mkdir()
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(path.with_suffix("")),
                                   vocab_size=vocab, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
                                   minloglevel=2)
    return bpe.SentencePieceTokenizer(path)


def test_04_decoding_with_another_vocabulary_is_one_error(tmp_path, caplog):
    ours = _spm(tmp_path, "ours", EN + DE)
    other = _spm(tmp_path, "other", EN + FR)  # same size, other pieces
    assert ours.vocab_size == other.vocab_size
    ckpt = tmp_path / "checkpoint_10.pt"
    torch.save({"vocab": bpe.vocab_identity(ours.model_path), "vocab_size": ours.vocab_size}, ckpt)
    check_vocab(ckpt, ours)  # the right one passes
    with pytest.raises(DataError) as e:
        check_vocab(ckpt, other)
    msg = str(e.value)
    assert "\n" not in msg and str(ckpt) in msg and str(other.model_path) in msg
    assert "another vocabulary" in msg
    assert bpe.vocab_identity(ours.model_path)["vocab_sha256"][:12] in msg
    # a checkpoint without the field: a warning naming it, no failure
    old = tmp_path / "old.pt"
    torch.save({"vocab_size": ours.vocab_size}, old)
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.checkpoint.read"):
        check_vocab(old, other)
    assert "records no vocabulary identity" in caplog.text and str(old) in caplog.text


def test_04_trained_checkpoint_records_its_vocabulary_and_translate_checks_it(tmp_path,
                                                                               tiny_model):
    from transformer_nmt.decode.translate import translate
    from transformer_nmt.train.loop import train

    ours = make_corpus(tmp_path / "ours", seed=1)
    tiny = [*tiny_model, "trainer.max_tokens=512", "trainer.max_steps=2",
            "trainer.save_every_minutes=null", "trainer.validate_every_steps=null",
            f"run_dir={tmp_path / 'run'}"]
    cfg = corpus_cfg(tmp_path, ours, *tiny)
    prepare(cfg)
    train(cfg)
    ckpt = checkpoint.latest_checkpoint(tmp_path / "run")
    assert load_checkpoint(ckpt)["vocab"] == bpe.vocab_identity(spm_model_path(cfg.data))
    # the same size of vocabulary from another corpus under another name
    other = corpus_cfg(tmp_path, make_corpus(tmp_path / "other", seed=5, tgt_words=FR),
                       "data.name=other", *tiny)
    prepare(other)
    source = tmp_path / "in.en"
    source.write_text("the dog runs .\n")
    out = tmp_path / "out.de"
    other.translate.input, other.translate.output = str(source), str(out)
    other.decode.checkpoint = str(ckpt)
    with pytest.raises(DataError, match=f"^{ckpt} was trained with another vocabulary than "
                       f"{spm_model_path(other.data)}"):
        translate(other)
    assert not out.exists()


# --- 5: averaging ---------------------------------------------------------------------------------


def _run_cfg(tmp_path: Path, *extra: str):
    return compose([f"run_dir={tmp_path / 'run'}", "model=tiny", *extra])


def _ckpt(folder: Path, name: str, config: dict, step: int, seed: int, vocab=None) -> Path:
    g = torch.Generator().manual_seed(seed)
    state = {"model": {"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g),
                       "n": torch.tensor(step)},
             "config": config, "vocab_size": 40, "step": step}
    if vocab is not None:
        state["vocab"] = vocab
    return save_checkpoint(folder / name, state)


def _config(seed: int = 1, max_steps: int = 100, save_every_steps=None) -> dict:
    return {"name": "run", "model": {"d_model": 16}, "data": {"name": "toy"},
            "trainer": {"seed": seed, "max_steps": max_steps, "save_every_steps": save_every_steps}}


def test_05_average_last_must_be_at_least_one(tmp_path):
    folder = checkpoint.checkpoint_dir(tmp_path / "run")
    for step in (10, 20, 30):
        _ckpt(folder, f"checkpoint_{step}.pt", _config(), step, step)
    for n in (0, -2):
        with pytest.raises(UserError, match=rf"^average.last must be at least 1, got {n}$"):
            average_run(_run_cfg(tmp_path, f"average.last={n}"))
    assert not (folder / checkpoint.AVERAGED_NAME).exists()


def test_05_average_refuses_checkpoints_of_two_runs(tmp_path):
    folder = checkpoint.checkpoint_dir(tmp_path / "run")
    a = _ckpt(folder, "a.pt", _config(seed=1), 10, 1)
    b = _ckpt(folder, "b.pt", _config(seed=2), 20, 2)
    c = _ckpt(folder, "c.pt", _config(seed=1, max_steps=500), 30, 3)  # resumed, longer: fine
    averaged = _ckpt(folder, checkpoint.AVERAGED_NAME, _config(), 5, 9)
    before = averaged.read_bytes()
    cfg = _run_cfg(tmp_path, f"average.checkpoints=[{a},{b}]")
    with pytest.raises(UserError) as e:
        average_run(cfg)
    assert str(e.value) == (f"{b} and {a} come from different runs (trainer.seed: 1 != 2): "
                            "average checkpoints of one run only")
    assert averaged.read_bytes() == before  # not overwritten
    # other vocabularies (same shapes and config)
    v1, v2 = {"spm_sha256": "aa", "vocab_size": 40}, {"spm_sha256": "bb", "vocab_size": 40}
    d = _ckpt(folder, "d.pt", _config(), 40, 4, vocab=v1)
    e2 = _ckpt(folder, "e.pt", _config(), 50, 5, vocab=v2)
    cfg = _run_cfg(tmp_path, f"average.checkpoints=[{d},{e2}]")
    with pytest.raises(UserError, match="trained with different vocabularies"):
        average_run(cfg)
    # run-length fields may differ: a and c average to the mean
    cfg = _run_cfg(tmp_path, f"average.checkpoints=[{a},{c}]")
    out = load_checkpoint(average_run(cfg))
    ma, mc = torch.load(a)["model"], torch.load(c)["model"]
    torch.testing.assert_close(out["model"]["w"], (ma["w"] + mc["w"]) / 2)
    assert out["averaged_steps"] == [10, 30] and out["step"] == 30


def test_05_final_checkpoint_at_an_odd_step_is_not_averaged(tmp_path, caplog):
    folder = checkpoint.checkpoint_dir(tmp_path / "run")
    for step in (10, 20, 30, 37):  # 37: written when training stopped
        _ckpt(folder, f"checkpoint_{step}.pt", _config(save_every_steps=10), step, step)
    cfg = _run_cfg(tmp_path, "average.last=3")
    with caplog.at_level(logging.INFO, logger="transformer_nmt.checkpoint"):
        out = load_checkpoint(average_run(cfg))
    assert out["averaged_from"] == ["checkpoint_10.pt", "checkpoint_20.pt", "checkpoint_30.pt"]
    assert ("left out checkpoint_37.pt: step not a multiple of trainer.save_every_steps=10"
            in caplog.text)
    # time-based saves: the newest is left out when it comes soon after the one before it
    other = tmp_path / "timed"
    folder = checkpoint.checkpoint_dir(other / "run")
    for step in (100, 205, 298, 402, 430):
        _ckpt(folder, f"checkpoint_{step}.pt", _config(), step, step)
    out = load_checkpoint(average_run(_run_cfg(other, "average.last=3")))
    assert out["averaged_steps"] == [205, 298, 402]


# --- 6, 8, 9, 10: finished, damaged and foreign runs; Ctrl-C --------------------------------------

TINY_TRAIN = ["model.d_model=16", "model.d_ff=32", "model.heads=2", "model.encoder_layers=1",
              "model.decoder_layers=1", "trainer.max_tokens=512", "trainer.warmup_steps=4",
              "trainer.save_every_minutes=null", "trainer.validate_every_steps=null",
              "trainer.log_every_steps=1", "trainer.num_workers=0"]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A prepared 200-pair custom corpus; returns a function making a config for a run dir."""
    root = tmp_path_factory.mktemp("tiny")
    corpus = make_corpus(root / "corpus", seed=3)
    prepare(corpus_cfg(root, corpus))

    def cfg_for(run_dir: Path, *extra: str):
        return corpus_cfg(root, corpus, *TINY_TRAIN, f"run_dir={run_dir}", *extra)

    cfg_for.args = lambda run_dir, *extra: [  # the same as command-line overrides
        "data=custom", "data.src_lang=en", "data.tgt_lang=de", f"data.root={root / 'data'}",
        "data.vocab_size=60", *(f"+data.custom_files.{s}={corpus / s}" for s in
                                ("train", "valid", "test")),
        *TINY_TRAIN, f"run_dir={run_dir}", *extra]
    return cfg_for


def _files(run_dir: Path) -> dict[str, tuple[int, int]]:
    """Every file of a run but its summary: name -> (size, mtime_ns)."""
    return {str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in run_dir.rglob("*") if p.is_file() and p.name != "train_summary.json"}


@pytest.mark.parametrize("limit", ["trainer.max_steps=3", "trainer.max_time_minutes=0.0001"])
def test_06_rerunning_a_finished_run_is_a_no_op(tmp_path, tiny_run, limit):
    from transformer_nmt.train.loop import train

    run_dir = tmp_path / "run"
    cfg = tiny_run(run_dir, "trainer.max_steps=1000", limit)
    first = train(cfg)
    assert first["stopped_by"] == limit.split(".")[1].split("=")[0].replace("_minutes", "")
    assert first["already_finished"] is False
    before = _files(run_dir)
    for _ in range(2):  # a requeued job, twice
        again = train(cfg)
        assert _files(run_dir) == before  # no step, validation, checkpoint or event file
        assert again["already_finished"] is True
        assert again["resumed_from"] == first["last_checkpoint"]
        for key in ("stopped_by", "steps", "tokens_seen", "train_seconds", "valid"):
            assert again[key] == first[key], key
    assert json.loads((run_dir / "train_summary.json").read_text())["already_finished"] is True
    # a raised limit trains on
    more = train(tiny_run(run_dir, "trainer.max_steps=5"))
    assert more["steps"] == 5 and more["already_finished"] is False


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_08_unreadable_latest_checkpoint_falls_back_to_the_one_before(tmp_path, tiny_run, damage,
                                                                       caplog):
    from transformer_nmt.train.loop import train

    run_dir = tmp_path / "run"
    train(tiny_run(run_dir, "trainer.max_steps=4", "trainer.save_every_steps=2"))
    folder = checkpoint.checkpoint_dir(run_dir)
    bad, good = folder / "checkpoint_4.pt", folder / "checkpoint_2.pt"
    data = bad.read_bytes()
    bad.write_bytes(b"" if damage == "empty" else data[: len(data) // 2])
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.checkpoint"):
        summary = train(tiny_run(run_dir, "trainer.max_steps=6", "trainer.save_every_steps=2"))
    assert summary["resumed_from"] == str(good) and summary["steps"] == 6
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    what = ("an empty file (0 bytes)" if damage == "empty"
            else f"truncated or not a checkpoint ({len(data) // 2:,} bytes; ")
    assert len(warning) == 1 and warning[0].startswith(f"cannot read checkpoint {bad}: {what}")
    assert warning[0].endswith("; moved it to checkpoint_4.pt.unreadable; resuming from the "
                               "newest checkpoint before it")
    assert (folder / "checkpoint_4.pt.unreadable").stat().st_size == len(data) // 2 * (
        damage == "truncated")
    assert load_checkpoint(folder / "checkpoint_4.pt")["train_state"]["step"] == 4  # redone
    # nothing readable at all: one error naming every file, no restart from step 0
    for p in checkpoint.step_checkpoints(run_dir):
        p.write_bytes(b"")
    with pytest.raises(checkpoint.UnreadableCheckpointError) as e:
        train(tiny_run(run_dir, "trainer.max_steps=8"))
    msg = str(e.value)
    assert msg.startswith(f"no checkpoint of {folder} can be read (cannot read checkpoint ")
    assert "\n" not in msg and str(folder / "checkpoint_6.pt") in msg


def test_08_evaluate_on_a_corrupt_averaged_pt_names_the_file(tmp_path, tiny_run):
    from transformer_nmt.evaluate.evaluate import evaluate

    run_dir = tmp_path / "run"
    averaged = checkpoint.checkpoint_dir(run_dir) / checkpoint.AVERAGED_NAME
    averaged.parent.mkdir(parents=True)
    save_checkpoint(averaged, {"model": {"w": torch.zeros(2000)}, "step": 3})
    data = averaged.read_bytes()
    averaged.write_bytes(data[:1000])
    with pytest.raises(checkpoint.UnreadableCheckpointError) as e:
        evaluate(tiny_run(run_dir))
    assert str(e.value).startswith(
        f"cannot read checkpoint {averaged}: truncated or not a checkpoint (1,000 bytes; ")
    averaged.write_bytes(b"")
    r = _cli("evaluate", *tiny_run.args(run_dir), cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.splitlines() == [
        f"error: cannot read checkpoint {averaged}: an empty file (0 bytes)"]


def test_09_resuming_with_another_model_size_is_one_error(tmp_path, tiny_run):
    from transformer_nmt.train.loop import train

    run_dir = tmp_path / "run"
    train(tiny_run(run_dir, "trainer.max_steps=1"))
    before = _files(run_dir)
    with pytest.raises(UserError) as e:
        train(tiny_run(run_dir, "trainer.max_steps=2", "model.d_model=32", "model.d_ff=64",
                       "model.encoder_layers=2"))
    vocab = load_checkpoint(checkpoint.latest_checkpoint(run_dir))["vocab_size"]
    assert str(e.value) == (
        f"{run_dir} holds another model (checkpoint_1.pt: d_model=16, d_ff=32, heads=2, "
        f"1+1 encoder+decoder layers, vocabulary {vocab}) than the config (d_model=32, d_ff=64, "
        f"heads=2, 2+1 encoder+decoder layers, vocabulary {vocab}); to start a new run, give it "
        "another run_dir= or name=, or resume this one with the model and data settings it "
        "was started with")
    assert _files(run_dir) == before


def _wait_for_line(path: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not (path.is_file() and text in path.read_text()):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{text!r} not in {path} after {timeout} s"
        time.sleep(0.05)


def test_10_ctrl_c_checkpoints_and_exits_0(tmp_path, tiny_run):
    run_dir = tmp_path / "run"
    args = tiny_run.args(run_dir, "trainer.max_steps=100000")
    proc = subprocess.Popen([sys.executable, "-m", "transformer_nmt.cli.train", *args],
                            cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    _wait_for_line(run_dir / "metrics.jsonl", '"train"', proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "interrupted: saving a checkpoint at the end of this step" in err
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["stopped_by"] == "signal SIGINT"
    [saved] = checkpoint.step_checkpoints(run_dir)
    assert saved.name == f"checkpoint_{summary['steps']}.pt"
    assert load_checkpoint(saved)["train_state"]["step"] == summary["steps"] > 0


def test_10_second_ctrl_c_exits_at_once_with_130(tmp_path):
    script = tmp_path / "flag.py"
    script.write_text(
        "import os, signal, time\n"
        "from transformer_nmt.runtime import StopFlag\n"
        "flag = StopFlag(); flag.install()\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(0.1)\n"
        "assert flag.requested == signal.SIGINT\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"  # torchrun's agent passes it on as SIGTERM
        "time.sleep(0.1)\n"
        "assert flag.requested == signal.SIGINT\n"  # the cause is kept
        "print('first recorded', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(5)\n"
        "print('still running')\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 130, r.stderr
    assert r.stdout == "first recorded\n"
    assert r.stderr.splitlines() == [
        ("interrupted: saving a checkpoint at the end of this step (press Ctrl-C again to exit "
         "at once, without one)"),
        "interrupted again: exiting now without a checkpoint"]


# --- 11: damaged .gz, disk full -------------------------------------------------------------------


def test_11_truncated_gz_names_the_file(tmp_path):
    path = tmp_path / "train.en.gz"
    data = gzip.compress(("".join(f"line {i} of a corpus\n" for i in range(5000))).encode())
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError) as e:
        list(read_lines(path))
    assert str(e.value).startswith(f"{path}: damaged gzip file after line ")
    assert "EOFError" in str(e.value)


def test_11_disk_full_names_the_path_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint_best.pt"
    save_checkpoint(path, {"step": 1})
    before = path.read_bytes()
    real_save = torch.save

    def full_disk(obj, f, *a, **k):
        Path(f).write_bytes(b"PK\x03\x04 partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(NoSpaceError) as e:
        save_checkpoint(path, {"step": 2})
    assert str(e.value) == f"no space left on device: {path}"

    # torch's own writer reports a full disk as a RuntimeError
    def torch_full(obj, f, *a, **k):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . PytorchStreamWriter "
                           "failed writing file data/0: file write failed")

    monkeypatch.setattr(torch, "save", torch_full)
    monkeypatch.setattr(fileio.shutil, "disk_usage", lambda p: SimpleNamespace(free=0))
    with pytest.raises(NoSpaceError, match=f"^no space left on device: {path}$"):
        save_checkpoint(path, {"step": 2})
    monkeypatch.setattr(torch, "save", real_save)
    assert path.read_bytes() == before and load_checkpoint(path)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no temporary file left


# --- 12: one-line user errors, nothing left behind -----------------------------------------------


def _cli(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"transformer_nmt.cli.{module}", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "HYDRA_FULL_ERROR": "0"})


def test_12_bad_override_is_one_line_exit_2_and_no_run_dir(tmp_path):
    run_dir = tmp_path / "runs" / "x"
    r = _cli("train", "trainer.max_step=5", f"run_dir={run_dir}", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        ("error: Could not override 'trainer.max_step'. Key 'max_step' not in 'TrainerConfig' "
         "(did you mean trainer.max_steps?)")]
    r = _cli("translate", "model.d_model=-3", f"run_dir={run_dir}", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        "error: invalid configuration: model.d_model=-3 must be a positive integer"]
    assert not (tmp_path / "runs").exists()


def test_12_bad_file_inside_the_task_leaves_no_hydra_folder(tmp_path):
    run_dir = tmp_path / "runs" / "x"
    missing = tmp_path / "nowhere" / "train"
    args = ["data=custom", f"data.root={tmp_path / 'data'}", f"run_dir={run_dir}",
            f"+data.custom_files.train={missing}", f"+data.custom_files.valid={missing}",
            f"+data.custom_files.test={missing}"]
    r = _cli("prepare", *args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"{missing}.en" in lines[0]
    assert "Traceback" not in r.stderr and not run_dir.exists()
    # an existing run keeps its .hydra files as they were
    (run_dir / ".hydra" / "prepare").mkdir(parents=True)
    (run_dir / ".hydra" / "prepare" / "config.yaml").write_text("earlier: run\n")
    r = _cli("prepare", *args, cwd=tmp_path)
    assert r.returncode == 2
    assert sorted(p.name for p in (run_dir / ".hydra" / "prepare").iterdir()) == ["config.yaml"]
    assert (run_dir / ".hydra" / "prepare" / "config.yaml").read_text() == "earlier: run\n"


# --- 13: UTF-16 -----------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding, bom", [("utf-16-le", "FF FE"), ("utf-16-be", "FE FF")])
def test_13_utf16_file_is_named_as_utf16(tmp_path, encoding, bom):
    path = tmp_path / "train.en"
    path.write_bytes(("\ufeffA dog runs.\nA cat walks.\n").encode(encoding))
    for errors in ("strict", "replace"):
        with pytest.raises(DataError) as e:
            list(read_lines(path, errors))
        endian = "little" if bom == "FF FE" else "big"
        assert str(e.value) == (f"{path}: looks like UTF-16 ({endian}-endian BOM {bom}), not "
                                f"UTF-8; convert it first, e.g. iconv -f UTF-16 -t UTF-8 {path}")


# --- resume, locks, validation, values (docs/reliability.md) -------------------------------------


def test_24_06_resuming_with_changed_settings_is_refused_and_names_them(tmp_path, tiny_run):
    from transformer_nmt.train.loop import train

    run_dir = tmp_path / "run"
    train(tiny_run(run_dir, "trainer.max_steps=1"))
    before = _files(run_dir)
    changes = {"model.heads=4": "model.heads: 2 != 4",  # same shapes, weights reinterpreted
               "trainer.lr_multiplier=100": "trainer.lr_multiplier: 1.0 != 100.0",
               "trainer.max_tokens=256": "trainer.max_tokens: 512 != 256",
               "trainer.update_freq=2": "trainer.update_freq: 1 != 2",
               "model.dropout=0.3": "model.dropout: 0.1 != 0.3",
               "trainer.label_smoothing=0.2": "trainer.label_smoothing: 0.1 != 0.2",
               "trainer.seed=2": "trainer.seed: 1 != 2",
               "model.share_embeddings=none": "model.share_embeddings: 'all' != 'none'"}
    for override, diff in changes.items():
        with pytest.raises(UserError) as e:
            train(tiny_run(run_dir, "trainer.max_steps=2", override))
        key = diff.split(":")[0]
        assert str(e.value) == (
            f"{run_dir} was started with other settings (checkpoint_1.pt: {diff}); resume it "
            f"with the settings it was started with, add trainer.resume_changed=[{key}] to "
            "change them deliberately, or give a new run another run_dir= or name="), override
        assert _files(run_dir) == before
    # harmless: limits, logging, workers, precision; a deliberate change when named
    summary = train(tiny_run(run_dir, "trainer.max_steps=2", "trainer.log_every_steps=2",
                             "trainer.precision=fp32", "trainer.keep_last=5"))
    assert summary["steps"] == 2
    summary = train(tiny_run(run_dir, "trainer.max_steps=3", "trainer.lr_multiplier=2",
                             "trainer.resume_changed=[trainer.lr_multiplier]"))
    assert summary["steps"] == 3
    # nmt-average accepts the named change and the harmless ones across the three checkpoints
    steps = checkpoint.step_checkpoints(run_dir)
    assert len(steps) == 3
    averaged = average_run(tiny_run(run_dir, f"average.checkpoints=[{','.join(map(str, steps))}]"))
    assert load_checkpoint(averaged)["averaged_steps"] == [1, 2, 3]
    # another vocabulary of the same size (the checkpoint's vocabulary digest differs)
    latest = checkpoint.latest_checkpoint(run_dir)
    ckpt = load_checkpoint(latest)
    ckpt["vocab"] = {**ckpt["vocab"], "vocab_sha256": "0" * 64}
    save_checkpoint(latest, ckpt)
    with pytest.raises(UserError, match=r"was trained with another vocabulary \(checkpoint_3.pt: "):
        train(tiny_run(run_dir, "trainer.max_steps=4", "trainer.lr_multiplier=2",
                       "trainer.resume_changed=[trainer.lr_multiplier]"))


def test_24_06_average_refuses_only_what_resume_refuses():
    from transformer_nmt.config import to_plain

    base = to_plain(compose([]))
    paths = [Path("checkpoint_1.pt"), Path("checkpoint_2.pt")]

    def with_(**changes):
        cfg = json.loads(json.dumps(base))
        for key, value in changes.items():
            group, name = key.split("__")
            cfg[group][name] = value
        return {"config": cfg}

    harmless = with_(trainer__num_workers=4, trainer__precision="bf16", trainer__compile=True,
                     trainer__max_steps=7, data__root="/elsewhere", data__num_workers=8)
    checkpoint.check_same_run(paths, [{"config": base}, harmless])
    with pytest.raises(UserError, match=r"\(trainer.warmup_steps: 4000 != 8000\)"):
        checkpoint.check_same_run(paths, [{"config": base}, with_(trainer__warmup_steps=8000)])
    named = with_(trainer__warmup_steps=8000, trainer__resume_changed=["trainer.warmup_steps"])
    checkpoint.check_same_run(paths, [{"config": base}, named])


def test_24_07_a_second_train_in_the_same_run_dir_is_refused_and_stale_locks_are_replaced(
        tmp_path, tiny_run, caplog):
    import socket

    from transformer_nmt.run.lock import LOCK_NAME
    from transformer_nmt.train.loop import train

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    lock = run_dir / LOCK_NAME
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        lock.write_text(json.dumps({"command": "nmt-train", "host": socket.gethostname(),
                                    "pid": other.pid, "started": time.time()}))
        with pytest.raises(UserError) as e:
            train(tiny_run(run_dir, "trainer.max_steps=1"))
        assert str(e.value).startswith(
            f"{run_dir} is in use by another nmt-train (process {other.pid} on "
            f"{socket.gethostname()}, since ")
        assert str(e.value).endswith(f"; lock file {lock}); wait for it to end, or delete the "
                                     "lock file if that process is gone")
        assert not (run_dir / "checkpoints").exists() and lock.is_file()
    finally:
        other.kill()
        other.wait()
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.run.lock"):
        assert train(tiny_run(run_dir, "trainer.max_steps=1"))["steps"] == 1
    assert f"removing the stale lock {lock} of process {other.pid}" in caplog.text
    assert not lock.exists()  # released on exit
    # a lock of another host cannot be checked: refused
    lock.write_text(json.dumps({"command": "nmt-train", "host": "elsewhere", "pid": 1,
                                "started": 0}))
    with pytest.raises(UserError, match="in use by another nmt-train .process 1 on elsewhere"):
        train(tiny_run(run_dir, "trainer.max_steps=2"))


def test_24_07_run_dir_that_is_a_file_is_one_line(tmp_path, tiny_run):
    from transformer_nmt.train.loop import train

    path = tmp_path / "run"
    path.write_text("not a folder\n")
    with pytest.raises(UserError, match=f"^run_dir={path} is a file, not a folder"):
        train(tiny_run(path, "trainer.max_steps=1"))
    r = _cli("train", *tiny_run.args(path, "trainer.max_steps=1"), cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        f"error: run_dir={path} is a file, not a folder; give the run another run_dir="]
    assert path.read_text() == "not a folder\n"


def test_24_09_second_corpus_with_older_files_replaces_the_references(tmp_path):
    from transformer_nmt.data.corpora import reference_path

    first = make_corpus(tmp_path / "first", seed=1)
    prepare(corpus_cfg(tmp_path, first))
    second = make_corpus(tmp_path / "second", seed=7)
    for p in second.iterdir():  # older than everything prepared from the first
        os.utime(p, (1_000_000_000, 1_000_000_000))
    cfg = corpus_cfg(tmp_path, second)
    prepare(cfg)
    for split in ("valid", "test"):
        assert (reference_path(cfg.data, split, "de").read_text()
                == (second / f"{split}.de").read_text()), split


def test_24_10_table3_results_of_another_checkpoint_with_the_same_name_are_not_current(
        tmp_path):
    from transformer_nmt.evaluate.table3 import evaluation_config, results_are_current

    run_dir = tmp_path / "row"
    cfg = compose(["table3=A_h1", f"run_dir={run_dir}", "model.heads=2", "model.d_model=32",
                   "model.d_ff=64"])
    ckpt = checkpoint.checkpoint_dir(run_dir) / "checkpoint_4.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"first training")
    ev = evaluation_config(cfg)
    score = {"label": "sacreBLEU", "score": 1.0, "signature": "s"}
    results = {"experiment": "x", "checkpoint": str(ckpt),
               "checkpoint_sha256": bpe.file_digest(ckpt), "decode": {},
               "test_sets": {s: {"bleu": {"sacrebleu": score}, "chrf": score}
                             for s in ev.data.test_splits}}
    (run_dir / "results.json").write_text(json.dumps(results))
    assert results_are_current(cfg)
    ckpt.write_bytes(b"retrained on another corpus")  # same path, same step
    assert not results_are_current(cfg)
    del results["checkpoint_sha256"]  # written before the digest was recorded
    (run_dir / "results.json").write_text(json.dumps(results))
    assert not results_are_current(cfg)


def test_24_11_plus_typo_under_a_typed_group_is_refused(tmp_path):
    for override, message in [
        ("+trainer.max_stepz=3", ("unknown key: trainer.max_stepz is not a setting of "
                                 "TrainerConfig (did you mean trainer.max_steps?)")),
        ("+lr=5", "unknown key: lr is not a setting of Config"),
        ("+model.dropuot=0.3", ("unknown key: model.dropuot is not a setting of ModelConfig "
                               "(did you mean model.dropout?)")),
    ]:
        with pytest.raises(UserError) as e:
            compose([override])
        assert str(e.value) == message
    # free-form nodes still take any key
    cfg = compose(["+data.custom_files.train=x", "+extra.note=1", "+table3.fixed.dropout=0.2"])
    assert cfg.extra == {"note": 1}
    run_dir = tmp_path / "runs" / "x"
    r = _cli("train", "+trainer.max_stepz=3", f"run_dir={run_dir}", cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [
        ("error: unknown key: trainer.max_stepz is not a setting of TrainerConfig (did you mean "
        "trainer.max_steps?)")]
    assert not run_dir.exists()


@pytest.fixture(scope="module")
def long_pairs(tmp_path_factory):
    """A prepared corpus whose validation split holds one pair far longer than the others and
    whose test split holds only such pairs; returns a function making a training config."""
    root = tmp_path_factory.mktemp("long")
    corpus = make_corpus(root / "corpus", seed=3)
    long_en = " ".join(["the red dog walks in the blue park"] * 6) + " ."
    long_de = " ".join(["der rot hund geht in die blau park"] * 6) + " ."
    for split, lines in (("valid", 1), ("test", 5)):
        for lang, text in (("en", long_en), ("de", long_de)):
            path = corpus / f"{split}.{lang}"
            kept = path.read_text().splitlines()[: 9 if split == "valid" else 0]
            path.write_text("\n".join(kept + [text] * lines) + "\n")
    prepare(corpus_cfg(root, corpus))
    return lambda run_dir, *extra: corpus_cfg(root, corpus, *TINY_TRAIN, f"run_dir={run_dir}",
                                              *extra)


def test_24_12_validation_with_no_pair_that_fits_is_an_error_at_start_up(tmp_path, long_pairs):
    from transformer_nmt.train.loop import train

    run_dir = tmp_path / "run"
    with pytest.raises(UserError) as e:  # every test pair is longer than the position table
        train(long_pairs(run_dir, "trainer.max_steps=2", "data.valid_split=test",
                         "model.max_positions=40"))
    assert str(e.value) == (
        "validation split 'test' of custom has no pair to validate on: of its 5 pairs, 0 are "
        "longer than trainer.max_tokens=512 and 5 longer than model.max_positions=40 (tokens "
        "with eos, either side); raise these limits")
    assert not run_dir.exists()


def test_24_14_a_validation_pair_beyond_learned_positions_is_left_out(tmp_path, long_pairs):
    from transformer_nmt.train.loop import train

    run_dir = tmp_path / "run"
    summary = train(long_pairs(run_dir, "trainer.max_steps=2", "model.positions=learned",
                               "model.max_positions=40", "trainer.validate_every_steps=1",
                               "trainer.valid_bleu=true"))
    assert summary["steps"] == 2 and summary["valid"]["ppl"] > 1
    assert [p.name for p in checkpoint.step_checkpoints(run_dir)] == ["checkpoint_2.pt"]


def test_24_13_training_limits_that_leave_no_pair_are_one_error(tmp_path, tiny_run):
    from transformer_nmt.train.loop import train

    run_dir = tmp_path / "run"
    with pytest.raises(UserError) as e:
        train(tiny_run(run_dir, "model.max_positions=3"))
    assert str(e.value) == (
        "training split 'train' of custom has no pair to train on: of its 200 pairs, 0 are "
        "longer than trainer.max_tokens=512 and 200 longer than model.max_positions=3 "
        "(tokens with eos, either side); raise these limits")
    with pytest.raises(UserError, match=r"^training split 'train' of custom: example \d+ does "
                                        r"not fit in max_tokens=3: .*too_long=skip"):
        train(tiny_run(run_dir, "trainer.max_tokens=3"))
    with pytest.raises(UserError, match="of its 200 pairs, 200 are longer than "
                                        "trainer.max_tokens=3 and 0 longer"):
        train(tiny_run(run_dir, "trainer.max_tokens=3", "trainer.too_long=skip"))
    assert not run_dir.exists()


@pytest.mark.parametrize("override, message", [
    ("trainer.lr_multiplier=0", "trainer.lr_multiplier=0.0 must be positive"),
    ("trainer.max_steps=0", "trainer.max_steps=0 must be positive (or null for no limit)"),
    ("trainer.adam_eps=-1e-9", "trainer.adam_eps=-1e-09 must be positive"),
    ("trainer.weight_decay=-0.1", "trainer.weight_decay=-0.1 must be >= 0"),
    ("trainer.num_workers=-1", "trainer.num_workers=-1 must be >= 0"),
    ("trainer.valid_bleu_sentences=0", "trainer.valid_bleu_sentences=0 must be positive"),
    ("decode.max_len_a=-0.5", ("decode.max_len_a=-0.5 must be >= 0 (the maximum output length "
                              "max_len_a * source length + max_len_b falls below 1 for long "
                              "sources)")),
])
def test_24_13_useless_values_are_one_line(override, message):
    with pytest.raises(UserError) as e:
        compose([override])
    assert str(e.value) == f"invalid configuration: {message}"


def test_24_13_max_len_below_one_and_empty_test_splits(tmp_path, tiny_run):
    from transformer_nmt.evaluate.evaluate import evaluate

    with pytest.raises(UserError) as e:
        compose(["decode.max_len_a=0", "decode.max_len_b=0"])
    assert str(e.value) == (
        "invalid configuration: decode.max_len_a=0.0 and decode.max_len_b=0 give a maximum "
        "output length of 0 for a one-token source; it must be at least 1")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text('{"earlier": "scores"}\n')
    with pytest.raises(UserError, match=r"^data.test_splits is empty: nothing to evaluate"):
        evaluate(tiny_run(run_dir, "data.test_splits=[]"))
    assert (run_dir / "results.json").read_text() == '{"earlier": "scores"}\n'


@pytest.mark.skipif(torch.cuda.is_available(), reason="fp16 training runs on a GPU")
def test_24_15_fp16_training_on_cpu_is_one_line(tmp_path, tiny_run):
    r = _cli("train", *tiny_run.args(tmp_path / "run", "trainer.precision=fp16"), cwd=tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.splitlines() == [
        ("error: trainer.precision=fp16 needs a CUDA GPU, and this run's device is cpu; use "
        "trainer.precision=fp32 or bf16")]


def test_24_15_prepare_of_an_up_to_date_corpus_writes_nothing(tmp_path):
    corpus = make_corpus(tmp_path / "corpus", seed=1)
    cfg = corpus_cfg(tmp_path, corpus)
    prepare(cfg)

    def state():
        return {str(p): (p.stat().st_ino, p.stat().st_mtime_ns)
                for p in (tmp_path / "data").rglob("*")}

    before = state()
    summary = prepare(cfg)  # a read-only data root would refuse any write
    assert set(statuses(summary).values()) == {"skipped"}
    assert state() == before


def test_24_15_evaluate_checks_train_summary_before_decoding(tmp_path, tiny_run, monkeypatch):
    from transformer_nmt.evaluate import evaluate as evaluate_mod
    from transformer_nmt.train.loop import train

    run_dir = tmp_path / "run"
    train(tiny_run(run_dir, "trainer.max_steps=1"))
    summary = run_dir / "train_summary.json"
    summary.write_text(summary.read_text()[:40])
    monkeypatch.setattr(evaluate_mod, "translate_lines",
                        lambda *a, **k: pytest.fail("decoded before checking train_summary.json"))
    with pytest.raises(UserError) as e:
        evaluate_mod.evaluate(tiny_run(run_dir, "data.test_splits=[test]"))
    assert str(e.value).startswith(f"{summary}: not valid JSON (line ")
    assert str(e.value).endswith("; train again or delete it")
    # What would crash only later (deep nesting, an integer too large for a float) is refused
    # here too, before decoding.
    for text, problem in (("[" * 100_000 + "]" * 100_000, "nested deeper than 64 levels"),
                          ('{"steps": 1, "cpu_seconds": ' + "9" * 400 + "}",
                           "holds a number too large for a float (400 digits)")):
        summary.write_text(text)
        with pytest.raises(UserError) as e:
            evaluate_mod.evaluate(tiny_run(run_dir, "data.test_splits=[test]"))
        assert str(e.value) == f"{summary}: {problem}; train again or delete it"


def test_24_15_table_skips_a_truncated_or_mistyped_results_file(tmp_path, caplog):
    from unit.evaluate.test_report import fake_result

    from transformer_nmt.evaluate.report import write_report

    good = fake_result("multi30k", "multi30k", "multi30k_en_de", "de", "tiny",
                       ["test_2016_flickr"], 35.52, 34.47)
    bad_type = fake_result("typo", "multi30k", "multi30k_en_de", "de", "tiny",
                           ["test_2016_flickr"], 1.0, 1.0)
    bad_type["test_sets"]["test_2016_flickr"]["bleu"]["sacrebleu"]["score"] = "34.4"
    files = {"good": json.dumps(good), "truncated": json.dumps(good)[:100],
             "mistyped": json.dumps(bad_type), "a_list": "[]"}
    for name, text in files.items():
        (tmp_path / "runs" / name).mkdir(parents=True)
        (tmp_path / "runs" / name / "results.json").write_text(text)
    cfg = compose([f"table.results_glob={tmp_path}/runs/*/results.json",
                   f"table.output={tmp_path}/results.md"])
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.evaluate.report"):
        text = write_report(cfg).read_text(encoding="utf-8")
    assert "34.47" in text or "34.5" in text
    warnings = sorted(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    runs = tmp_path / "runs"
    assert len(warnings) == 3
    assert warnings[0].startswith(
        f"skipping {runs}/a_list/results.json: a JSON list, not an object; ")
    assert warnings[1].startswith(f"skipping {runs}/mistyped/results.json: "
                                  "test_sets.test_2016_flickr.bleu.sacrebleu "
                                  "has no numeric score; ")
    assert warnings[2].startswith(f"skipping {runs}/truncated/results.json: not valid JSON "
                                  "(line 1")


def test_24_15_plot_bleu_sentences_below_one_is_refused(tmp_path):
    from transformer_nmt.config import Config
    from transformer_nmt.plot.make import make_plots

    cfg = Config()
    cfg.plot.bleu_sentences = 0
    cfg.run_dir = str(tmp_path)
    with pytest.raises(ValueError) as e:
        make_plots(cfg)
    assert str(e.value) == ("plot.bleu_sentences=0 must be positive (or null for every "
                            "validation sentence)")


# --- nmt-translate one step off the default path (docs/reliability.md) --------------------------


@pytest.fixture
def translate_run(workspace, tokenizer, tmp_path):
    """A tiny model's checkpoint beside the workspace's tokenizer; ``(overrides, checkpoint)``."""
    from helpers import DECODE_MODEL, new_model, write_checkpoint

    root, cfg = workspace
    ckpt = tmp_path / "checkpoint_1.pt"
    write_checkpoint(ckpt, new_model(cfg, tokenizer.vocab_size, seed=1), cfg, 1)
    overrides = [f"data.root={root / 'data'}", f"run_dir={tmp_path / 'run'}", "name=tiny",
                 "data.vocab_size=60", "decode.beam_size=2", "decode.max_len_b=6",
                 *DECODE_MODEL, f"decode.checkpoint={ckpt}"]
    return overrides, ckpt


def test_24_03_translating_with_a_nan_checkpoint_names_it(translate_run, tmp_path):
    from transformer_nmt.decode.translate import translate

    overrides, ckpt = translate_run
    state = load_checkpoint(ckpt)
    state["model"] = {k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
                      for k, v in state["model"].items()}
    save_checkpoint(ckpt, state)
    (tmp_path / "in.en").write_text("A dog runs.\nTwo people sit.\n")
    cfg = compose([*overrides, f"translate.input={tmp_path / 'in.en'}",
                   f"translate.output={tmp_path / 'out.de'}"])
    with pytest.raises(UserError, match=f"^{ckpt}: non-finite scores in decoding .*: .* of its "
                       "parameter tensors hold NaN or inf values"):
        translate(cfg)
    assert not (tmp_path / "out.de").exists()


def test_24_15_translate_bad_settings_are_one_error_before_decoding(translate_run, tmp_path,
                                                                  monkeypatch):
    from transformer_nmt.config import ConfigError
    from transformer_nmt.decode.translate import translate

    overrides, _ = translate_run
    with pytest.raises(ConfigError, match=r"decode.max_tokens=1 must be at least 2"):
        compose([*overrides, "decode.max_tokens=1"])
    (tmp_path / "in.en").write_text("A dog runs.\n")
    folder = tmp_path / "out"
    folder.mkdir()
    cfg = compose([*overrides, f"translate.input={tmp_path / 'in.en'}",
                   f"translate.output={folder}"])
    with pytest.raises(UserError,
                       match=f"^translate.output={folder} is a folder; give a file path$"):
        translate(cfg)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = compose([*overrides, "decode.device=cuda", f"translate.input={tmp_path / 'in.en'}"])
    with pytest.raises(UserError, match="^decode.device=cuda: CUDA is not available here"):
        translate(cfg)


def _default_sigint() -> None:
    """In the child: Ctrl-C as a terminal delivers it, also when the tests run in a shell's
    background job (which starts its commands with SIGINT ignored, and Python keeps that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _translate_cli(overrides, *extra, **popen):
    return subprocess.Popen([sys.executable, "-m", "transformer_nmt.cli.translate", *overrides,
                             *extra], text=True, preexec_fn=_default_sigint, **popen)


def test_24_15_translate_into_a_closed_pipe_and_ctrl_c_exit_quietly(translate_run, tmp_path):
    from helpers import sentences

    overrides, _ = translate_run
    short, source = tmp_path / "short.en", tmp_path / "in.en"
    short.write_text("\n".join(sentences(3, 5)) + "\n")
    source.write_text("\n".join(sentences(3000, 5)) + "\n")
    # | head -1: the reader is gone before the first translation is written
    proc = _translate_cli(overrides, f"translate.input={short}", stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 141, err[-2000:]
    assert ("Traceback" not in err and "BrokenPipeError" not in err
            and "Exception ignored" not in err)
    # Ctrl-C while decoding: one line, exit 130, no output file
    out = tmp_path / "out.de"
    proc = _translate_cli(overrides, f"translate.input={source}", f"translate.output={out}",
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "decoding with" in line:
            proc.send_signal(signal.SIGINT)
            break
    err = "".join(lines) + proc.stderr.read()
    assert proc.wait(timeout=300) == 130, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1] == (
        "interrupted: stopped before the end (no output file is left half-written)")
    assert not out.exists() and not list(tmp_path.glob(".out.de*"))


def test_permission_denied_is_one_line_naming_the_path():
    """A stage that must write into a read-only data root or run folder (root ignores file
    modes, so the error is raised by hand) ends with one line naming the path, exit 2."""
    from transformer_nmt.cli import _UserExit, user_errors

    with pytest.raises(_UserExit, match=r"Permission denied: '/data/spm/x/spm.model'"), \
            user_errors():
        raise PermissionError(13, "Permission denied", "/data/spm/x/spm.model")


# --- Hydra's flags, override syntax, start-up and closed streams (docs/reliability.md) ----------


@pytest.mark.parametrize("flags", [["-m"], ["--cfg", "job"], ["--multirun", "--cfg", "job"]],
                         ids=["multirun", "cfg_job", "multirun_cfg_job"])
def test_misspelt_key_with_hydras_flags_is_the_same_one_line(flags, tmp_path):
    sweep = "-m" in flags or "--multirun" in flags
    proc = _cli("train", *flags, "experiment=smoke", f"trainer.max_stepz={'3,4' if sweep else 3}",
                cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr == ("error: Could not override 'trainer.max_stepz'. Key 'max_stepz' not "
                           "in 'TrainerConfig' (did you mean trainer.max_steps?)\n")
    assert list(tmp_path.iterdir()) == []
    # a sweep whose keys are right goes on to Hydra: --cfg job prints the first job's config
    proc = _cli("train", "--cfg", "job", "experiment=smoke", "trainer.max_steps=3", cwd=tmp_path)
    assert proc.returncode == 0 and "max_steps: 3" in proc.stdout, proc.stderr


def test_unquoted_non_ascii_value_says_to_quote_it(tmp_path):
    proc = _cli("plot", "experiment=smoke", "plot.sentence=Ein Mann fährt", cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == (
        "error: cannot parse the override plot.sentence=Ein Mann fährt: Hydra reads 'ä' "
        "only inside a quoted value; quote the value inside the shell's quotes: "
        "'plot.sentence=\"Ein Mann fährt\"'\n")
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_torch_is_imported_is_one_line_exit_130(tmp_path):
    """Ctrl-C while the console script imports its modules (torch: seconds): the SIGINT is
    sent from inside ``import torch``, as the ``nmt-translate`` script starts."""
    code = (
        "import os, signal, sys\n"
        "sys.argv = ['nmt-translate', 'experiment=smoke']\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "from transformer_nmt.cli.translate import main\n"
        "main()\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False, preexec_fn=_default_sigint)
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert proc.stderr == "interrupted: stopped during start-up, before anything was written\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("closed, message", [
    ("stdin", "error: standard input is closed (<&-) and translate.input is not set: nothing to "
              "translate; give translate.input=FILE or pipe the text in"),
    ("stdout", "error: standard output is closed (>&-) and translate.output is not set: the "
               "translations would be lost; give translate.output=FILE"),
])
def test_translate_with_stdin_or_stdout_closed_is_one_line(closed, message, translate_run,
                                                           tmp_path):
    overrides, _ = translate_run
    fd = 0 if closed == "stdin" else 1
    proc = subprocess.run(
        [sys.executable, "-m", "transformer_nmt.cli.translate", *overrides], cwd=tmp_path,
        stderr=subprocess.PIPE, text=True, timeout=120, check=False,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=lambda: os.close(fd))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr == message + "\n"
    assert not (tmp_path / "run").exists()
