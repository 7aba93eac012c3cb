"""``nmt-plot``: training curves, BLEU per checkpoint and attention maps of a run (PNG or SVG)
(:func:`transformer_nmt.plot.make.make_plots`).

    nmt-plot experiment=multi30k_en_de                     # runs/multi30k_en_de/plots/
    nmt-plot 'plot.runs=[multi30k_en_de,multi30k_en_fr]'   # both runs on one figure
    nmt-plot plot.kinds=[attention] plot.sentence="A dog runs on the beach." plot.layer=2
    nmt-plot plot.format=svg plot.bleu_sentences=300
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from transformer_nmt.cli import run_app, user_errors
from transformer_nmt.config import CONFIG_DIR, typed_config


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`), then draw the figures."""
    from transformer_nmt.plot.make import make_plots

    with user_errors():
        make_plots(typed_config(cfg))


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    run_app(app, "plot")


if __name__ == "__main__":
    main()
