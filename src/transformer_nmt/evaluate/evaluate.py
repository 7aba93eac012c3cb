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
  for a run on lowercased data (``data.lowercase``) the headline is lowercased (``-lc``,
  signature ``case:lc``) and the mixed-case score is beside it (``sacrebleu:cased``);
* the paper's BLEU (tensor2tensor's ``get_ende_bleu.sh`` for German, Moses tokenizer +
  multi-bleu otherwise) in its default form, or in ``decode.paper_bleu_form`` (the Ott et al.
  2018 preset: ``ott2018``), with the other historical forms beside it (``t2t-2018``,
  ``moses-a``), and the Multi30k papers' form (``mmt``: lowercased, Moses
  normalize-punctuation and tokenizer, multi-bleu -lc), see :mod:`transformer_nmt.evaluate.bleu`
  and docs/paper_bleu.md.

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
                    "translations_sha256", "checkpoint_sha256", "decode", "date",
                    "bleu": {"sacrebleu": {...}, "sacrebleu:cased": {...} (lowercased data),
                             "paper_bleu": {...},
                             "paper_bleu:<other form>": {...}, "paper_bleu:mmt": {...}},
                    "chrf": {...},
                    "speed": {...}}},
      "engines": {"ctranslate2" | "ctranslate2_int8": {"checkpoint", "checkpoint_sha256",
                  "steps", ..., "decode", "device", "date", "test_sets"}}   (when evaluated),
      "training_cost": {"gpu_hours", "flops", "train_seconds", "world_size"} or null,
      "train_summary": the run's train_summary.json or null,
      "stopped_short": {"steps", "max_steps", "stopped_by"} when training stopped before its
                       step target (a signal, the time budget, divergence), else null
    }

Every score dict has ``type``, ``label``, ``score`` and ``signature``. ``test_sets`` holds
the scores of our own beam search (``decode.engine=native``); another engine's go under
``engines`` with the settings that actually ran, and its translations under
``translations/<engine>/``. Evaluating some splits keeps the others' scores when they were
computed with the same checkpoint and decode settings (:func:`merge_results`). The file is
strict JSON (no NaN).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import os
import shutil
from enum import Enum
from pathlib import Path
from typing import Any

from transformer_nmt.checkpoint import check_vocab, checkpoint_metadata, load_model
from transformer_nmt.config import Config, Engine, as_plain, to_plain
from transformer_nmt.data.bpe import file_digest, load_tokenizer
from transformer_nmt.data.corpora import official_lines, orig_dir, reference_path
from transformer_nmt.decode.quantize import INT8, check_int8_device, decoding_model
from transformer_nmt.decode.translate import (
    EngineFactory,
    non_finite_scores_named,
    translate_lines,
    write_lines,
)
from transformer_nmt.errors import UserError
from transformer_nmt.evaluate.bleu import check_form, format_score, read_text_lines, score_all
from transformer_nmt.evaluate.gate import averaged_steps
from transformer_nmt.evaluate.identity import stopped_short
from transformer_nmt.evaluate.paper import PAPER_TABLE3
from transformer_nmt.fileio import REPLACE_HINT, raw_path, read_lines, write_json
from transformer_nmt.run.lock import folder_lock
from transformer_nmt.run.model_file import resolve_checkpoint
from transformer_nmt.run.results import (
    NATIVE,
    engine_results,
    merge_results,
    read_previous_results,
)
from transformer_nmt.run.summary import read_train_summary
from transformer_nmt.runtime import resolve_device

log = logging.getLogger(__name__)

TRAINING_COST_KEYS = ("gpu_hours", "flops", "train_seconds", "world_size")


_BACKUP = ".{}.old.tmp"
"""An earlier translations file kept while a new evaluation is written (restored on failure)."""


