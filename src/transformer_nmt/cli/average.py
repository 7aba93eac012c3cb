"""``nmt-average``: average the parameters of a run's last checkpoints (paper section 6.1).

Example: ``nmt-average experiment=wmt14_en_de_base`` averages the last ``decode.average_last``
(5 for base, 20 for big) ``checkpoint_<step>.pt`` files of ``runs/<name>/checkpoints`` into
``averaged.pt``; ``'decode.average_checkpoints=[a.pt,b.pt]'`` names the files instead.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import hydra
import torch
from omegaconf import DictConfig

from transformer_nmt.checkpoint import (
    AVERAGED_NAME,
    average_checkpoints,
    checkpoint_dir,
    save_checkpoint,
    step_checkpoints,
)
from transformer_nmt.cli import CONFIG_DIR
from transformer_nmt.config import validate

log = logging.getLogger(__name__)


def average_run(cfg: Any) -> Path:
    """Average checkpoints into ``<run_dir>/checkpoints/averaged.pt``.

    Which files: ``cfg.decode.average_checkpoints`` when given, else the last
    ``cfg.decode.average_last`` step checkpoints of ``cfg.run_dir`` (fewer, with a warning,
    when the run has fewer). The output holds ``"model"`` (the mean in float64, cast back),
    ``"config"``, ``"vocab_size"`` and ``"step"`` of the newest input (highest step) and
    ``"averaged_from"`` (the input file names, oldest first), so translate and evaluate load
    it like any checkpoint.

    Returns:
        The path written.

    Raises:
        FileNotFoundError: no checkpoint to average (names the folder) or a named file missing.
        ValueError: checkpoints with different keys or shapes (from
            :func:`transformer_nmt.checkpoint.average_checkpoints`, naming them).
    """
    folder = checkpoint_dir(cfg.run_dir)
    if cfg.decode.average_checkpoints:
        paths = [Path(p) for p in cfg.decode.average_checkpoints]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"decode.average_checkpoints: not found: {missing}")
    else:
        available = step_checkpoints(cfg.run_dir)
        if not available:
            raise FileNotFoundError(f"no checkpoint_<step>.pt in {folder} to average")
        n = int(cfg.decode.average_last)
        if len(available) < n:
            log.warning("decode.average_last=%d but %s holds only %d checkpoints; averaging those",
                        n, folder, len(available))
        paths = available[-n:]
    metas = [torch.load(p, map_location="cpu", weights_only=True, mmap=True) for p in paths]
    newest = max(range(len(paths)), key=lambda i: (int(metas[i].get("step") or 0), i))
    state = {
        "model": average_checkpoints(paths),
        "config": metas[newest]["config"],
        "vocab_size": metas[newest]["vocab_size"],
        "step": metas[newest].get("step"),
        "averaged_from": [p.name for p in paths],
    }
    out = folder / AVERAGED_NAME
    save_checkpoint(out, state)
    log.info("averaged %d checkpoints (%s) into %s", len(paths), ", ".join(p.name for p in paths), out)
    return out


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    """Validate the config and run :func:`average_run`."""
    validate(cfg)
    print(average_run(cfg))


if __name__ == "__main__":
    main()
