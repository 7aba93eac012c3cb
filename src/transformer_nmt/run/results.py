"""results.json: how an evaluation is merged into it (:mod:`transformer_nmt.evaluate.evaluate`),
and the one check every reader applies (``nmt-table``, ``nmt-export``'s model card).

Format: see :mod:`transformer_nmt.evaluate.evaluate`. ``test_sets`` at the top level holds
the scores of our own beam search; another ``decode.engine``'s go under ``engines.<engine>``,
each part with the checkpoint and decode settings it was computed with.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformer_nmt.errors import JsonFileError, UserError
from transformer_nmt.fileio import read_json
from transformer_nmt.run.summary import TrainSummary

log = logging.getLogger(__name__)

NATIVE = "native"
"""``decode.engine`` of our own beam search: its scores are ``test_sets`` at the top level of
results.json; another engine's are under ``engines.<engine>`` (:func:`merge_results`)."""
ENGINE_KEYS = ("checkpoint", "checkpoint_sha256", "steps", "checkpoints_averaged",
               "num_checkpoints_averaged", "decode", "device", "test_sets")
"""The fields of results.json that describe one engine's evaluation (the rest: the run)."""


MISSING = "–"
"""How a value that is not there (None) is printed in tables, model cards and messages."""


def format_value(value: Any, digits: int | None = None) -> str:
    """``value`` as the tables, the model card and the recipe checks print it: :data:`MISSING`
    for None, a number with ``digits`` decimals (a float as ``:g`` when ``digits`` is None),
    anything else as ``str``."""
    if value is None:
        return MISSING
    if digits is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.{digits}f}"
    return f"{value:g}" if isinstance(value, float) else str(value)


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
        old = read_json(path)
    except JsonFileError as e:
        log.warning("%s cannot be read (%s); it is replaced by this evaluation's results",
                    path, e.problem)
        return None
    if not isinstance(old, dict):
        log.warning("%s is not a results object; it is replaced by this evaluation's results",
                    path)
        return None
    return old


# --- the one check of every reader -------------------------------------------------------------

class ResultsError(UserError):
    """A results.json that its readers cannot use; the message names the file and the field
    (``problem``: the part between the file's name and :data:`ADVICE`)."""

    def __init__(self, message: str, problem: str | None = None) -> None:
        super().__init__(message)
        self.problem = problem or message


ADVICE = "evaluate the run again (nmt-evaluate) or move the file away"
"""What a :class:`ResultsError` advises."""


class _Problem(Exception):
    """What is wrong in a results.json (the field and value), for :meth:`Results.parse`."""


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


MAX_COUNT = 10 ** 15
"""Above any count of steps, sentences or checkpoints a results.json can hold."""


def _shown(value: Any) -> str:
    """A value as a problem names it: a number of many digits cut to its first ones."""
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:12]}… ({len(text)} characters)"


def _count(value: Any, where: str) -> None:
    """Refuse a count (steps, sentences, checkpoints) that is not a whole number in
    [0, :data:`MAX_COUNT`]."""
    if value is None:
        return
    if not (isinstance(value, int) and not isinstance(value, bool)):
        raise _Problem(f"{where} is {_shown(value)}, not a whole number")
    if not 0 <= value <= MAX_COUNT:
        raise _Problem(f"{where} is {_shown(value)}, not a count (0 to {MAX_COUNT:.0e})")


def _amount(value: Any, where: str) -> None:
    """Refuse an amount (parameters, hours, FLOPs) that is not a finite number >= 0."""
    if value is None:
        return
    if not _number(value):
        raise _Problem(f"{where} is {_shown(value)}, not a number")
    if value < 0:
        raise _Problem(f"{where} is {_shown(value)}, below 0")


@dataclass(frozen=True)
class Score:
    """One score of a test set: ``kind`` (``sacrebleu``, ``paper_bleu``, ``chrf``, ...), its
    ``label`` (what it is, for people), ``score`` (0-100) and sacreBLEU-style ``signature``."""

    kind: str
    label: str
    score: float
    signature: str


@dataclass(frozen=True)
class TestSet:
    """One test split's scores in results.json (one engine's)."""

    split: str
    sentences: int | None
    bleu: dict[str, Score]
    """By kind: ``sacrebleu``, ``paper_bleu`` and ``paper_bleu:<form>`` (older files: fewer)."""
    chrf: Score
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    def score(self, kind: str) -> float | None:
        """The score of ``kind`` (``chrf`` or a BLEU kind), None when not computed."""
        entry = self.chrf if kind == "chrf" else self.bleu.get(kind)
        return None if entry is None else entry.score


