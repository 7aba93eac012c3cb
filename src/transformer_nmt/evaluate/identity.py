"""A run's identity for the tables: its whole resolved recipe, and whether its training
reached its step target.

Two results.json are seeds of one run only when every setting that changes the result is
equal: the model, dropout, label smoothing, optimizer, schedule, step target, batch, data and
vocabulary (the ``model``, ``trainer`` and ``data`` groups of the run's resolved config,
``run_config`` in results.json) and the decoding that was scored (``decode`` in results.json).
The seed is left out, and so are the settings that change how, not what, is computed
(:data:`HARMLESS_KEYS`: paths, logging, validation and saving frequencies, worker counts,
compilation, the dry run's own sizes). This is the same notion as the Table 2 gate's
(:mod:`transformer_nmt.evaluate.gate`), which compares a run's recipe with its preset's; here
every setting counts unless it is known to be harmless, so a field added later counts too.

:func:`shortfall`: a run whose training stopped before its ``trainer.max_steps`` (a signal,
``max_time_minutes``, divergence) is short; one stopped by another limit of its recipe
(``max_epochs``, ``patience``) is not.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from transformer_nmt.config import Config, ModelConfig, Table3Config, apply_row
from transformer_nmt.errors import Table3Error
from transformer_nmt.evaluate.gate import same_setting

SEED_KEY = "trainer.seed"
"""The setting that makes runs of one recipe seeds of one row."""
HARMLESS_KEYS: tuple[str, ...] = (
    # logging, validation, saving: how often, how much
    "trainer.log_every_steps", "trainer.validate_every_steps", "trainer.validate_every_epochs",
    "trainer.valid_bleu", "trainer.valid_bleu_sentences", "trainer.save_every_steps",
    "trainer.save_every_epochs", "trainer.save_every_minutes", "trainer.keep_last",
    "trainer.no_save", "trainer.max_bad_steps",
    # a wall-clock budget: a run it stopped early is short (shortfall), not another recipe
    "trainer.max_time_minutes",
    # worker processes, data loading, gradient buckets, kernels, compilation
    "trainer.num_workers", "data.num_workers", "trainer.prefetch_factor",
    "trainer.bucket_cap_mb", "trainer.sdpa_backends", "trainer.compile",
    "trainer.pad_to_multiple", "trainer.tokens_per_step_tolerance",
    # the dry run's own sizes, the resume allow-list
    "trainer.dry_run", "trainer.dry_run_steps", "trainer.dry_run_warmup_steps",
    "trainer.resume_changed",
    # paths and sources of the corpus (its name, languages, filters and vocabulary count)
    "data.root", "data.mirror", "data.url", "data.custom_files", "data.test_splits",
    # the preset's name (its values count)
    "model.name",
    # decoding batch size and n-best list (the 1-best output is scored)
    "decode.max_tokens", "decode.nbest",
)
"""Settings that do not change what a run computes; every other ``model``, ``trainer``,
``data`` and ``decode`` key is part of its identity."""
REPLANNED_KEYS = ("trainer.max_tokens", "trainer.update_freq")
"""Derived from ``trainer.tokens_per_step`` for the GPUs that ran; with that target set, the
target (part of the identity) is the batch, not these."""
ROW_KEYS = ("model.encoder_layers", "model.decoder_layers", "model.heads", "model.d_model",
            "model.d_ff", "model.d_k", "model.d_v", "model.dropout", "model.positions",
            "trainer.label_smoothing", "trainer.max_steps")
"""The settings a Table 3 row may change (:func:`transformer_nmt.config.apply_row`)."""
COMPLETE_STOPS = ("max_steps", "max_epochs", "patience")
"""``stopped_by`` values of a run that did what its recipe asked."""


def _flatten(node: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(node, dict) and prefix not in HARMLESS_KEYS:
        for key, value in node.items():
            _flatten(value, f"{prefix}.{key}", out)
    else:
        out[prefix] = node


def recipe(result: dict[str, Any]) -> dict[str, Any]:
    """A run's identity: ``{dotted key: value}`` of every setting that changes its result.

    From ``run_config`` (``model``, ``trainer``, ``data``) and ``decode`` of a results.json,
    without :data:`SEED_KEY` and :data:`HARMLESS_KEYS`. A results.json written before
    ``run_config`` was recorded gives what it has: ``model.config``, ``trainer``, ``data``.
    """
    run = result.get("run_config")
    groups: dict[str, Any]
    if isinstance(run, dict):
        groups = {g: run.get(g) or {} for g in ("model", "trainer", "data")}
    else:
        groups = {"model": (result.get("model") or {}).get("config") or {},
                  "trainer": result.get("trainer") or {}, "data": result.get("data") or {}}
    groups["decode"] = result.get("decode") or {}
    flat: dict[str, Any] = {}
    for group, node in groups.items():
        _flatten(node, group, flat)
    skip = {SEED_KEY, *HARMLESS_KEYS}
    if flat.get("trainer.tokens_per_step") is not None:
        skip |= set(REPLANNED_KEYS)
    return {k: v for k, v in flat.items() if k not in skip}


def _norm(value: Any) -> Any:
    """A hashable form in which equal settings are equal (1 and 1.0, lists and tuples)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return tuple(_norm(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _norm(v)) for k, v in value.items()))
    return str(value)