def decode_record(decode: Any, engine: Any) -> dict[str, Any]:
    """The decode settings that actually ran with ``engine``, as results.json records them.

    CTranslate2 divides by |Y|^lenpen (``lenpen_form=fairseq``) and stops once ``beam_size``
    hypotheses have finished (``stopping=beam``), whatever ``decode`` asked
    (:class:`transformer_nmt.interop.ctranslate2.CTranslate2Engine`); its ``precision`` is the
    compute type it ran in (``float32``, ``int8``, ...).
    """
    keys = ("beam_size", "lenpen", "lenpen_form", "stopping", "max_len_a", "max_len_b", "nbest",
            "max_tokens", "max_input_tokens", "precision", "engine")
    record = {k: _plain_value(getattr(decode, k)) for k in keys}
    if str(decode.engine) != NATIVE:
        record["lenpen_form"] = "fairseq"
        record["stopping"] = "beam"
        record["precision"] = str(getattr(engine, "compute_type", record["precision"]))
    return record


def _plain_value(value: Any) -> Any:
    """An Enum choice as its string; other values as they are."""
    return str(value) if isinstance(value, Enum) else value


def evaluate(cfg: Config, engine: EngineFactory | None = None) -> dict[str, Any]:
    """Translate and score the test sets ``cfg.data.test_splits``; write their translations
    and merge their scores into results.json, holding the run folder's lock
    (:func:`transformer_nmt.run.lock.folder_lock`, as ``nmt-evaluate``) throughout.

    The translations and results.json are one unit: each test set's entry records the
    SHA-256 of the translations it scored (``translations_sha256``), results.json is written
    last, and a failure before it is written puts the earlier translations back.

    Args:
        cfg: the composed run config (``data``, ``decode``, ``name``, ``run_dir``,
            ``table3``, ``extra``).
        engine: ``(model, checkpoint, cfg, device) -> model`` that swaps in another decoding
            engine as ``decode.engine`` says (the CLI passes
            :func:`transformer_nmt.interop.ctranslate2.decode_engine`); None = ours only.

    Returns:
        The results dict written to ``<run_dir>/results.json`` (:func:`merge_results`: the
        scores of test sets and engines not evaluated now are kept).

    Raises:
        FileNotFoundError: no model to decode with, no SentencePiece model, or a missing
            test file (named).
        UserError: another ``decode.engine`` than ``native`` without an ``engine``;
            ``data.test_splits`` empty; a damaged ``train_summary.json`` (found
            before decoding); ``decode.precision=int8`` on a GPU or with a model it cannot
            quantize (:mod:`transformer_nmt.decode.quantize`); a test source and reference
            with different line counts; another command holds the run folder; invalid
            UTF-8 in a reference under ``data.encoding_errors=strict`` (a DataError naming
            file, line and bytes).
    """
    run_dir = Path(cfg.run_dir)
    if engine is None and cfg.decode.engine != Engine.native:
        raise UserError(f"decode.engine={cfg.decode.engine} is decoded by nmt-evaluate; this "
                        "call decodes with ours only")
    if not cfg.data.test_splits:
        raise UserError(
            f"data.test_splits is empty: nothing to evaluate, and {run_dir / 'results.json'} "
            "would lose its scores; name the test sets, e.g. data.test_splits=[test]")
    with folder_lock(run_dir, "nmt-evaluate"):
        return _evaluate(cfg, run_dir, engine)


