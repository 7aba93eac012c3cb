"""``nmt-import``: a Marian-architecture transformers folder -> a run of ours
(:func:`transformer_nmt.interop.marian_import.run_import`).

    nmt-import export.source=path/to/marian_folder name=imported data.name=imported_spm

A folder that cannot be imported exactly (opus-mt's conventions, swish, separate
vocabularies, a non-zero output bias) is refused with one ``error:`` line and exit status 2.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from transformer_nmt.cli import run_app, user_errors
from transformer_nmt.config import CONFIG_DIR, typed_config


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`), then import under the run lock;
    prints the model file."""
    from transformer_nmt.interop.marian_import import run_import
    from transformer_nmt.run.lock import folder_lock

    with user_errors():
        cfg = typed_config(cfg)
        with folder_lock(cfg.run_dir, "nmt-import"):
            print(run_import(cfg))


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    run_app(app, "import_model")


if __name__ == "__main__":
    main()
