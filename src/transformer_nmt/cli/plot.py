"""``nmt-plot``: training curves, BLEU per checkpoint and attention maps of a run (PNG or SVG).

    nmt-plot experiment=multi30k_en_de                     # runs/multi30k_en_de/plots/
    nmt-plot 'runs=[multi30k_en_de,multi30k_en_fr]'        # both runs on one figure
    nmt-plot plot.kinds=[attention] plot.sentence="A dog runs on the beach." plot.layer=2
    nmt-plot plot.format=svg plot.bleu_sentences=300

The config is the pipeline's (``configs/config.yaml``, so ``experiment=`` and ``decode.*``
work as for every stage) plus the ``plot`` node of :class:`PlotConfig` and the top-level
``runs`` list, registered here as the ``nmt_plot`` primary config. Figures are described
in :mod:`transformer_nmt.plot`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from transformer_nmt.config import CONFIG_DIR, typed_config
from transformer_nmt.plot.make import PlotAppConfig


def _register() -> None:
    """Store the schema and the primary config ``nmt_plot``: configs/config.yaml's defaults
    with ``config_schema`` replaced by ``plot_config_schema``."""
    cs = ConfigStore.instance()
    cs.store(name="plot_config_schema", node=PlotAppConfig)
    primary = OmegaConf.load(Path(CONFIG_DIR) / "config.yaml")
    defaults = [
        "plot_config_schema" if entry == "config_schema" else entry
        for entry in OmegaConf.to_container(primary.defaults)
    ]
    node = OmegaConf.to_container(primary)
    node["defaults"] = defaults
    cs.store(name="nmt_plot", node=node)


_register()


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="nmt_plot")
def main(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`),
    run :func:`transformer_nmt.plot.make.make_plots`.

    A user's mistake (bad value, missing run folder or file, bad metrics line) prints one
    ``error:`` line and exits with status 2.
    """
    try:
        from transformer_nmt.plot.make import make_plots

        make_plots(typed_config(cfg))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