def _evaluate(cfg: Config, run_dir: Path, engine_factory: EngineFactory | None
              ) -> dict[str, Any]:
    data = cfg.data
    summary = read_train_summary(run_dir)  # checked before any decoding
    try:
        check_form(data.tgt_lang, cfg.decode.paper_bleu_form)
    except ValueError as e:
        raise UserError(f"decode.paper_bleu_form: {e}") from e
    device = resolve_device(cfg.decode.device)
    if cfg.decode.precision == INT8 and cfg.decode.engine == Engine.native:
        check_int8_device(device)  # before the model is read
    ckpt_path = resolve_checkpoint(cfg)
    meta = checkpoint_metadata(ckpt_path)
    model, model_cfg = load_model(ckpt_path, device)
    tokenizer = load_tokenizer(data)
    check_vocab(ckpt_path, tokenizer)
    # a model of lowercased data writes lowercased text: its headline sacreBLEU is lowercased
    lowercased = bool(model_cfg.data.lowercase or tokenizer.lowercase)
    params = int(model.num_parameters())
    # the model itself unless decode.engine says otherwise
    engine = model if engine_factory is None else engine_factory(model, ckpt_path, cfg, device)
    engine = decoding_model(engine, cfg.decode, device, ckpt_path)  # int8: quantized, once
    engine_name = str(cfg.decode.engine)
    log.info("evaluating %s (%s, %d parameters, step %s) on %s",
             ckpt_path, model_cfg.model.name, params, meta["step"], device)
    checkpoint_sha256 = file_digest(ckpt_path)
    decode = decode_record(cfg.decode, engine)
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    out_dir = run_dir / "translations" / ("" if engine_name == NATIVE else engine_name)
    _restore_backups(out_dir, read_previous_results(run_dir / "results.json"))

    test_sets: dict[str, Any] = {}
    written: list[tuple[Path, Path | None]] = []  # (translations, the earlier file's backup)
    try:
        for split in data.test_splits:
            src_file = raw_path(data, split, data.src_lang)
            ref_file = reference_path(data, split, data.tgt_lang)
            for f in (src_file, ref_file):
                if not f.is_file():
                    raise FileNotFoundError(
                        f"test file {f} not found (data.test_splits names {split!r}; run "
                        "nmt-prepare first: it keeps the official references as downloaded)")
            sources = list(read_lines(src_file, hint=None))
            # the reference as distributed: not cleaned, so it may still hold invalid UTF-8
            references = read_text_lines(ref_file, str(data.encoding_errors), REPLACE_HINT)
            expected = official_lines(data, split)
            if expected is not None and len(references) != expected:
                raise UserError(
                    f"{ref_file} has {len(references)} lines, not the {expected} of the official "
                    f"{split}: it was prepared from a truncated copy; delete "
                    f"{orig_dir(data) / (split + '.json')} and run nmt-prepare again for "
                    f"data={data.name} (it fetches the test set again and checks it)")
            if len(sources) != len(references):
                raise UserError(
                    f"{src_file} has {len(sources)} lines but its reference {ref_file} has "
                    f"{len(references)}: they no longer belong together; run nmt-prepare "
                    f"again for data={data.name} (it rewrites both from the originals), or "
                    f"leave {split} out of data.test_splits")
            with non_finite_scores_named(ckpt_path, model, cfg.decode.precision):
                hypotheses, speed = translate_lines(engine, tokenizer, sources, cfg.decode, device)
            out_file = out_dir / f"{split}.{data.tgt_lang}"
            written.append((out_file, _backup(out_file)))
            write_lines(hypotheses, out_file)
            # Score the two files as written, as `sacrebleu REF -i HYP` reads them.
            scores = score_all(read_text_lines(out_file), references, data.tgt_lang,
                               cfg.decode.paper_bleu_form, lowercase=lowercased)
            print(f"{cfg.name} {split} ({len(sources)} sentences, {data.src_lang}->"
                  f"{data.tgt_lang}{'' if engine_name == NATIVE else ', ' + engine_name}):")
            for result in scores.values():
                print(f"  {format_score(result)}")
            test_sets[split] = {
                "sentences": len(sources),
                "source": str(src_file),
                "reference": str(ref_file),
                "translations": str(out_file),
                "translations_sha256": file_digest(out_file),
                "checkpoint_sha256": checkpoint_sha256,
                "decode": decode,
                "date": date,
                "bleu": {kind: score for kind, score in scores.items() if kind != "chrf"},
                "chrf": scores["chrf"],
                "speed": speed,
            }

        paper_row = PAPER_TABLE3.get(cfg.table3.variant) if cfg.table3.variant else None
        table3_row = paper_row.row if paper_row is not None else (cfg.table3.variant or None)
        cost = {k: summary.get(k) for k in TRAINING_COST_KEYS} if summary is not None else None
        averaged = meta["averaged_from"]
        trainer_cfg = model_cfg.trainer
        new = {
            "experiment": cfg.name,
            "date": date,
            "run_dir": str(run_dir),
            "table3_row": table3_row,
            "table3": ({"variant": cfg.table3.variant, "seed": cfg.trainer.seed}
                       if cfg.table3.variant else None),
            "extra": as_plain(cfg.extra),
            "data": {
                "name": data.name,
                "corpus": data.corpus,
                "src_lang": data.src_lang,
                "tgt_lang": data.tgt_lang,
                "max_train_pairs": model_cfg.data.max_train_pairs,
            },
            "model": {"name": model_cfg.model.name, "params": params,
                      "config": as_plain(model_cfg.model)},
            "trainer": {
                "label_smoothing": trainer_cfg.label_smoothing,
                "max_steps": trainer_cfg.max_steps,
                "tokens_per_step": trainer_cfg.tokens_per_step,
            },
            "checkpoint": str(ckpt_path),
            "checkpoint_sha256": checkpoint_sha256,
            "steps": meta["step"],
            "checkpoints_averaged": averaged,
            "num_checkpoints_averaged": len(averaged) if averaged is not None else None,
            "averaged_steps": averaged_steps({"checkpoints_averaged": averaged}),
            "run_config": to_plain(model_cfg),
            "decode": decode,
            "device": str(device),
            "test_sets": test_sets,
            "training_cost": cost,
            "train_summary": summary,
            "stopped_short": stopped_short(summary, trainer_cfg.max_steps),
        }
        out = run_dir / "results.json"
        results, messages = merge_results(read_previous_results(out), new, engine_name)
        write_json(out, results)  # last: it names the translations just written
    except BaseException:
        for out_file, backup in reversed(written):  # the earlier translations back
            with contextlib.suppress(OSError):
                if backup is not None:
                    os.replace(backup, out_file)
                else:
                    out_file.unlink(missing_ok=True)
        raise
    finally:
        for _, backup in written:
            if backup is not None:
                backup.unlink(missing_ok=True)
    for message in messages:
        log.warning("%s: %s", out, message)
    log.info("wrote %s", out)
    return results


