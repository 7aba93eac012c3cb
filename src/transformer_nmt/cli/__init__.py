"""Thin Hydra entry points, one per pipeline stage; each calls a plain function.

All of them compose ``configs/config.yaml`` (typed by :class:`transformer_nmt.config.Config`),
so ``nmt-train experiment=wmt14_en_de_base trainer.max_steps=1000`` works for every stage.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from transformer_nmt import config as _config  # registers the schema

CONFIG_DIR = os.environ.get(
    "NMT_CONFIG_DIR", str(Path(__file__).resolve().parents[3] / "configs")
)
"""Folder holding config.yaml and the config groups (the repository's configs/)."""


def compose(overrides: Sequence[str] = ()) -> DictConfig:
    """Compose the primary config with overrides, as an entry point would (for tests, scripts).

    Args:
        overrides: Hydra override strings, e.g. ``["experiment=multi30k_en_de", "trainer.max_steps=5"]``.

    Returns:
        The composed, validated config (struct mode: unknown keys raise).

    Raises:
        hydra.errors.ConfigCompositionException / omegaconf errors: unknown keys or groups.
        ValueError: from :func:`transformer_nmt.config.validate`.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    _config.validate(cfg)
    return cfg
