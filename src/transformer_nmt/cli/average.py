"""``nmt-average``: average the parameters of a run's last checkpoints (paper section 6.1).

Example: ``nmt-average experiment=wmt14_en_de_base`` averages the last ``average.last``
(5 for base, 20 for big) ``checkpoint_<step>.pt`` files of ``runs/<name>/checkpoints`` into
``averaged.pt``; ``'average.checkpoints=[a.pt,b.pt]'`` names the files instead.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from transformer_nmt.checkpoint import average_run
from transformer_nmt.cli import run_app, user_errors
from transformer_nmt.config import CONFIG_DIR, typed_config
from transformer_nmt.run.lock import folder_lock


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`), then run :func:`average_run`."""
    with user_errors():
        cfg = typed_config(cfg)
        with folder_lock(cfg.run_dir, "nmt-average"):  # not beside a trainer of the run
            print(average_run(cfg))


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    run_app(app, "average")


if __name__ == "__main__":
    main()
