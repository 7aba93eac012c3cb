"""Which runs may stand beside the paper's Table 2: the whole recipe of a run, compared with
its preset's.

Pure functions over a results.json dict (:mod:`transformer_nmt.evaluate.evaluate` records the
run's whole resolved config, the decode config and the steps of the checkpoints averaged) and
the preset's composed config as a plain dict:

* :func:`recipe_differences`: every recipe setting of the run that differs from the preset's
  (model dimensions and dropout, label smoothing, optimizer, schedule, the exact step count,
  the last N periodic checkpoints averaged, the vocabulary and data filters, the batch
  target and its measured real tokens per step, decoding: beam, length penalty, maximum
  length, engine and precision), each named; [] admits the run.
* :func:`paper_bleu_of_form`: a test set's paper BLEU in one named form, read from the form
  each score was computed with (never a score of another form under that form's label).
* :func:`preset_for`: the experiment whose settings a Table 2 candidate must have.

Source: the paper, sections 5.1-5.4 and 6.1 (shared/PAPER.md), and the WMT14 presets that
carry them (docs/wmt14.md).
"""

from __future__ import annotations

import re
from typing import Any

from transformer_nmt.run.results import format_value

RECIPE_KEYS: dict[str, tuple[str, ...]] = {
    "model": ("encoder_layers", "decoder_layers", "d_model", "d_ff", "heads", "d_k", "d_v",
              "dropout", "attention_dropout", "activation_dropout", "norm", "share_embeddings",
              "positions", "init"),
    "trainer": ("label_smoothing", "adam_betas", "adam_eps", "weight_decay", "lr_multiplier",
                "warmup_steps", "lr_scheduler", "clip_norm", "max_steps", "save_every_steps",
                "tokens_per_step"),
    "data": ("corpus", "src_lang", "tgt_lang", "vocab_size", "spm_model_type",
             "spm_character_coverage", "unicode_form", "max_len", "max_ratio", "ratio_min_len",
             "dedup", "max_train_pairs"),
    "decode": ("beam_size", "lenpen", "lenpen_form", "max_len_a", "max_len_b", "stopping",
               "engine"),
}
"""The settings of the paper's recipe a Table 2 run must share with its preset, by config
group. Settings that change how fast, not what, is computed (workers, compilation, how
the step is split into micro-batches) are not among them."""
DECODE_PRECISIONS = ("fp32", "bf16")
"""Decoding precisions of our engine that Table 2 admits (fp16 and int8 engines are not)."""
DEFAULT_TOLERANCE = 0.1
"""The batch check's tolerance for a run that did not record its own."""

_CHECKPOINT_STEP = re.compile(r"checkpoint_(\d+)\.pt$")