def recipe_key(settings: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A hashable key of a :func:`recipe`: equal for equal recipes."""
    return tuple(sorted((k, _norm(v)) for k, v in settings.items()))


def differences(mine: dict[str, Any], theirs: dict[str, Any],
                ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """The settings of ``mine`` that ``theirs`` does not share (a key either lacks counts),
    with ``mine``'s values (None where only ``theirs`` has the key)."""
    return {k: mine.get(k) for k in sorted(set(mine) | set(theirs))
            if k not in ignore and (k not in mine or k not in theirs
                                    or not same_setting(mine[k], theirs[k]))}


def format_settings(settings: dict[str, Any]) -> str:
    """``trainer.max_steps=10, model.d_model=128``."""
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:g}"
        if isinstance(v, (list, tuple)):
            return "[" + ",".join(fmt(x) for x in v) + "]"
        return "null" if v is None else str(v)

    return ", ".join(f"{k}={fmt(v)}" for k, v in settings.items())


def row_recipe(base: dict[str, Any], row: dict[str, Any] | None) -> dict[str, Any] | None:
    """The recipe a Table 3 row gets from the base row's recipe ``base``: the row (its
    ``table3`` config: ``variant``, ``scale``, ``fixed``, ``scale_steps``) applied to the base
    row's model and trainer values (:func:`transformer_nmt.config.apply_row`), the rest as
    the base's. None when ``row`` is not recorded or does not apply to the base's values."""
    if not isinstance(row, dict) or not row.get("variant"):
        return None
    cfg = Config()
    for f in dataclasses.fields(ModelConfig):
        if f"model.{f.name}" in base:
            setattr(cfg.model, f.name, base[f"model.{f.name}"])
    cfg.trainer.max_steps = base.get("trainer.max_steps")
    cfg.trainer.label_smoothing = base.get("trainer.label_smoothing", 0.0)
    known = {f.name for f in dataclasses.fields(Table3Config)}
    cfg.table3 = Table3Config(**{k: v for k, v in row.items() if k in known})
    try:
        apply_row(cfg)
    except (Table3Error, TypeError, ValueError):
        return None
    out = dict(base)
    for key in ROW_KEYS:
        group, name = key.split(".")
        if key in base:
            out[key] = getattr(cfg.model if group == "model" else cfg.trainer, name)
    return out


def stopped_short(summary: dict[str, Any] | None, max_steps: int | None) -> dict[str, Any] | None:
    """``{"steps", "max_steps", "stopped_by"}`` when a run's training (its train_summary.json
    as a dict) stopped before its step target ``max_steps`` for a cause other than a limit of
    its recipe (:data:`COMPLETE_STOPS`); None when it reached the target, or either is not
    recorded."""
    if not isinstance(summary, dict) or max_steps is None:
        return None
    steps, stopped_by = summary.get("steps"), summary.get("stopped_by")
    if not isinstance(steps, int) or stopped_by in COMPLETE_STOPS or steps >= int(max_steps):
        return None
    return {"steps": steps, "max_steps": int(max_steps), "stopped_by": stopped_by}


def shortfall(result: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`stopped_short` of a results.json: its ``stopped_short`` when recorded, else
    computed from its ``train_summary`` and step target (files written before it was
    recorded)."""
    if "stopped_short" in result:
        found = result["stopped_short"]
        return found if isinstance(found, dict) else None
    run = result.get("run_config") if isinstance(result.get("run_config"), dict) else {}
    max_steps = ((run.get("trainer") or {}).get("max_steps")
                 if run else (result.get("trainer") or {}).get("max_steps"))
    return stopped_short(result.get("train_summary"), max_steps)


def short_text(short: dict[str, Any]) -> str:
    """``short: 68 of 1000 steps (signal SIGINT)``."""
    why = f" ({short['stopped_by']})" if short.get("stopped_by") else ""
    return f"short: {short['steps']:,} of {short['max_steps']:,} steps{why}"
