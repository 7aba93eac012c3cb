"""Train, average and evaluate named variants of one experiment, and tabulate them.

A sweep file (YAML) names the experiment, the splits to score and the variants, each a list of
Hydra overrides added to the experiment's own::

    experiment: multi30k_en_de
    splits: [valid, test_2016_flickr, test_2017_flickr]
    select_on: valid            # the split that picks the best variant
    variants:
      current: []
      dropout_0.1: [model.dropout=0.1]

Each variant trains in ``<out>/<variant>`` (default ``runs/sweep_<sweep file name>``) with
``nmt-prepare`` (a variant may change the data, e.g. its vocabulary size and name),
``nmt-train``, ``nmt-average`` and ``nmt-evaluate`` run one after the other in child
processes; a variant whose training reached its step limit and whose scores are recorded is
skipped, so an interrupted sweep resumes where it stopped (training resumes from its latest
checkpoint). The table (``<out>/results.md``, and ``<out>/sweep.json``) gives sacreBLEU per
split, the training wall time and steps, and marks the variant with the best sacreBLEU on
``select_on``: choose on the validation set, report the test sets.

    .venv/bin/python scripts/bench/sweep.py scripts/bench/sweeps/multi30k_en_de.yaml
    .venv/bin/python scripts/bench/sweep.py SWEEP.yaml --only current --args trainer.max_steps=100

Before anything runs, every variant's overrides are checked as the console scripts check
them (an unknown experiment or key, a bad value: one ``error:`` line naming the variant). A
variant's run folder records the overrides it is trained with (``sweep_overrides.json``); when
the sweep file has changed them since, the old run is moved aside (``<variant>.stale-<n>``) and
the variant trained again, and a variant not run in this call whose recorded overrides differ
from the file's is shown as stale, with the overrides it was trained with, and never marked
best. Ctrl-C lets the running stage stop as it does on its own (``nmt-train`` saves a
checkpoint) and then ends the sweep (exit 130); a second Ctrl-C kills the stage and exits at
once (130).

Exits 2 with one ``error:`` line for a bad sweep file, 1 when a stage fails (its command and
exit status are printed), 130 after Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

BIN = Path(sys.executable).parent
"""The folder of the nmt-* console scripts (``--bin``)."""
KEYS = ("experiment", "splits", "select_on", "variants")
"""The keys of a sweep file."""
OVERRIDES_FILE = "sweep_overrides.json"
"""In a variant's run folder: the overrides it is trained with, written before it starts."""


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def read_sweep(path: Path) -> dict[str, Any]:
    """The sweep file, checked: experiment (str), splits (non-empty list), select_on (one of
    the splits), variants (name -> list of override strings)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        _fail(f"cannot read the sweep file {path}: {getattr(e, 'strerror', None) or e}")
    try:
        spec = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        _fail(f"{path}{where}: not valid YAML: {e.problem or e.context}")
    except yaml.YAMLError as e:
        _fail(f"{path}: not valid YAML: {' '.join(str(e).split())}")
    if not isinstance(spec, dict):
        _fail(f"{path}: expected a mapping with experiment, splits, select_on, variants")
    unknown = [str(k) for k in spec if k not in KEYS]
    if unknown:
        _fail(f"{path}: unknown key {unknown[0]!r}; a sweep file's keys are "
              + ", ".join(KEYS))
    for key in ("experiment", "splits", "variants"):
        if key not in spec:
            _fail(f"{path}: no '{key}'")
    splits = spec["splits"]
    if not isinstance(splits, list) or not splits:
        _fail(f"{path}: splits must be a non-empty list, got {splits!r}")
    spec.setdefault("select_on", splits[0])
    if spec["select_on"] not in splits:
        _fail(f"{path}: select_on={spec['select_on']!r} is not one of the splits {splits}")
    variants = spec["variants"]
    if not isinstance(variants, dict) or not variants:
        _fail(f"{path}: variants must map names to lists of overrides")
    for name, overrides in variants.items():
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            _fail(f"{path}: variant {name!r} must be a list of overrides, got {overrides!r}")
        if "/" in str(name) or str(name).startswith("."):
            _fail(f"{path}: variant name {name!r} is not a folder name")
    return spec


class _Abort(Exception):
    """A second Ctrl-C: the stage is killed and the sweep exits 130."""


def _run(cmd: list[str]) -> float:
    """Run one stage; its wall seconds. Exits 1 naming the command when it fails.

    Ctrl-C reaches the stage too (one process group): the first lets it stop as it does on its
    own and then exits 130; a second kills it and exits 130 at once."""
    print("+ " + " ".join(cmd), flush=True)
    t = time.perf_counter()
    stage = Path(cmd[0]).name
    interrupts = 0
    proc = subprocess.Popen(cmd)

    def on_sigint(signum: int, frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            print(f"sweep: interrupted: waiting for {stage} to stop (press Ctrl-C again to "
                  "exit at once)", file=sys.stderr, flush=True)
            return
        print(f"sweep: interrupted again: stopping {stage} and exiting now", file=sys.stderr,
              flush=True)
        proc.kill()
        raise _Abort  # out of proc.wait(), which holds the lock a second wait needs

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        status = proc.wait()
    except _Abort:
        proc.wait()
        sys.exit(130)
    finally:
        signal.signal(signal.SIGINT, previous)
    if interrupts:
        print(f"sweep: interrupted: {stage} exited with {status}; run the sweep again to go on",
              file=sys.stderr)
        sys.exit(130)
    if status != 0:
        print(f"sweep: {' '.join(cmd[:2])} ... exited with {status}", file=sys.stderr)
        sys.exit(1)
    return time.perf_counter() - t


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _scores(run_dir: Path, splits: list[str]) -> dict[str, dict[str, float]] | None:
    """sacreBLEU (and chrF, the Multi30k papers' form when present) per split, or None when a
    split has no score in the run's results.json."""
    results = _read_json(run_dir / "results.json")
    if not results:
        return None
    out = {}
    for split in splits:
        entry = results.get("test_sets", {}).get(split)
        if not entry or "sacrebleu" not in entry.get("bleu", {}):
            return None
        bleu = entry["bleu"]
        out[split] = {"sacrebleu": bleu["sacrebleu"]["score"],
                      "chrf": entry.get("chrf", {}).get("score")}
        if "paper_bleu:mmt" in bleu:
            out[split]["mmt"] = bleu["paper_bleu:mmt"]["score"]
    return out


def variant_overrides(spec: dict[str, Any], name: str, run_dir: Path,
                      extra: list[str]) -> list[str]:
    """The overrides a variant is trained with: the experiment, its run folder, its own, the
    ``--args`` of this call."""
    return [f"experiment={spec['experiment']}", f"run_dir={run_dir}", *spec["variants"][name],
            *extra]


def check_variants(spec: dict[str, Any], path: Path, names: list[str], out: Path,
                   extra: list[str]) -> None:
    """Every variant's overrides composed and validated as the console scripts do, before
    anything runs; exits 2 with one line naming each variant at fault."""
    from transformer_nmt.cli import preflight_config

    errors = []
    for name in names:
        _, _, error = preflight_config(variant_overrides(spec, name, out / name, extra))
        if error is not None:
            errors.append(f"variant {name!r}: {error}")
    if errors:
        _fail(f"{path}: " + "; ".join(errors) + " (nothing was run)")


def _trained_with(run_dir: Path) -> list[str] | None:
    recorded = _read_json(run_dir / OVERRIDES_FILE)
    return recorded.get("overrides") if isinstance(recorded, dict) else None


def _record_overrides(run_dir: Path, overrides: list[str]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{OVERRIDES_FILE}.tmp"
    tmp.write_text(json.dumps({"overrides": overrides}), encoding="utf-8")
    os.replace(tmp, run_dir / OVERRIDES_FILE)


def _set_aside_if_changed(run_dir: Path, overrides: list[str], record: dict[str, Any]) -> None:
    """Move a run folder trained with other overrides to ``<name>.stale-<n>``, so that the
    variant is trained again from the start, never resumed with the sweep file's new ones (a
    folder of an older sweep without ``sweep_overrides.json``: those of its sweep.json
    record)."""
    if not run_dir.exists() or not any(run_dir.iterdir()):
        return
    before = _trained_with(run_dir) or record.get("overrides")
    if before == overrides:
        _record_overrides(run_dir, overrides)
        return
    n = 1
    while (stale := run_dir.with_name(f"{run_dir.name}.stale-{n}")).exists():
        n += 1
    os.replace(run_dir, stale)
    was = " ".join(before) if before is not None else "not recorded"
    print(f"sweep: {run_dir} was trained with other overrides ({was}); moved it to {stale} "
          f"and training again with {' '.join(overrides)}", file=sys.stderr, flush=True)


def run_variant(spec: dict[str, Any], name: str, run_dir: Path, extra: list[str],
                record: dict[str, Any]) -> dict[str, Any]:
    """Train, average and evaluate one variant (stages already done are skipped; a run folder
    trained with other overrides is set aside first)."""
    overrides = variant_overrides(spec, name, run_dir, extra)
    splits = spec["splits"]
    _set_aside_if_changed(run_dir, overrides, record)
    summary = _read_json(run_dir / "train_summary.json")
    done = (_trained_with(run_dir) == overrides and summary is not None
            and summary.get("stopped_by") == "max_steps"
            and _scores(run_dir, splits) is not None)
    if not done:
        _record_overrides(run_dir, overrides)
        _run([str(BIN / "nmt-prepare"), *overrides])  # each stage skipped when up to date
        _run([str(BIN / "nmt-train"), *overrides])
        _run([str(BIN / "nmt-average"), *overrides])
        _run([str(BIN / "nmt-evaluate"), *overrides,
              "data.test_splits=[" + ",".join(splits) + "]"])
        summary = _read_json(run_dir / "train_summary.json") or {}
    scores = _scores(run_dir, splits)
    if scores is None:
        print(f"sweep: {run_dir}/results.json lacks the scores of {splits}", file=sys.stderr)
        sys.exit(1)
    return {"overrides": overrides, "variant_overrides": list(spec["variants"][name]),
            "experiment": spec["experiment"], "steps": summary.get("steps"),
            "stopped_by": summary.get("stopped_by"),
            "train_seconds": summary.get("train_seconds"), "device": summary.get("device"),
            "scores": scores}


def is_stale(spec: dict[str, Any], name: str, record: dict[str, Any]) -> bool:
    """A recorded variant trained with other overrides or experiment than the sweep file now
    gives it (a record without them, of an older sweep.json: stale)."""
    return (record.get("variant_overrides") != spec["variants"][name]
            or record.get("experiment") != spec["experiment"])


def table(spec: dict[str, Any], rows: dict[str, dict[str, Any]]) -> str:
    """The sweep as a markdown table, each variant with the overrides it was trained with; the
    best sacreBLEU on ``select_on`` among the variants that are not stale
    (:func:`is_stale`) is marked; a stale one says so."""
    splits, sel = spec["splits"], spec["select_on"]
    current = [n for n in rows if not is_stale(spec, n, rows[n])]
    best = max(current, key=lambda n: rows[n]["scores"][sel]["sacrebleu"]) if current else None
    head = ["variant", "overrides", "steps", "train min"] + [f"{s} sacreBLEU" for s in splits]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    stale_names = []
    for name, r in rows.items():
        trained = r.get("variant_overrides", r["overrides"][2:])
        own = " ".join(trained) or "(the experiment as it is)"
        mins = "–" if r["train_seconds"] is None else f"{r['train_seconds'] / 60:.1f}"
        label = f"**{name}**" if name == best else name
        if name not in current:
            stale_names.append(name)
            label += " (stale: the sweep file now gives other overrides; run it again)"
        cells = [label, f"`{own}`", str(r["steps"]), mins]
        cells += [f"{r['scores'][s]['sacrebleu']:.2f}" for s in splits]
        lines.append("| " + " | ".join(cells) + " |")
    if stale_names:
        lines.append(f"\nStale (trained with the overrides shown, not the sweep file's; not "
                     f"compared): {', '.join(stale_names)}.")
    chosen = f"**{best}**" if best else "none (no variant trained with its current overrides)"
    note = (f"\nBest on {sel} (sacreBLEU): {chosen}. sacreBLEU: detokenized, 13a, mixed case, "
            "against the official references; train min: the training stage's wall time on "
            f"the machine that ran it ({next(iter(rows.values()))['device']}).\n") if rows else ""
    return (f"# Sweep of experiment={spec['experiment']}\n\n" + "\n".join(lines) + "\n" + note)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", type=Path, help="the sweep file (YAML)")
    p.add_argument("--out", type=Path, default=None,
                   help="folder of the variants' runs (default runs/sweep_<sweep file name>)")
    p.add_argument("--only", nargs="+", default=None, help="run only these variants")
    p.add_argument("--args", nargs="*", default=[],
                   help="overrides added to every variant (e.g. trainer.max_steps=100)")
    p.add_argument("--bin", type=Path, default=None,
                   help="folder of the nmt-* console scripts (default: beside this Python)")
    a = p.parse_args(argv)
    global BIN
    BIN = a.bin or BIN
    spec = read_sweep(a.sweep)
    names = list(spec["variants"])
    if a.only:
        unknown = [n for n in a.only if n not in spec["variants"]]
        if unknown:
            _fail(f"--only names no variant of {a.sweep}: {unknown} (variants: {names})")
        names = [n for n in names if n in a.only]
    out = a.out or Path("runs") / f"sweep_{a.sweep.stem}"
    check_variants(spec, a.sweep, names, out, list(a.args))
    out.mkdir(parents=True, exist_ok=True)
    store = out / "sweep.json"
    rows: dict[str, dict[str, Any]] = (_read_json(store) or {}).get("variants", {})
    rows = {n: r for n, r in rows.items() if n in spec["variants"]}
    for name in names:
        rows[name] = run_variant(spec, name, out / name, list(a.args), rows.get(name, {}))
        order = [n for n in spec["variants"] if n in rows]
        rows = {n: rows[n] for n in order}
        tmp = store.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"sweep": str(a.sweep), "variants": rows}, indent=1,
                                  allow_nan=False), encoding="utf-8")
        os.replace(tmp, store)
        md = out / "results.md"
        tmp = md.with_suffix(".md.tmp")
        tmp.write_text(table(spec, rows), encoding="utf-8")
        os.replace(tmp, md)
    print((out / "results.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()