@dataclass(frozen=True)
class Results:
    """A results.json as every reader uses it (``nmt-table``, ``nmt-export``'s model card, the
    Table 3 sweep); :meth:`parse` is the one check they apply. The whole file stays in ``raw``."""

    path: str
    experiment: str
    test_sets: dict[str, TestSet]
    """Our own beam search's scores, by split."""
    engines: dict[str, dict[str, TestSet]]
    """Another decoding engine's scores (``ctranslate2``, ...), by engine and split."""
    params: float | None
    steps: int | None
    num_checkpoints_averaged: int | None
    train_summary: TrainSummary | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, obj: Any, path: str | Path) -> Results:
        """The record of a results.json's content ``obj``, read from ``path``.

        Raises:
            ResultsError: ``<path>: <what is wrong>; evaluate the run again (nmt-evaluate) or
                move the file away``: not an object; no experiment name; a group that is not an
                object; a test set without a bleu object, without ``chrf``, with a null score
                or one without a numeric score, a label or a signature; a score outside 0 to
                100; a non-numeric or negative ``model.params`` or training cost; a ``steps``,
                ``num_checkpoints_averaged`` or ``sentences`` that is not a count (0 to
                :data:`MAX_COUNT`); a non-numeric train summary field.
        """
        try:
            return cls._parse(obj, str(path))
        except _Problem as e:
            raise ResultsError(f"{path}: {e}; {ADVICE}", str(e)) from None

    @classmethod
    def _parse(cls, obj: Any, path: str) -> Results:
        if not isinstance(obj, dict):
            raise _Problem(f"a JSON {type(obj).__name__}, not an object")
        if not isinstance(obj.get("experiment"), str):
            raise _Problem(f"experiment is {obj.get('experiment')!r}, not a name")
        for key in ("model", "trainer", "data", "table3", "training_cost", "train_summary",
                    "engines"):
            if obj.get(key) is not None and not isinstance(obj[key], dict):
                raise _Problem(f"{key} is a {type(obj[key]).__name__}, not an object")
        model = obj.get("model") or {}
        if model.get("config") is not None and not isinstance(model["config"], dict):
            raise _Problem(f"model.config is a {type(model['config']).__name__}, not an object")
        params = model.get("params")
        _amount(params, "model.params")
        for key in ("steps", "num_checkpoints_averaged"):
            _count(obj.get(key), key)
        for key in ("gpu_hours", "flops"):
            _amount((obj.get("training_cost") or {}).get(key), f"training_cost.{key}")
        summary = None
        if obj.get("train_summary") is not None:
            try:
                summary = TrainSummary.parse(obj["train_summary"])
            except ValueError as e:
                raise _Problem(f"train_summary.{e}") from None
        engines = {}
        for name, part in (obj.get("engines") or {}).items():
            if not isinstance(part, dict):
                raise _Problem(f"engines.{name} is a {type(part).__name__}, not an object")
            for key in ("steps", "num_checkpoints_averaged"):
                _count(part.get(key), f"engines.{name}.{key}")
            engines[str(name)] = _test_sets(part.get("test_sets"), f"engines.{name}.test_sets")
        return cls(path=path, experiment=obj["experiment"],
                   test_sets=_test_sets(obj.get("test_sets"), "test_sets"), engines=engines,
                   params=params, steps=obj.get("steps"),
                   num_checkpoints_averaged=obj.get("num_checkpoints_averaged"),
                   train_summary=summary, raw=obj)


def _test_sets(tests: Any, where: str) -> dict[str, TestSet]:
    if tests is None:
        return {}
    if not isinstance(tests, dict):
        raise _Problem(f"{where} is a {type(tests).__name__}, not an object")
    out = {}
    for split, test in tests.items():
        if not isinstance(test, dict) or not isinstance(test.get("bleu"), dict):
            raise _Problem(f"{where}.{split} has no bleu object")
        if "chrf" not in test:
            raise _Problem(f"{where}.{split} has no chrf score")
        scores = {kind: _score(entry, kind, f"{where}.{split}.bleu.{kind}")
                  for kind, entry in test["bleu"].items()}
        sentences = test.get("sentences")
        _count(sentences, f"{where}.{split}.sentences")
        out[str(split)] = TestSet(split=str(split), sentences=sentences, bleu=scores,
                                  chrf=_score(test["chrf"], "chrf", f"{where}.{split}.chrf"),
                                  raw=test)
    return out


def _score(entry: Any, kind: str, where: str) -> Score:
    if entry is None:
        raise _Problem(f"{where} is null")
    if not isinstance(entry, dict) or not _number(entry.get("score")):
        raise _Problem(f"{where} has no numeric score")
    if not -1e-6 <= entry["score"] <= 100 + 1e-6:  # beyond rounding (100.00000000000004)
        raise _Problem(f"{where}.score is {_shown(entry['score'])}, outside 0 to 100")
    for key in ("label", "signature"):
        if not isinstance(entry.get(key), str) or not entry[key]:
            raise _Problem(f"{where} has no {key}")
    return Score(kind=kind, label=entry["label"], score=float(entry["score"]),
                 signature=entry["signature"])


def read_results(path: str | Path) -> Results:
    """Read and check one results.json (:meth:`Results.parse`).

    Raises:
        ResultsError: the file cannot be read, is not a regular file (a FIFO, a device), is
            larger than :data:`transformer_nmt.fileio.JSON_MAX_BYTES`, is not UTF-8 JSON
            (:func:`transformer_nmt.fileio.read_json`), or is not as
            :mod:`transformer_nmt.evaluate.evaluate` writes it (names the file and field).
    """
    try:
        obj = read_json(path)
    except JsonFileError as e:
        if e.problem.startswith("cannot be read"):
            raise ResultsError(str(e), e.problem) from None
        raise ResultsError(f"{e}; {ADVICE}", e.problem) from None
    return Results.parse(obj, path)
