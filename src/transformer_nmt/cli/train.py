"""``nmt-train``: train a Transformer (``transformer_nmt.train.train``) from the Hydra config.

    nmt-prepare experiment=multi30k_en_de && nmt-train experiment=multi30k_en_de
    nmt-train experiment=wmt14_en_de_base trainer.update_freq=8            # one GPU
    torchrun --nproc_per_node=8 -m transformer_nmt.cli.train experiment=wmt14_en_de_base
    nmt-train experiment=wmt14_en_de_big trainer.dry_run=true             # no corpus needed

Training reads the prepared data (``nmt-prepare`` / ``make data``) and fails with one line
naming the missing file when it is not there. The run directory is ``cfg.run_dir``
(``runs/<name>``), the same on every rank; a run directory that already holds checkpoints
is resumed from its latest one. ``trainer.dry_run=true`` runs
:func:`transformer_nmt.dryrun.dry_run` instead.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from transformer_nmt.cli import CONFIG_DIR, run_app, typed_config, user_errors


# An absolute config path (the repository's configs/, or $NMT_CONFIG_DIR): a path relative
# to this file is not found when the app starts from the nmt-train console script.
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`),
    then train (or dry-run: prepare a slice, then train a few steps)."""
    with user_errors():
        cfg = typed_config(cfg)
        if cfg.trainer.dry_run:
            from transformer_nmt.dryrun import dry_run

            dry_run(cfg)
        else:
            from transformer_nmt.train import train

            train(cfg)


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    run_app(app, "train")


if __name__ == "__main__":
    main()
