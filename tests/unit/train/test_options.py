"""Options that would be ignored without a word: an explicit trainer.update_freq that
trainer.tokens_per_step derives anyway gets a warning; a misspelt key in
trainer.resume_changed is refused, and so is trainer.patience with no validation scheduled."""

from __future__ import annotations

import logging

import pytest
import torch

from transformer_nmt.config import compose
from transformer_nmt.errors import UserError
from transformer_nmt.train import distributed
from transformer_nmt.train.loop import train
from transformer_nmt.train.setup import setup


def test_an_update_freq_that_tokens_per_step_derives_gets_a_warning(synthetic_corpus,
                                                                     tiny_model, tmp_path,
                                                                     caplog):
    info = distributed.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    common = ["experiment=multi30k_en_de", *synthetic_corpus.overrides, *tiny_model,
              f"run_dir={tmp_path}", "trainer.max_tokens=256", "trainer.tokens_per_step=1000",
              "trainer.tokens_per_step_tolerance=0.9", "trainer.num_workers=0"]
    with caplog.at_level(logging.WARNING, logger="transformer_nmt.train"):
        setup(compose(common), info)  # update_freq left at its default: no warning
        assert not caplog.records
        cfg = compose([*common, "trainer.update_freq=7"])
        setup(cfg, info)
    assert cfg.trainer.update_freq != 7  # derived
    assert (f"trainer.update_freq=7 is not used: trainer.tokens_per_step=1000 derives it "
            f"({cfg.trainer.update_freq} here)") in caplog.text


@pytest.mark.parametrize("entry, hint", [
    ("model.head", "did you mean model.heads?"),
    ("trainer.lr_multiplyer", "did you mean trainer.lr_multiplier?"),
    ("decode.beam_size", "(name, model.*, data.*, trainer.*)"),
])
def test_a_misspelt_resume_changed_key_is_refused(tmp_path, entry, hint):
    cfg = compose([f"run_dir={tmp_path / 'run'}", f"trainer.resume_changed=[{entry}]"])
    with pytest.raises(UserError, match=rf"^trainer.resume_changed=\[{entry}\]: {entry} is not a "
                       r"setting a resume compares") as err:
        train(cfg)
    assert hint in str(err.value)
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_resume_changed_takes_real_keys_and_star(tmp_path):
    from transformer_nmt.train.resume import check_resume_changed

    for entries in ("[model.heads,trainer.lr_multiplier,data.custom_files,name]", "[*]"):
        check_resume_changed(compose([f"trainer.resume_changed={entries}"]))


def test_patience_without_a_scheduled_validation_is_refused():
    with pytest.raises(UserError) as e:
        compose(["trainer.patience=3", "trainer.validate_every_steps=null",
                 "trainer.validate_every_epochs=null"])
    assert str(e.value) == (
        "invalid configuration: trainer.patience=3 counts validations without improvement, "
        "but none is scheduled (trainer.validate_every_steps and trainer.validate_every_epochs "
        "are null: the run validates only when it ends); set one of them, or "
        "trainer.patience=null")
    for schedule in ("trainer.validate_every_steps=50", "trainer.validate_every_epochs=1"):
        compose(["trainer.patience=3", "trainer.validate_every_steps=null", schedule])
    compose(["trainer.validate_every_steps=null"])  # no patience: validated when it ends
