"""``nmt-export``: a run's model as a Hugging Face Marian folder or a CTranslate2 model.

    nmt-export experiment=multi30k_en_de                                 # runs/<name>/export/hf
    nmt-export experiment=multi30k_en_de export.format=ctranslate2 export.quantization=int8
    nmt-export experiment=multi30k_en_de decode.checkpoint=runs/x/checkpoints/checkpoint_300.pt

The model is ``decode.checkpoint``, else the run's averaged.pt, else its latest checkpoint
(as nmt-translate); the tokenizer is the run's SentencePiece model; the model card reads
the run's results.json when present. A model the target cannot compute exactly is refused
with one ``error:`` line and exit status 2 (see :mod:`transformer_nmt.interop`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from transformer_nmt.cli import CONFIG_DIR, run_app, typed_config, user_errors
from transformer_nmt.config import Config

log = logging.getLogger(__name__)


@dataclass
class ExportConfig:
    """Options of nmt-export."""

    format: str = "hf"
    """``hf`` (MarianMTModel folder) or ``ctranslate2``."""
    quantization: str = "none"
    """CTranslate2 weights: ``none`` (float32), ``int8``, ``int8_float32``, ``float16``."""
    output: str | None = None
    """Folder to write; None = ``<run_dir>/export/hf`` or ``<run_dir>/export/ctranslate2[_<q>]``."""
    overwrite: bool = False
    """Replace an existing output folder that holds an earlier export (atomically); a folder
    nmt-export did not write is never replaced. nmt-import: replace the target run's
    averaged.pt (a run that already holds checkpoints is refused without it)."""


@dataclass
class InteropConfig(Config):
    """The primary config plus the options of nmt-export and nmt-import."""

    export: ExportConfig = field(default_factory=ExportConfig)
    source: str | None = None
    """nmt-import: the Marian-architecture transformers folder to import."""


def register_interop_schema() -> None:
    """Make ``config_schema`` carry the export options. Called by the nmt-export and
    nmt-import entry points only, never on import: a process that merely imports this module
    (a test, a script) keeps the pipeline's schema for every other command."""
    ConfigStore.instance().store(name="config_schema", node=InteropConfig)


def default_output(cfg: InteropConfig) -> Path:
    """``<run_dir>/export/hf``, ``.../ctranslate2`` or ``.../ctranslate2_<quantization>``."""
    e = cfg.export
    if e.output:
        return Path(e.output)
    name = e.format if e.format == "hf" or e.quantization == "none" else f"{e.format}_{e.quantization}"
    return Path(cfg.run_dir) / "export" / name


def run_export(cfg: InteropConfig) -> Path:
    """Export the run's model as ``cfg.export`` says; returns the folder written.

    Raises:
        ExportError, FileNotFoundError, ValueError: bad options, missing files, a model the
            target cannot express.
    """
    from transformer_nmt.decode.translate import resolve_checkpoint
    from transformer_nmt.fileio import spm_model_path
    from transformer_nmt.interop import common, hf
    from transformer_nmt.interop import ctranslate2 as ct2

    e = cfg.export
    if e.format not in common.FORMATS:
        raise common.ExportError(f"export.format={e.format!r} is not one of {list(common.FORMATS)}")
    if e.format == "hf" and e.quantization != "none":
        raise common.ExportError("export.quantization applies to export.format=ctranslate2 only")
    checkpoint = resolve_checkpoint(cfg)
    out = default_output(cfg)
    if e.format == "hf":
        from transformer_nmt.evaluate.results import ResultsError, read_results

        results_path = Path(cfg.run_dir) / "results.json"
        results = None
        if not results_path.is_file():
            log.warning("no %s: the model card will carry no BLEU (run nmt-evaluate first)", results_path)
        else:
            try:
                results = read_results(results_path).raw
            except ResultsError as err:  # the card only: the export itself goes on
                log.warning("the model card will carry no BLEU: %s", err)
        return hf.export_hf(checkpoint, spm_model_path(cfg.data), out, results, e.overwrite)
    return ct2.export_ctranslate2(checkpoint, spm_model_path(cfg.data), out, e.quantization,
                                     e.overwrite)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def app(cfg: DictConfig) -> None:
    """Type and validate the config (:func:`typed_config`), then run :func:`run_export`."""
    from transformer_nmt.runtime import folder_lock

    with user_errors():
        cfg = typed_config(cfg)
        out = default_output(cfg)  # replaced whole, so its lock lies beside it
        with folder_lock(out.parent, "nmt-export", name=f".{out.name}.lock"):
            print(run_export(cfg))


def main() -> None:
    """Console entry point: :func:`app` with one-line user errors (exit status 2)."""
    register_interop_schema()
    run_app(app, "export")


if __name__ == "__main__":
    main()
