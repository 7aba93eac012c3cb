"""``nmt-export``: a run's model as a Hugging Face Marian folder or a CTranslate2 model
(:func:`transformer_nmt.interop.export.run_export`).

    nmt-export experiment=multi30k_en_de                                 # runs/<name>/export/hf
    nmt-export experiment=multi30k_en_de export.format=ctranslate2 export.quantization=int8
    nmt-export experiment=multi30k_en_de decode.checkpoint=runs/x/checkpoints/checkpoint_300.pt

A model the target cannot compute exactly is refused with one ``error:`` line and exit
status 2 (see :mod:`transformer_nmt.interop`).
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from transformer_nmt.cli import run_app, user_errors
from transformer_nmt.config import CONFIG_DIR, typed_config


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`), then export under a lock beside
    the output folder; prints the folder."""
    from transformer_nmt.interop.export import default_output, run_export
    from transformer_nmt.run.lock import folder_lock

    with user_errors():
        cfg = typed_config(cfg)
        out = default_output(cfg)  # replaced whole, so its lock lies beside it
        with folder_lock(out.parent, "nmt-export", name=f".{out.name}.lock"):
            print(run_export(cfg))


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    run_app(app, "export")


if __name__ == "__main__":
    main()
