"""The config API: compose ``configs/config.yaml`` with overrides into the typed :class:`Config`.

Every entry point converts Hydra's composed ``DictConfig`` once (:func:`typed_config`); tests
and scripts get the same typed, validated config from :func:`compose`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from transformer_nmt.config.schema import Config
from transformer_nmt.config.table3 import apply_row
from transformer_nmt.config.validate import validate
from transformer_nmt.errors import ConfigError


def _config_dir() -> str:
    """``$NMT_CONFIG_DIR``, else the configs shipped in an installed package
    (``transformer_nmt/configs``), else the repository's ``configs/`` (a source checkout or an
    editable install)."""
    if os.environ.get("NMT_CONFIG_DIR"):
        return os.environ["NMT_CONFIG_DIR"]
    package = Path(__file__).resolve().parents[1]
    for folder in (package / "configs", package.parents[1] / "configs"):
        if (folder / "config.yaml").is_file():
            return str(folder)
    raise ImportError(
        f"transformer_nmt: no configs/config.yaml in {package} or {package.parents[1]}")


CONFIG_DIR = _config_dir()
"""Folder holding config.yaml and the config groups (see :func:`_config_dir`)."""


def typed_config(cfg: DictConfig) -> Config:
    """The composed config as the typed :class:`~transformer_nmt.config.Config` that every
    stage receives, validated: the one conversion each entry point makes.

    A Table 3 row (``table3=<row>``) is applied here
    (:func:`transformer_nmt.config.table3.apply_row`), so every stage sees the row's model and
    trainer values.

    ``OmegaConf.to_object`` resolves the interpolations (``run_dir: runs/${name}``) and gives
    the schema's dataclasses (the entry point's subclass of ``Config`` where it has one:
    nmt-export, nmt-import, nmt-plot), choice fields as their Enums, free-form nodes
    (``extra``, ``data.custom_files``) as plain dicts and lists.

    Raises:
        omegaconf errors: a mandatory value missing, an interpolation that does not resolve.
        ConfigError (a UserError): from :func:`transformer_nmt.config.validate` or a Table 3
            row that does not apply to the experiment.
    """
    check_known_keys(cfg)
    typed = OmegaConf.to_object(cfg)
    apply_row(typed)  # a Table 3 row (``table3=...``) onto the experiment's model and trainer
    try:
        validate(typed)
    except ConfigError:
        raise
    except ValueError as e:  # reported as one line, also where no pre-flight check ran (-m)
        raise ConfigError(str(e)) from e
    return typed


def check_known_keys(cfg: DictConfig) -> None:
    """Fail on a key that no field of the typed schema declares (``+trainer.max_stepz=3``,
    ``+lr=5``): Hydra's ``+`` adds keys even to typed groups, where they would be ignored.

    Free-form nodes (``extra``, ``data.custom_files``, ``table3.scale`` ...) take any key.

    Raises:
        ConfigError (a UserError): naming each unknown key, with the closest field.
    """
    import dataclasses
    import difflib

    errors: list[str] = []

    def walk(node: DictConfig, prefix: str) -> None:
        schema = OmegaConf.get_type(node)
        if not dataclasses.is_dataclass(schema):
            return  # a free-form dict
        fields = [f.name for f in dataclasses.fields(schema)]
        for key in node:
            name = f"{prefix}{key}"
            if key not in fields:
                close = difflib.get_close_matches(str(key), fields, n=1)
                errors.append(f"{name} is not a setting of {schema.__name__}"
                              + (f" (did you mean {prefix}{close[0]}?)" if close else ""))
                continue
            child = node._get_node(key)
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
                walk(child, f"{name}.")

    walk(cfg, "")
    if errors:
        raise ConfigError("unknown key: " + "; ".join(errors))


def compose(overrides: Sequence[str] = ()) -> Config:
    """Compose the primary config with overrides, as an entry point would (for tests, scripts).

    Args:
        overrides: Hydra override strings, e.g.
            ``["experiment=multi30k_en_de", "trainer.max_steps=5"]``.

    Returns:
        The composed, validated, typed config (:func:`typed_config`).

    Raises:
        hydra.errors.ConfigCompositionException / omegaconf errors: unknown keys or groups.
        ValueError: from :func:`transformer_nmt.config.validate`.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    return typed_config(cfg)
