"""Which model file of a run a command uses (:func:`resolve_checkpoint`): ``nmt-translate``,
``nmt-evaluate``, ``nmt-export`` and ``nmt-plot``'s attention maps ask here."""

from __future__ import annotations

import logging
from pathlib import Path

from transformer_nmt.checkpoint import AVERAGED_NAME, checkpoint_dir, latest_checkpoint
from transformer_nmt.config import Config

log = logging.getLogger(__name__)


def resolve_checkpoint(cfg: Config) -> Path:
    """The model file to decode with.

    Order: ``cfg.decode.checkpoint``; else ``<run_dir>/checkpoints/averaged.pt``; else the
    run's latest ``checkpoint_<step>.pt``.

    Raises:
        FileNotFoundError: naming what was looked for.
    """
    if cfg.decode.checkpoint:
        path = Path(cfg.decode.checkpoint)
        if not path.is_file():
            raise FileNotFoundError(f"decode.checkpoint={path} does not exist")
        return path
    folder = checkpoint_dir(cfg.run_dir)
    averaged = folder / AVERAGED_NAME
    latest = latest_checkpoint(cfg.run_dir)
    if averaged.is_file():
        if latest is not None and latest.stat().st_mtime > averaged.stat().st_mtime:
            log.warning(
                "%s is older than %s; run nmt-average again to include the newest checkpoints",
                averaged, latest.name,
            )
        return averaged
    if latest is not None:
        log.info("no %s in %s; decoding with the latest checkpoint %s", AVERAGED_NAME, folder,
                 latest.name)
        return latest
    raise FileNotFoundError(
        f"no model to decode with: decode.checkpoint is unset, {averaged} does not exist and "
        f"{folder} holds no checkpoint_<step>.pt (train first, or set decode.checkpoint=PATH)"
    )
