"""A compiled run that recompiles beyond the limit stops with an error instead of silently
running eagerly from then on."""

from __future__ import annotations

import pytest
import torch

from transformer_nmt.train import setup as setup_mod


def test_recompiles_beyond_the_limit_raise(monkeypatch):
    cfg = torch._dynamo.config
    before = cfg.recompile_limit
    monkeypatch.setattr(setup_mod, "RECOMPILE_LIMIT", 2)
    model = torch.nn.Linear(4, 4)
    info = setup_mod.distributed.DistInfo(rank=0, world_size=1, local_rank=0,
                                          device=torch.device("cpu"))
    # config.patch puts the values back on exit; monkeypatch.setattr would delete the keys
    # from dynamo's config module on undo (it keeps them outside its __dict__), and every
    # later compile in the process would fail
    with cfg.patch(recompile_limit=before,
                   fail_on_recompile_limit_hit=cfg.fail_on_recompile_limit_hit):
        torch._dynamo.reset()
        compiled = setup_mod.wrap_model(model, info, compile=True, backend="eager")
        assert cfg.recompile_limit == 2 and cfg.fail_on_recompile_limit_hit
        try:
            with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
                for n in range(1, 8):  # a new static shape each call: a recompilation each
                    torch._dynamo.mark_static(x := torch.randn(n, 4), 0)
                    compiled(x)
        finally:
            torch._dynamo.reset()
    assert cfg.recompile_limit == before  # restored for the tests after this one
