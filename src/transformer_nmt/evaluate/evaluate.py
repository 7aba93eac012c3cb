"""``nmt-evaluate``: translate every test set of a run and score it with both BLEUs and chrF.

Pipeline position: average -> translate -> **bleu** -> table.

For each split in ``cfg.data.test_splits`` the (cleaned) source ``data/raw/<data>/<split>.<src>``
is translated with the run's model (``decode.checkpoint``, else ``checkpoints/averaged.pt``,
else the latest checkpoint), written to ``runs/<name>/translations/<split>.<tgt>`` and
scored against the official reference exactly as distributed,
``data/raw/<data>/ref/<split>.<tgt>`` (written by the download stage, never cleaned):

* sacreBLEU (detokenized, 13a, mixed case), the headline, and chrF: both files are read as
  the ``sacrebleu`` command line reads them, so the score equals
  ``sacrebleu data/raw/<data>/ref/<split>.<tgt> -i runs/<name>/translations/<split>.<tgt>``;
* the paper's BLEU (tensor2tensor's ``get_ende_bleu.sh`` for German, Moses tokenizer +
  multi-bleu otherwise) in its default form, or in ``decode.paper_bleu_form`` (the Ott et al.
  2018 preset: ``ott2018``), with the other historical forms beside it (``t2t-2018``,
  ``moses-a``), see :mod:`transformer_nmt.evaluate.bleu` and docs/paper_bleu.md.

``runs/<name>/results.json`` (written atomically) records::

    {
      "experiment", "date" (ISO 8601, UTC), "run_dir", "table3_row", "table3" (variant, seed)
      or null, "extra",
      "data": {"name", "corpus", "src_lang", "tgt_lang"},
      "model": {"name", "params", "config"},
      "trainer": {"label_smoothing", "max_steps"}   (from the checkpoint's config),
      "checkpoint", "checkpoint_sha256" (of the file decoded), "steps",
      "checkpoints_averaged" (file names or null),
      "num_checkpoints_averaged", "averaged_steps" (their steps, or null),
      "run_config": the checkpoint's whole resolved config (model, trainer, data, ...),
      "decode": the whole decode config (beam_size, lenpen, max_len_a, precision, engine, ...),
      "test_sets": {split: {"sentences", "source", "reference", "translations",
                    "bleu": {"sacrebleu": {...}, "paper_bleu": {...},
                             "paper_bleu:<other form>": {...}}, "chrf": {...},
                    "speed": {...}}},
      "training_cost": {"gpu_hours", "flops", "train_seconds", "world_size"} or null,
      "train_summary": the run's train_summary.json or null
    }

Every score dict has ``type``, ``label``, ``score`` and ``signature``.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from transformer_nmt.checkpoint import checkpoint_step
from transformer_nmt.config import Config, to_plain
from transformer_nmt.data.bpe import file_digest, load_tokenizer
from transformer_nmt.data.corpora import reference_path
from transformer_nmt.decode.translate import (
    non_finite_scores_named,
    read_lines,
    resolve_checkpoint,
    translate_lines,
    write_lines,
)
from transformer_nmt.errors import UserError
from transformer_nmt.evaluate.bleu import check_form, format_score, read_text_lines, score_all
from transformer_nmt.evaluate.gate import averaged_steps
from transformer_nmt.evaluate.paper import PAPER_TABLE3
from transformer_nmt.fileio import atomic_write, raw_path
from transformer_nmt.runtime import resolve_device

log = logging.getLogger(__name__)

TRAINING_COST_KEYS = ("gpu_hours", "flops", "train_seconds", "world_size")


def checkpoint_metadata(path: str | Path) -> dict[str, Any]:
    """``step`` and ``averaged_from`` of a training checkpoint or model file, read without
    loading its tensors (memory-mapped).

    Returns:
        ``{"step": int | None, "averaged_from": list[str] | None}``.

    Raises:
        FileNotFoundError: naming the path when it does not exist.
        UnreadableCheckpointError (a UserError): naming the path and its size when the file
            is empty, truncated or not a checkpoint.
    """
    from transformer_nmt.checkpoint import unreadable

    if not Path(path).is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as e:  # empty, truncated, another format
        raise unreadable(path, e) from e
    averaged = ckpt.get("averaged_from")
    return {
        "step": checkpoint_step(ckpt),
        "averaged_from": [str(p) for p in averaged] if averaged is not None else None,
    }


def read_train_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """``<run_dir>/train_summary.json`` (written by the training loop), or None if absent.

    Raises:
        UserError: the file is not UTF-8, not JSON or not a JSON object (names it and the line).
    """
    path = Path(run_dir) / "train_summary.json"
    if not path.is_file():
        return None
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); train again or "
                        "delete it") from e
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON (line {e.lineno}: {e.msg}); train again or "
                        "delete it") from e
    if not isinstance(summary, dict):
        raise UserError(f"{path}: not a training summary (a JSON {type(summary).__name__}, "
                        "not an object); train again or delete it")
    return summary


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def evaluate(cfg: Config) -> dict[str, Any]:
    """Translate and score every test set of ``cfg.data``; write translations and results.json.

    Args:
        cfg: the composed run config (``data``, ``decode``, ``name``, ``run_dir``,
            ``table3``, ``extra``).

    Returns:
        The results dict written to ``<run_dir>/results.json``.

    Raises:
        FileNotFoundError: no model to decode with, no SentencePiece model, or a missing
            test file (named).
        ValueError: a test source and reference with different line counts (both named).
        UserError: ``data.test_splits`` empty; a damaged ``train_summary.json`` (found
            before decoding).
    """
    from transformer_nmt.checkpoint import load_model
    from transformer_nmt.data.bpe import check_vocab

    run_dir = Path(cfg.run_dir)
    data = cfg.data
    if not data.test_splits:
        raise UserError(
            f"data.test_splits is empty: nothing to evaluate, and {run_dir / 'results.json'} "
            "would lose its scores; name the test sets, e.g. data.test_splits=[test]")
    summary = read_train_summary(run_dir)  # checked before any decoding
    try:
        check_form(data.tgt_lang, cfg.decode.paper_bleu_form)
    except ValueError as e:
        raise UserError(f"decode.paper_bleu_form: {e}") from e
    device = resolve_device(cfg.decode.device)
    ckpt_path = resolve_checkpoint(cfg)
    meta = checkpoint_metadata(ckpt_path)
    model, model_cfg = load_model(ckpt_path, device)
    tokenizer = load_tokenizer(data)
    check_vocab(ckpt_path, tokenizer)
    params = int(model.num_parameters())
    from transformer_nmt.interop.ctranslate2 import decode_engine

    engine = decode_engine(model, ckpt_path, cfg, device)  # the model unless decode.engine says otherwise
    log.info("evaluating %s (%s, %d parameters, step %s) on %s",
             ckpt_path, model_cfg.model.name, params, meta["step"], device)

    test_sets: dict[str, Any] = {}
    for split in data.test_splits:
        src_file = raw_path(data, split, data.src_lang)
        ref_file = reference_path(data, split, data.tgt_lang)
        for f in (src_file, ref_file):
            if not f.is_file():
                raise FileNotFoundError(
                    f"test file {f} not found (data.test_splits names {split!r}; run "
                    "nmt-prepare first: it keeps the official references as downloaded)")
        sources, references = read_lines(src_file), read_text_lines(ref_file)
        if len(sources) != len(references):
            raise ValueError(
                f"{src_file} has {len(sources)} lines but {ref_file} has {len(references)}"
            )
        with non_finite_scores_named(ckpt_path, model, cfg.decode.precision):
            hypotheses, speed = translate_lines(engine, tokenizer, sources, cfg.decode, device)
        out_file = run_dir / "translations" / f"{split}.{data.tgt_lang}"
        write_lines(hypotheses, out_file)
        # Score the two files as written, as `sacrebleu REF -i HYP` reads them.
        scores = score_all(read_text_lines(out_file), references, data.tgt_lang,
                           cfg.decode.paper_bleu_form)
        print(f"{cfg.name} {split} ({len(sources)} sentences, {data.src_lang}->{data.tgt_lang}):")
        for result in scores.values():
            print(f"  {format_score(result)}")
        test_sets[split] = {
            "sentences": len(sources),
            "source": str(src_file),
            "reference": str(ref_file),
            "translations": str(out_file),
            "bleu": {kind: score for kind, score in scores.items() if kind != "chrf"},
            "chrf": scores["chrf"],
            "speed": speed,
        }

    paper_row = PAPER_TABLE3.get(str(cfg.table3.variant)) if cfg.table3.variant else None
    table3_row = paper_row.row if paper_row is not None else (cfg.table3.variant or None)
    cost = {k: summary.get(k) for k in TRAINING_COST_KEYS} if summary is not None else None
    averaged = meta["averaged_from"]
    trainer_cfg = model_cfg.get("trainer", {}) if hasattr(model_cfg, "get") else {}
    results = {
        "experiment": cfg.name,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "run_dir": str(run_dir),
        "table3_row": table3_row,
        "table3": ({"variant": str(cfg.table3.variant), "seed": int(cfg.trainer.seed)}
                   if cfg.table3.variant else None),
        "extra": _plain(cfg.extra),
        "data": {
            "name": data.name,
            "corpus": data.corpus,
            "src_lang": data.src_lang,
            "tgt_lang": data.tgt_lang,
            "max_train_pairs": (model_cfg.get("data", {}).get("max_train_pairs")
                                if hasattr(model_cfg, "get") else None),
        },
        "model": {"name": model_cfg.model.name, "params": params,
                  "config": _plain(model_cfg.model)},
        "trainer": {
            "label_smoothing": trainer_cfg.get("label_smoothing"),
            "max_steps": trainer_cfg.get("max_steps"),
            "tokens_per_step": trainer_cfg.get("tokens_per_step"),
        },
        "checkpoint": str(ckpt_path),
        "checkpoint_sha256": file_digest(ckpt_path),
        "steps": meta["step"],
        "checkpoints_averaged": averaged,
        "num_checkpoints_averaged": len(averaged) if averaged is not None else None,
        "averaged_steps": averaged_steps({"checkpoints_averaged": averaged}),
        "run_config": to_plain(model_cfg),
        "decode": to_plain(cfg.decode),
        "device": str(device),
        "test_sets": test_sets,
        "training_cost": cost,
        "train_summary": summary,
    }
    out = run_dir / "results.json"
    with atomic_write(out) as f:
        json.dump(results, f, indent=2, ensure_ascii=False)
        f.write("\n")
    log.info("wrote %s", out)
    return results
