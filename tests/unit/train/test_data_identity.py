"""A checkpoint records the identity of the training data it was trained on; a resume after
the data was prepared again with other limits (another experiment sharing the data.name) is
refused with one line, and nmt-prepare warns when it re-filters the training split."""

from __future__ import annotations

import logging

import pytest
from conftest import write_reversal_corpus

from transformer_nmt.checkpoint import latest_checkpoint, load_checkpoint
from transformer_nmt.config import compose
from transformer_nmt.data.prepare import prepare, training_data_identity
from transformer_nmt.errors import UserError
from transformer_nmt.train.loop import train


def test_resume_on_refiltered_training_data_is_refused(tmp_path, tiny_model, caplog):
    files = write_reversal_corpus(tmp_path / "text", {"train": 300, "valid": 20, "test": 20})
    data = ["experiment=multi30k_en_de", "trainer.lr_scheduler=inverse_sqrt",  # resumed longer
            "data=custom", "data.name=shared", "data.src_lang=en",
            "data.tgt_lang=de", f"data.root={tmp_path / 'data'}", "data.vocab_size=120",
            "data.num_workers=1", "data.valid_split=valid", "data.test_splits=[test]",
            *(f"+data.custom_files.{s}={files / s}" for s in ("train", "valid", "test"))]
    run = [*data, *tiny_model, f"run_dir={tmp_path / 'run'}", "trainer.max_steps=4",
           "trainer.save_every_steps=2", "trainer.validate_every_steps=null",
           "trainer.max_tokens=512", "trainer.num_workers=0", "trainer.valid_bleu=false"]
    prepare(compose(run))
    train(compose(run))
    saved = load_checkpoint(latest_checkpoint(tmp_path / "run"))["data"]
    assert saved == training_data_identity(compose(run).data)
    assert saved["pairs"] == 300 and saved["name"] == "shared"

    # another experiment on the same data.name with a shorter position table re-filters it
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.data.prepare"):
        prepare(compose([*data, *tiny_model, "model.max_positions=10"]))
    assert "runs trained on the earlier data refuse to resume on it" in caplog.text
    after = training_data_identity(compose(run).data)
    assert after["pairs"] < 300 and after["sha256"] != saved["sha256"]

    with pytest.raises(UserError, match=r"run was trained on other training data \(checkpoint_4"
                       r"\.pt: 300 train pairs of shared, sha256 [0-9a-f]{12}; the data now: "
                       rf"{after['pairs']} pairs"):
        train(compose([*run, "trainer.max_steps=6"]))
    assert load_checkpoint(latest_checkpoint(tmp_path / "run"))["train_state"]["step"] == 4

    prepare(compose(run))  # prepared again as the run was started: it resumes
    assert train(compose([*run, "trainer.max_steps=6"]))["steps"] == 6
