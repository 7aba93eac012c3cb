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

Exits 2 with one ``error:`` line for a bad sweep file, 1 when a stage fails (its command and
exit status are printed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

BIN = Path(sys.executable).parent


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def read_sweep(path: Path) -> dict[str, Any]:
    """The sweep file, checked: experiment (str), splits (non-empty list), select_on (one of
    the splits), variants (name -> list of override strings)."""
    try:
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        _fail(f"cannot read the sweep file {path}: {e}")
    if not isinstance(spec, dict):
        _fail(f"{path}: expected a mapping with experiment, splits, select_on, variants")
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


def _run(cmd: list[str]) -> float:
    """Run one stage; its wall seconds. Exits 1 naming the command when it fails."""
    print("+ " + " ".join(cmd), flush=True)
    t = time.perf_counter()
    status = subprocess.call(cmd)
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


def run_variant(spec: dict[str, Any], name: str, run_dir: Path, extra: list[str],
                record: dict[str, Any]) -> dict[str, Any]:
    """Train, average and evaluate one variant (stages already done are skipped)."""
    exp = spec["experiment"]
    overrides = [f"experiment={exp}", f"run_dir={run_dir}", *spec["variants"][name], *extra]
    splits = spec["splits"]
    summary = _read_json(run_dir / "train_summary.json")
    done = (record.get("overrides") == overrides and summary is not None
            and summary.get("stopped_by") == "max_steps"
            and _scores(run_dir, splits) is not None)
    if not done:
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
    return {"overrides": overrides, "steps": summary.get("steps"),
            "stopped_by": summary.get("stopped_by"),
            "train_seconds": summary.get("train_seconds"), "device": summary.get("device"),
            "scores": scores}


def table(spec: dict[str, Any], rows: dict[str, dict[str, Any]]) -> str:
    """The sweep as a markdown table; the best sacreBLEU on ``select_on`` is marked."""
    splits, sel = spec["splits"], spec["select_on"]
    best = max(rows, key=lambda n: rows[n]["scores"][sel]["sacrebleu"]) if rows else None
    head = ["variant", "overrides", "steps", "train min"] + [f"{s} sacreBLEU" for s in splits]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in rows.items():
        own = " ".join(spec["variants"][name]) or "(the experiment as it is)"
        mins = "–" if r["train_seconds"] is None else f"{r['train_seconds'] / 60:.1f}"
        cells = [f"**{name}**" if name == best else name, f"`{own}`", str(r["steps"]), mins]
        cells += [f"{r['scores'][s]['sacrebleu']:.2f}" for s in splits]
        lines.append("| " + " | ".join(cells) + " |")
    note = (f"\nBest on {sel} (sacreBLEU): **{best}**. sacreBLEU: detokenized, 13a, mixed case, "
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
    a = p.parse_args(argv)
    spec = read_sweep(a.sweep)
    names = list(spec["variants"])
    if a.only:
        unknown = [n for n in a.only if n not in spec["variants"]]
        if unknown:
            _fail(f"--only names no variant of {a.sweep}: {unknown} (variants: {names})")
        names = [n for n in names if n in a.only]
    out = a.out or Path("runs") / f"sweep_{a.sweep.stem}"
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
