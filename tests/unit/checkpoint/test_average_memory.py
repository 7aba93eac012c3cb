"""Averaging holds one checkpoint's memory map at a time (docs/reliability.md)."""

from __future__ import annotations

import weakref

import torch

from transformer_nmt.checkpoint import average as average_mod


def test_the_previous_checkpoint_is_released_before_the_next_is_read(tmp_path, monkeypatch):
    paths = []
    for i in range(3):
        p = tmp_path / f"checkpoint_{i}.pt"
        torch.save({"model": {"a.weight": torch.full((4, 3), float(i)),
                              "b.bias": torch.full((5,), float(i))}}, p)
        paths.append(p)
    real_load = average_mod.read_checkpoint
    alive_at_load: list[int] = []
    refs: list[list[weakref.ref]] = []

    def load(path, **kwargs):
        # every tensor of the checkpoints read before must be gone (a live tensor keeps
        # its file's memory map, and so up to a whole model's pages, resident)
        alive_at_load.append(sum(r() is not None for rs in refs for r in rs))
        ckpt = real_load(path, **kwargs)
        refs.append([weakref.ref(v) for v in ckpt["model"].values()])
        return ckpt

    monkeypatch.setattr(average_mod, "read_checkpoint", load)
    out = average_mod.average_checkpoints(paths)
    assert alive_at_load == [0, 0, 0]
    torch.testing.assert_close(out["a.weight"], torch.full((4, 3), 1.0))
    torch.testing.assert_close(out["b.bias"], torch.full((5,), 1.0))