def same_setting(a: Any, b: Any) -> bool:
    """Equal settings: numbers by value (1e-9 relative), lists element-wise, the rest as text
    (enum values are recorded as their names)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same_setting(x, y) for x, y in zip(a, b, strict=True))
    num = (int, float)
    if isinstance(a, num) and isinstance(b, num) and not isinstance(a, bool) \
            and not isinstance(b, bool):
        return abs(float(a) - float(b)) <= 1e-9 * max(abs(float(a)), abs(float(b)), 1.0)
    return str(a) == str(b)


def averaged_steps(result: dict[str, Any]) -> list[int] | None:
    """The steps of the checkpoints a run averaged: ``averaged_steps`` of results.json, else
    read from the ``checkpoint_<step>.pt`` names of ``checkpoints_averaged``; None when the
    decoded model is no average or a name carries no step."""
    steps = result.get("averaged_steps")
    if isinstance(steps, list):
        return [int(s) for s in steps]
    names = result.get("checkpoints_averaged")
    if not isinstance(names, list):
        return None
    out = []
    for name in names:
        m = _CHECKPOINT_STEP.search(str(name))
        if m is None:
            return None
        out.append(int(m.group(1)))
    return sorted(out)


def last_periodic_steps(max_steps: int, every: int, n: int) -> list[int]:
    """The steps of the last ``n`` periodic checkpoints (every ``every`` steps) of a run of
    ``max_steps`` steps: ``[k x every]`` for the ``n`` largest ``k x every <= max_steps``."""
    last = max_steps // every
    return [k * every for k in range(max(last - n + 1, 1), last + 1)]


def recipe_differences(result: dict[str, Any], preset: dict[str, Any]) -> list[str]:
    """Every recipe setting in which the run of ``result`` differs from ``preset``, each as
    one phrase naming the setting, the run's value and the preset's; [] = the run follows
    the preset's (the paper's) recipe.

    Args:
        result: a results.json dict with ``run_config`` (the checkpoint's whole resolved
            config), ``decode`` (the decode config), ``averaged_steps`` or
            ``checkpoints_averaged``, and ``train_summary`` (``steps`` trained,
            ``real_tokens_per_step``).
        preset: the preset's composed config as a plain dict (``model``, ``trainer``,
            ``data``, ``decode``, ``average``).

    The batch check takes the run's own ``trainer.tokens_per_step_tolerance`` around the
    preset's ``tokens_per_step``, on both sides, from the measured ``real_tokens_per_step``.
    """
    run = result.get("run_config")
    if not isinstance(run, dict):
        return [("the run's config not recorded (results.json written before nmt-evaluate "
                 "recorded it); evaluate the run again")]
    why: list[str] = []
    for group in ("model", "trainer", "data"):
        mine, theirs = run.get(group) or {}, preset.get(group) or {}
        for key in RECIPE_KEYS[group]:
            if key not in theirs:
                continue
            if key not in mine:
                why.append(f"{group}.{key} not recorded (the preset's {format_value(theirs[key])})")
            elif not same_setting(mine[key], theirs[key]):
                why.append(f"{group}.{key}={format_value(mine[key])}, "
                           f"the preset's {format_value(theirs[key])}")
    decode = result.get("decode") or {}
    for key in RECIPE_KEYS["decode"]:
        want = (preset.get("decode") or {}).get(key)
        if key not in decode:
            why.append(f"decode.{key} not recorded (the preset's {format_value(want)})")
        elif not same_setting(decode[key], want):
            why.append(f"decode.{key}={format_value(decode[key])}, "
                       f"the preset's {format_value(want)}")
    if str(decode.get("precision")) not in DECODE_PRECISIONS:
        why.append(f"decode.precision={format_value(decode.get('precision'))}, not "
                   f"{' or '.join(DECODE_PRECISIONS)}")

    t = preset.get("trainer") or {}
    max_steps = t.get("max_steps")
    steps = (result.get("train_summary") or {}).get("steps")
    if max_steps is not None and (steps is None or int(steps) != int(max_steps)):
        trained = "an unrecorded number of" if steps is None else f"{int(steps):,}"
        why.append(f"trained {trained} steps, not the preset's {int(max_steps):,}")
    n = int((preset.get("average") or {}).get("last") or 0)
    every = t.get("save_every_steps")
    if n and every and max_steps:
        want_steps = last_periodic_steps(int(max_steps), int(every), n)
        got = averaged_steps(result)
        if got != want_steps:
            shown = "no average" if got is None else f"steps {', '.join(map(str, got))}"
            why.append(f"averaged {shown}, not the last {n} periodic checkpoints (steps "
                       f"{', '.join(map(str, want_steps))})")

    target = t.get("tokens_per_step")
    if target is not None:
        tol = (run.get("trainer") or {}).get("tokens_per_step_tolerance")
        tol = DEFAULT_TOLERANCE if tol is None else float(tol)
        per_step = (result.get("train_summary") or {}).get("real_tokens_per_step") or {}
        if not per_step:
            why.append("real tokens per step not recorded (no train_summary.json)")
        for side, name in (("src", "source"), ("tgt", "target")):
            value = per_step.get(side)
            if value is not None and abs(float(value) / float(target) - 1) > tol:
                why.append(f"{float(value):,.0f} real {name} tokens per step, not "
                           f"{int(target):,} ± {tol:.0%} (the run's tolerance)")
    return why


def score_form(entry: dict[str, Any]) -> str | None:
    """The paper-BLEU form a score was computed with: its ``form``, else the one its
    signature names (``form:<name>``), else ``t2t-2018`` for a signature with the
    unicode-punctuation step (the default before the forms had names); None if unknown."""
    form = entry.get("form")
    if form:
        return str(form)
    sig = str(entry.get("signature") or "")
    m = re.search(r"(?:^|\|)form:([^|]+)", sig)
    if m:
        return m.group(1)
    if "replace-unicode-punctuation" in sig or "replace-unicode-punctuation" in str(
            entry.get("label") or ""):
        return "t2t-2018"
    return None


def paper_bleu_of_form(bleu: dict[str, Any], form: str) -> float | None:
    """The score of the paper-BLEU entry (``paper_bleu`` or ``paper_bleu:<form>``) of a test
    set's ``bleu`` dict that was computed in ``form``; None when none was."""
    for kind, entry in (bleu or {}).items():
        if (kind == "paper_bleu" or kind.startswith("paper_bleu:")) and isinstance(entry, dict) \
                and score_form(entry) == form and entry.get("score") is not None:
            return float(entry["score"])
    return None


def preset_for(result: dict[str, Any]) -> str:
    """The preset a Table 2 candidate is compared with: ``wmt14_<src>_<tgt>_<size>``."""
    data = result.get("data") or {}
    size = (result.get("model") or {}).get("name")
    return f"wmt14_{data.get('src_lang')}_{data.get('tgt_lang')}_{size}"
