"""`trainer.init_from` compares the architecture as a resume does: a model file of the same
shapes but another head count is refused with one line, unless the
change is named in `trainer.resume_changed`; dropout may differ."""

from __future__ import annotations

import pytest
import torch

from transformer_nmt.checkpoint import latest_checkpoint, load_checkpoint
from transformer_nmt.config import compose
from transformer_nmt.errors import UserError
from transformer_nmt.train import distributed
from transformer_nmt.train.loop import train
from transformer_nmt.train.setup import setup


def test_init_from_another_head_count_is_refused_unless_named(tmp_path, synthetic_corpus,
                                                              tiny_model):
    common = ["experiment=multi30k_en_de", *synthetic_corpus.overrides, *tiny_model,
              "trainer.max_tokens=512", "trainer.num_workers=0"]
    source = tmp_path / "source"
    train(compose([*common, f"run_dir={source}", "trainer.max_steps=2",
                   "trainer.save_every_steps=2", "trainer.validate_every_steps=null"]))
    init = latest_checkpoint(source)
    info = distributed.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))

    def start(*extra: str):
        return setup(compose([*common, f"run_dir={tmp_path / 'new'}",
                              f"trainer.init_from={init}", *extra]), info)

    assert compose(tiny_model).model.heads == 2
    with pytest.raises(UserError, match=rf"^trainer.init_from={init} was trained with another "
                       r"architecture \(model.heads: 2 != 4\).*trainer.resume_changed="
                       r"\[model.heads\]"):
        start("model.heads=4")  # the same parameter shapes
    saved = load_checkpoint(init)["model"]
    for extra in (("model.heads=4", "trainer.resume_changed=[model.heads]"),
                  ("model.dropout=0.3",)):
        built = start(*extra)
        assert all(torch.equal(v, saved[k]) for k, v in built.model.state_dict().items())