def _restore_backups(folder: Path, results: dict[str, Any] | None) -> None:
    """Put back the translations an evaluation killed before writing results.json replaced:
    a backup beside a file (:func:`_backup`) whose SHA-256 is the one results.json records for
    that file, while the file's is not. Other backups (results.json was written) are removed."""
    recorded = {}
    for part in engine_results(results or {}).values():
        for test in (part.get("test_sets") or {}).values():
            if isinstance(test, dict) and test.get("translations"):
                recorded[str(test["translations"])] = test.get("translations_sha256")
    suffix = _BACKUP.format("")[1:]  # ".old.tmp"
    for backup in folder.glob(_BACKUP.format("*")):
        target = backup.with_name(backup.name[1:-len(suffix)])
        want = recorded.get(str(target))
        if (want and file_digest(backup) == want
                and not (target.is_file() and file_digest(target) == want)):
            os.replace(backup, target)
            log.warning("put back %s: an evaluation was killed after replacing it and before "
                        "writing results.json", target)
        else:
            backup.unlink(missing_ok=True)


def _backup(path: Path) -> Path | None:
    """A copy (hard link) of ``path`` beside it, for :func:`_evaluate` to restore; None if
    there is no earlier file."""
    if not path.is_file():
        return None
    backup = path.with_name(_BACKUP.format(path.name))
    backup.unlink(missing_ok=True)
    try:
        os.link(path, backup)
    except OSError:  # a file system without hard links
        shutil.copy2(path, backup)
    return backup
