"""nmt-export checks the tokenizer against the checkpoint, gives its folders the umask's
permissions and records a training checkpoint's step; the CTranslate2 conversion cache keeps
one model per checkpoint file."""

from __future__ import annotations

import os
import stat

import pytest

pytest.importorskip("transformers")
pytest.importorskip("ctranslate2")
pytest.importorskip("safetensors")

from helpers import new_model, sentences

from transformer_nmt.checkpoint import save_checkpoint
from transformer_nmt.config import to_plain
from transformer_nmt.data.bpe import vocab_identity
from transformer_nmt.errors import UserError
from transformer_nmt.fileio import spm_model_path
from transformer_nmt.interop import ctranslate2 as ct2
from transformer_nmt.interop import hf


def _save(path, workspace, tokenizer, seed=1, **extra):
    """A tiny model's checkpoint recording the workspace tokenizer's identity."""
    _, cfg = workspace
    model = new_model(cfg, tokenizer.vocab_size, seed=seed)
    save_checkpoint(path, {"model": model.state_dict(), "config": to_plain(cfg),
                           "vocab_size": model.vocab_size,
                           "vocab": vocab_identity(tokenizer.model_path), **extra})
    return path


@pytest.fixture
def other_spm(workspace, tokenizer, tmp_path):
    """A SentencePiece model of the same size as the workspace's, trained on other text."""
    import sentencepiece as spm

    text = tmp_path / "other.txt"
    text.write_text("\n".join(s[::-1] for s in sentences(300, 7)) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(text), model_prefix=str(tmp_path / "other"), vocab_size=tokenizer.vocab_size,
        model_type="bpe", pad_id=0, unk_id=1, bos_id=2, eos_id=3, minloglevel=2)
    return tmp_path / "other.model"


def test_export_refuses_a_tokenizer_other_than_the_checkpoints(workspace, tokenizer, other_spm,
                                                               tmp_path):
    ckpt = _save(tmp_path / "averaged.pt", workspace, tokenizer, step=5)
    for export in (hf.export_hf, ct2.export_ctranslate2):
        out = tmp_path / export.__name__
        with pytest.raises(UserError, match=f"^{ckpt} was trained with another vocabulary than "
                                            f"{other_spm}"):
            export(ckpt, other_spm, out)
        assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    assert (hf.export_hf(ckpt, spm_model_path(workspace[1].data), tmp_path / "hf")
            / "model.safetensors").is_file()


def test_exported_folders_get_the_umasks_permissions(workspace, tokenizer, tmp_path):
    ckpt = _save(tmp_path / "averaged.pt", workspace, tokenizer, step=5)
    spm = spm_model_path(workspace[1].data)
    old = os.umask(0o027)
    try:
        outs = [hf.export_hf(ckpt, spm, tmp_path / "hf"),
                ct2.export_ctranslate2(ckpt, spm, tmp_path / "ct2")]
    finally:
        os.umask(old)
    for out in outs:
        assert stat.S_IMODE(out.stat().st_mode) == 0o750, out
        files = [p for p in out.rglob("*") if p.is_file()]
        assert files and {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o640}, out


def test_model_card_of_a_training_checkpoint_records_its_step(workspace, tokenizer, tmp_path):
    import json

    ckpt = _save(tmp_path / "checkpoint_40.pt", workspace, tokenizer,
                 train_state={"step": 40, "micro_step": 40})
    out = hf.export_hf(ckpt, spm_model_path(workspace[1].data), tmp_path / "hf")
    assert "- steps: 40\n" in (out / "README.md").read_text()
    assert json.loads((out / hf.SIDECAR).read_text())["step"] == 40


def test_ctranslate2_cache_keeps_one_model_per_checkpoint(workspace, tokenizer, tmp_path):
    spm = spm_model_path(workspace[1].data)
    folder = tmp_path / "run" / "checkpoints"
    averaged = _save(folder / "averaged.pt", workspace, tokenizer, seed=1, step=10)
    step = _save(folder / "checkpoint_10.pt", workspace, tokenizer, seed=2, step=10)
    old = _save(folder / "checkpoint_5.pt", workspace, tokenizer, seed=3, step=5)
    first = ct2.cached_ctranslate2(averaged, spm)
    of_step = ct2.cached_ctranslate2(step, spm)
    of_old = ct2.cached_ctranslate2(old, spm)
    old.unlink()  # pruned by keep_last
    _save(averaged, workspace, tokenizer, seed=4, step=20)  # averaged again
    second = ct2.cached_ctranslate2(averaged, spm)
    assert second != first
    assert sorted(p.name for p in (folder / "ctranslate2").iterdir()) == sorted(
        [second.name, of_step.name])
    assert not first.exists() and not of_old.exists() and (of_step / "model.bin").is_file()
    assert ct2.cached_ctranslate2(step, spm) == of_step  # still reused


def test_export_beside_a_running_trainer_warns_naming_it(workspace, tokenizer, tmp_path, caplog):
    """nmt-export of a run that nmt-train still writes exports its newest checkpoint, an
    intermediate model: a warning names the trainer's process; none once it has ended."""
    import copy
    import logging
    import subprocess
    import sys

    from transformer_nmt.interop.export import run_export

    run_dir = tmp_path / "run"
    _save(run_dir / "checkpoints" / "checkpoint_40.pt", workspace, tokenizer,
          train_state={"step": 40, "micro_step": 40})
    cfg = copy.deepcopy(workspace[1])
    cfg.run_dir = str(run_dir)
    cfg.export.output = str(tmp_path / "hf")
    cfg.export.overwrite = True
    hold = ("import sys, time\nfrom transformer_nmt.run.lock import folder_lock\n"
            "with folder_lock(sys.argv[1], 'nmt-train'):\n"
            "    print('held', flush=True)\n    time.sleep(120)\n")
    trainer = subprocess.Popen([sys.executable, "-c", hold, str(run_dir)],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert trainer.stdout.readline().strip() == "held"
        with caplog.at_level(logging.WARNING):
            run_export(cfg)
        assert (f"{run_dir} is still being trained (nmt-train, process {trainer.pid}): "
                f"{run_dir / 'checkpoints' / 'checkpoint_40.pt'} is an intermediate model"
                in caplog.text)
    finally:
        trainer.kill()
        trainer.wait()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        run_export(cfg)
    assert "still being trained" not in caplog.text
