"""``nmt-train``: train a Transformer (``transformer_nmt.train.train``) from the Hydra config.

    nmt-train experiment=multi30k_en_de
    nmt-train experiment=wmt14_en_de_base trainer.update_freq=8            # one GPU
    torchrun --nproc_per_node=8 -m transformer_nmt.cli.train experiment=wmt14_en_de_base

The run directory is ``cfg.run_dir`` (``runs/<name>``), the same on every rank; a run
directory that already holds checkpoints is resumed from its latest one.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from transformer_nmt import config as _config
from transformer_nmt.cli import CONFIG_DIR, run_app, user_errors


# An absolute config path (the repository's configs/, or $NMT_CONFIG_DIR): a path relative
# to this file is not found when the app starts from the nmt-train console script.
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Validate the config and train."""
    with user_errors():
        _config.validate(cfg)
        from transformer_nmt.train import train

        train(cfg)


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    run_app(app, "train")


if __name__ == "__main__":
    main()
