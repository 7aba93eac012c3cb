"""``nmt-export``: a run's model as a Hugging Face Marian folder or a CTranslate2 model.

The model is ``decode.checkpoint``, else the run's averaged.pt, else its latest checkpoint
(as nmt-translate); the tokenizer is the run's SentencePiece model; the model card reads
the run's results.json when present. The options are the ``export`` group of the config
(:class:`transformer_nmt.config.ExportConfig`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from transformer_nmt.choices import ExportFormat, Quantization
from transformer_nmt.config import Config
from transformer_nmt.errors import ExportError
from transformer_nmt.fileio import spm_model_path
from transformer_nmt.interop import ctranslate2 as ct2
from transformer_nmt.interop import hf
from transformer_nmt.run.lock import live_holder
from transformer_nmt.run.model_file import resolve_checkpoint
from transformer_nmt.run.results import ResultsError, read_results

log = logging.getLogger(__name__)


def default_output(cfg: Config) -> Path:
    """``export.output``, else ``<run_dir>/export/hf``, ``.../ctranslate2`` or
    ``.../ctranslate2_<quantization>``."""
    e = cfg.export
    if e.output:
        return Path(e.output)
    name = (str(e.format) if e.format == ExportFormat.hf or e.quantization == Quantization.none
            else f"{e.format}_{e.quantization}")
    return Path(cfg.run_dir) / "export" / name


def run_export(cfg: Config) -> Path:
    """Export the run's model as ``cfg.export`` says; returns the folder written.

    Raises:
        ExportError, FileNotFoundError, ValueError: a quantization given to the ``hf``
            format, missing files, a model the target cannot express.
    """
    e = cfg.export
    if e.format == ExportFormat.hf and e.quantization != Quantization.none:
        raise ExportError("export.quantization applies to export.format=ctranslate2 only")
    checkpoint = resolve_checkpoint(cfg)
    trainer = live_holder(cfg.run_dir)
    if trainer is not None and trainer.get("command") == "nmt-train":
        log.warning("%s is still being trained (nmt-train, process %d): %s is an intermediate "
                    "model; export again when the training has ended (and nmt-average has run)",
                    cfg.run_dir, trainer["pid"], checkpoint)
    out = default_output(cfg)
    if e.format == ExportFormat.hf:
        results_path = Path(cfg.run_dir) / "results.json"
        results = None
        if not results_path.is_file():
            log.warning("no %s: the model card will carry no BLEU (run nmt-evaluate first)",
                        results_path)
        else:
            try:
                results = read_results(results_path).raw
            except ResultsError as err:  # the card only: the export itself goes on
                log.warning("the model card will carry no BLEU: %s", err)
        return hf.export_hf(checkpoint, spm_model_path(cfg.data), out, results, e.overwrite)
    return ct2.export_ctranslate2(checkpoint, spm_model_path(cfg.data), out, str(e.quantization),
                                  e.overwrite)
