"""results.json: how it is merged and written (:mod:`transformer_nmt.evaluate.evaluate`),
and the one check every reader applies (``nmt-table``, ``nmt-export``'s model card).

Format: see :mod:`transformer_nmt.evaluate.evaluate`. ``test_sets`` at the top level holds
the scores of our own beam search; another ``decode.engine``'s go under ``engines.<engine>``,
each part with the checkpoint and decode settings it was computed with.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

NATIVE = "native"
"""``decode.engine`` of our own beam search: its scores are ``test_sets`` at the top level of
results.json; another engine's are under ``engines.<engine>`` (:func:`merge_results`)."""
ENGINE_KEYS = ("checkpoint", "checkpoint_sha256", "steps", "checkpoints_averaged",
               "num_checkpoints_averaged", "decode", "device", "test_sets")
"""The fields of results.json that describe one engine's evaluation (the rest: the run)."""


def engine_results(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every engine's part of a results.json: ``{engine: {checkpoint, ..., test_sets}}``, the
    native engine's from the top level (:data:`ENGINE_KEYS`), the others' from ``engines``."""
    out = {}
    if results.get("test_sets"):
        out[NATIVE] = {k: results.get(k) for k in ENGINE_KEYS}
    for name, part in (results.get("engines") or {}).items():
        if isinstance(part, dict) and part.get("test_sets"):
            out[str(name)] = part
    return out


def _scored_with(entry: dict[str, Any], block: dict[str, Any]) -> tuple[Any, Any]:
    """(checkpoint SHA-256, decode settings) a test set's scores were computed with (the
    entry's own, else its block's, for files written before entries carried them)."""
    return (entry.get("checkpoint_sha256", block.get("checkpoint_sha256")),
            entry.get("decode", block.get("decode")))


def merge_results(old: dict[str, Any] | None, new: dict[str, Any],
                  engine: str) -> tuple[dict[str, Any], list[str]]:
    """``new`` (one evaluation of some test splits with ``engine``) merged into the ``old``
    results.json of the run, and what the merge replaced or dropped, one message each.

    A split evaluated now replaces its earlier entry of the same engine (the message gives
    both sacreBLEU scores). A split not evaluated now keeps its entry when it was scored with
    the same checkpoint (SHA-256) and decode settings; one scored otherwise is dropped (the
    message names it and how to score it again), so every entry of an engine describes the
    checkpoint and settings recorded beside it. Other engines' results are kept as they are.
    """
    messages: list[str] = []
    new_block = {k: new[k] for k in ENGINE_KEYS}
    old = old if isinstance(old, dict) else {}
    old_engines = dict(old.get("engines") or {}) if isinstance(old.get("engines"), dict) else {}
    if engine == NATIVE:
        old_block = {k: old.get(k) for k in ENGINE_KEYS}
    else:
        old_block = old_engines.get(engine) if isinstance(old_engines.get(engine), dict) else {}
    old_tests = old_block.get("test_sets") if isinstance(old_block.get("test_sets"), dict) else {}
    tests: dict[str, Any] = {}
    for split, entry in old_tests.items():
        if split in new_block["test_sets"] or not isinstance(entry, dict):
            continue
        if _scored_with(entry, old_block) == (new["checkpoint_sha256"], new["decode"]):
            tests[split] = entry
        else:
            messages.append(
                f"dropped the earlier {engine} scores of {split}: they were computed with "
                "another checkpoint or other decode settings; evaluate it again with "
                f"data.test_splits=[{split}] to score it with these")
    for split, entry in new_block["test_sets"].items():
        before = old_tests.get(split)
        if isinstance(before, dict):
            messages.append(f"replaced the earlier {engine} scores of {split} (sacreBLEU "
                            f"{_sacre(before)} -> {_sacre(entry)})")
        tests[split] = entry
    new_block["test_sets"] = tests
    merged = {k: v for k, v in new.items() if k not in ENGINE_KEYS and k != "engines"}
    if engine == NATIVE:
        merged.update(new_block)
    else:
        have_native = isinstance(old.get("test_sets"), dict) and bool(old.get("test_sets"))
        merged.update({k: old.get(k) for k in ENGINE_KEYS} if have_native
                      else {**new_block, "test_sets": {}})
        old_engines[engine] = {**new_block, "date": new["date"]}
    if old_engines:
        merged["engines"] = old_engines
    return merged, messages


def _sacre(entry: dict[str, Any]) -> str:
    score = ((entry.get("bleu") or {}).get("sacrebleu") or {}).get("score")
    return f"{score:.2f}" if isinstance(score, (int, float)) else "?"


def read_previous_results(path: Path) -> dict[str, Any] | None:
    """The run's results.json before this evaluation, or None (absent; unreadable, with a
    warning that it is replaced)."""
    if not path.is_file():
        return None
    try:
        old = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        log.warning("%s cannot be read (%s); it is replaced by this evaluation's results",
                    path, e)
        return None
    if not isinstance(old, dict):
        log.warning("%s is not a results object; it is replaced by this evaluation's results",
                    path)
        return None
    return old
