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

from transformer_nmt.cli import CONFIG_DIR, run_app, typed_config, user_errors
from transformer_nmt.cli.export import InteropConfig, register_interop_schema
from transformer_nmt.config import to_plain


def run_import(cfg: InteropConfig):
    """Import ``cfg.source`` into ``cfg.run_dir``; returns the checkpoint path written.

    Raises:
        ExportError, FileNotFoundError, ValueError: no source, a target run that already
            holds checkpoints without ``export.overwrite``, a folder that cannot be imported
            exactly.
    """
    from transformer_nmt.checkpoint import AVERAGED_NAME, checkpoint_dir
    from transformer_nmt.fileio import spm_model_path
    from transformer_nmt.interop.common import ExportError
    from transformer_nmt.interop.marian_import import import_marian

    if not cfg.source:
        raise ExportError("source=<folder> is required (a Marian transformers folder)")
    folder = checkpoint_dir(cfg.run_dir)
    out = folder / AVERAGED_NAME
    held = sorted(p.name for p in folder.glob("*.pt")) if folder.is_dir() else []
    if held and not cfg.export.overwrite:
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise ExportError(
            f"{cfg.run_dir} already holds checkpoints ({shown} in {folder}); import under "
            f"another name= (or run_dir=), or pass export.overwrite=true to replace {out.name}")
    run_cfg = to_plain(cfg)
    for key in ("export", "source"):
        run_cfg.pop(key, None)
    import_marian(cfg.source, OmegaConf.create(run_cfg), out, spm_model_path(cfg.data))
    return out


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`), then run :func:`run_import`."""
    from transformer_nmt.runtime import folder_lock

    with user_errors():
        cfg = typed_config(cfg)
        with folder_lock(cfg.run_dir, "nmt-import"):
            print(run_import(cfg))


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    register_interop_schema()
    run_app(app, "import_model")


if __name__ == "__main__":
    main()
