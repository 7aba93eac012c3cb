"""``nmt-import``: a Marian-architecture transformers folder -> a run of ours.

    nmt-import source=path/to/marian_folder name=imported data.name=imported_spm
    nmt-translate name=imported data.name=imported_spm translate.input=in.en
    nmt-train experiment=multi30k_en_de trainer.init_from=runs/imported/checkpoints/averaged.pt

Writes ``<run_dir>/checkpoints/averaged.pt`` (the model, the composed config with the
folder's architecture, ``imported_from``) and copies the shared SentencePiece model to
``data/spm/<data.name>/spm.model``, where nmt-translate and nmt-evaluate look for it. A
folder that cannot be imported exactly (opus-mt's conventions, swish, separate vocabularies,
a non-zero output bias) is refused with one ``error:`` line and exit status 2.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from transformer_nmt.cli import CONFIG_DIR, typed_config
from transformer_nmt.cli.export import InteropConfig, fail
from transformer_nmt.config import to_plain


def run_import(cfg: InteropConfig):
    """Import ``cfg.source`` into ``cfg.run_dir``; returns the checkpoint path written.

    Raises:
        ExportError, FileNotFoundError, ValueError: no source, an existing model file
            without ``export.overwrite``, a folder that cannot be imported exactly.
    """
    from transformer_nmt.checkpoint import AVERAGED_NAME, checkpoint_dir
    from transformer_nmt.fileio import spm_model_path
    from transformer_nmt.interop.common import ExportError
    from transformer_nmt.interop.marian_import import import_marian

    if not cfg.source:
        raise ExportError("source=<folder> is required (a Marian transformers folder)")
    out = checkpoint_dir(cfg.run_dir) / AVERAGED_NAME
    if out.exists() and not cfg.export.overwrite:
        raise ExportError(f"{out} exists; pass export.overwrite=true to replace it")
    run_cfg = to_plain(cfg)
    for key in ("export", "source"):
        run_cfg.pop(key, None)
    import_marian(cfg.source, OmegaConf.create(run_cfg), out, spm_model_path(cfg.data))
    return out


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`),
    run :func:`run_import`; user errors exit 2 with one line."""
    try:
        print(run_import(typed_config(cfg)))
    except (ValueError, FileNotFoundError, RuntimeError, OSError) as e:
        fail(str(e).replace("\n", " "))


if __name__ == "__main__":
    main()
