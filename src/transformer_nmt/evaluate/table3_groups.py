"""Our Table 3's rows from results.json: which runs are seeds of one row, which row is the
base, which runs are compared with it, and which rows were not run.

A row of the table is every seed of one recipe (:func:`transformer_nmt.evaluate.identity.recipe`,
the whole resolved run minus the seed and harmless keys) of one Table 3 variant of one base
experiment. Runs of one variant with other settings (another step count, another d_model)
are separate rows, each labelled with the settings that differ. The base recipe is the base
row's recipe that most runs of the table follow (then the newest); a row is compared with it
(Δ) only when its recipe is exactly what its variant makes of the base recipe
(:func:`transformer_nmt.evaluate.identity.row_recipe`). A run whose training stopped before its
step target (:func:`transformer_nmt.evaluate.identity.shortfall`) is a row of its own, marked
short, and neither compared nor part of the seed noise. Two results of one recipe and one seed
are one run (the newest is kept).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformer_nmt.config import CONFIG_DIR
from transformer_nmt.evaluate.gate import same_setting
from transformer_nmt.evaluate.identity import (
    ROW_KEYS,
    differences,
    format_settings,
    recipe,
    recipe_key,
    row_recipe,
    short_text,
    shortfall,
)
from transformer_nmt.evaluate.paper import DEV_SET, PAPER_TABLE3, PaperRow
from transformer_nmt.evaluate.table3 import setting
from transformer_nmt.run.results import Results

log = logging.getLogger(__name__)


def _record(result: dict[str, Any]) -> Results:
    found = result.get("_record")
    return found if isinstance(found, Results) else Results.parse(
        result, result.get("_path", "results.json"))


def is_table3_run(result: dict[str, Any]) -> bool:
    """A run of a Table 3 row (``table3`` in results.json, or an older ``table3_row``)."""
    return bool(result.get("table3") or result.get("table3_row"))


def dev_split(result: dict[str, Any]) -> str | None:
    """The split a Table 3 run was scored on: the paper's development set when present,
    else the run's first test set (None: no test set)."""
    splits = list(_record(result).test_sets)
    return DEV_SET if DEV_SET in splits else (splits[0] if splits else None)


def run_setting(result: dict[str, Any]) -> dict[str, Any] | None:
    """A run's (N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, positions), as in Table 3.

    None when the encoder and decoder depths differ or the config is missing.
    """
    m = (result.get("model") or {}).get("config")
    if not m:
        return None
    return setting(m, (result.get("trainer") or {}).get("label_smoothing"))


def paper_table3_line(result: dict[str, Any]) -> PaperRow | None:
    """The paper's Table 3 line of a run: the row its ``table3.variant`` names, else the line
    with the same setting (a run configured by hand), else None."""
    variant = (result.get("table3") or {}).get("variant")
    if variant in PAPER_TABLE3:
        return PAPER_TABLE3[variant]
    run = run_setting(result)
    if run is None:
        return None
    for line in PAPER_TABLE3.values():
        if all(same_setting(run[k], v) for k, v in line.setting().items()):
            return line
    return None


def _seed(result: dict[str, Any]) -> Any:
    run = result.get("run_config")
    if isinstance(run, dict) and (run.get("trainer") or {}).get("seed") is not None:
        return run["trainer"]["seed"]
    return (result.get("table3") or {}).get("seed")


def _row_config(result: dict[str, Any]) -> dict[str, Any] | None:
    run = result.get("run_config")
    return run.get("table3") if isinstance(run, dict) else None


@dataclass
class Table3Line:
    """One row of our Table 3: the seeds of one recipe of one variant of one base experiment."""

    experiment: str
    variant: str
    paper: PaperRow | None
    runs: list[dict[str, Any]] = field(default_factory=list)
    short: dict[str, Any] | None = None
    """Its training stopped before the step target (:func:`identity.stopped_short`)."""
    differs: dict[str, Any] = field(default_factory=dict)
    """Its settings that differ from what its variant makes of the base recipe."""
    is_base: bool = False
    """The base recipe's row: zero of Δ, its seeds' deviation the seed noise."""
    compared: bool = False
    """It follows the base recipe: its Δ is computed."""
    repeats: list[str] = field(default_factory=list)
    """results.json left out: a seed already in the row (an older result of it)."""

    def add(self, result: dict[str, Any]) -> None:
        """Add a run; a second result of a seed already in the row keeps the newer one."""
        seed = _seed(result)
        for i, other in enumerate(self.runs):
            if seed is not None and _seed(other) == seed:
                older, self.runs[i] = sorted(
                    (other, result), key=lambda r: str(r.get("date") or ""))
                self.repeats.append(str(older.get("_path", "results.json")))
                return
        self.runs.append(result)

    def values(self, kind: str) -> list[float]:
        """BLEU (``paper_bleu`` / ``sacrebleu``) or ``ppl`` of every seed that has it."""
        out = []
        for r in self.runs:
            if kind == "ppl":
                summary = _record(r).train_summary
                x = summary.valid_ppl if summary is not None else None
            else:
                split = dev_split(r)
                test = _record(r).test_sets.get(split) if split else None
                x = test.score(kind) if test is not None else None
            if x is not None:
                out.append(float(x))
        return out

    def note(self) -> str:
        """Why the row is not compared with the base row ("" when it is, or when there is no
        base row)."""
        if self.short is not None:
            return f"{short_text(self.short)}; not in Δ or the seed noise"
        if self.differs:
            return ("other settings than the base recipe gives this row: "
                    f"{format_settings(self.differs)}; not in Δ")
        return ""

    def newest(self) -> str:
        return max((str(r.get("date") or "") for r in self.runs), default="")


def _expected(line: Table3Line, base: Table3Line) -> tuple[dict[str, Any], tuple[str, ...]]:
    """What ``line``'s variant makes of ``base``'s recipe, and the keys left out of the
    comparison (a run that recorded no row config: the keys any row may change)."""
    base_recipe = recipe(base.runs[0])
    if line.variant == "base":
        return base_recipe, ()
    expected = row_recipe(base_recipe, _row_config(line.runs[0]))
    return (base_recipe, ROW_KEYS) if expected is None else (expected, ())


def _follows(line: Table3Line, base: Table3Line) -> dict[str, Any]:
    """The settings of ``line`` that differ from what its variant makes of ``base``'s recipe."""
    if line is base:
        return {}
    expected, ignore = _expected(line, base)
    return differences(recipe(line.runs[0]), expected, ignore)


def _choose_base(lines: list[Table3Line]) -> Table3Line | None:
    """The base recipe's row: of the complete base rows, the one most runs follow, then the
    newest."""
    candidates = [x for x in lines if x.variant == "base" and x.short is None]
    if not candidates:
        return None

    def followers(base: Table3Line) -> int:
        return sum(len(x.runs) for x in lines if x.short is None and not _follows(x, base))

    return max(candidates, key=lambda b: (followers(b), b.newest()))


def _group(experiment: str, runs: list[dict[str, Any]]) -> list[Table3Line]:
    lines: dict[tuple[Any, ...], Table3Line] = {}
    for r in runs:
        paper = paper_table3_line(r)
        variant = (r.get("table3") or {}).get("variant") or (
            paper.variant if paper else str(r.get("experiment")))
        short = shortfall(r)
        key = (variant, recipe_key(recipe(r)),
               None if short is None else str(r.get("_path", id(r))))
        if key not in lines:
            lines[key] = Table3Line(experiment, variant, paper, short=short)
        lines[key].add(r)
    out = list(lines.values())
    base = _choose_base(out)
    for x in out:
        x.is_base = x is base
        if x.short is None and base is not None:
            x.differs = _follows(x, base)
            x.compared = not x.differs
    order = {v: i for i, v in enumerate(PAPER_TABLE3)}
    return sorted(out, key=lambda x: (order.get(x.variant, len(order)), x.variant,
                                      x.short is not None, not x.compared,
                                      format_settings(x.differs)))


def table3_lines(results: list[dict[str, Any]]) -> dict[str, list[Table3Line]]:
    """Table 3 runs grouped by base experiment, then into rows (the module's rules), in the
    paper's order: each variant's compared row first, then its rows of other settings, then
    its short runs."""
    by_experiment: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        if is_table3_run(r):
            by_experiment.setdefault(str(r.get("experiment")), []).append(r)
    return {exp: _group(exp, runs) for exp, runs in sorted(by_experiment.items())}


def base_line(lines: list[Table3Line]) -> Table3Line | None:
    """The base recipe's row of a group (:func:`table3_lines`), if one was run to its end."""
    return next((x for x in lines if x.is_base), None)


def configured_rows(config_dir: str | Path | None = None) -> list[str]:
    """Every row of the ``table3`` config group (``configs/table3/<row>.yaml``), the paper's
    first in its order."""
    if config_dir is None:
        config_dir = CONFIG_DIR
    names = sorted(p.stem for p in (Path(config_dir) / "table3").glob("*.yaml"))
    order = {v: i for i, v in enumerate(PAPER_TABLE3)}
    return sorted(names, key=lambda v: (order.get(v, len(order)), v))


def rows_not_run(lines: list[Table3Line], config_dir: str | Path | None = None) -> list[str]:
    """The configured rows (:func:`configured_rows`) with no results.json among ``lines``."""
    done = {x.variant for x in lines}
    return [row for row in configured_rows(config_dir) if row not in done]


def table3_figures(results: list[dict[str, Any]], plot: str | Path
                   ) -> list[tuple[str, list[Table3Line], Path]]:
    """The Table 3 figures ``table.table3_plot`` asks for: one per experiment with a base row
    trained to its step target, as ``(experiment, the rows compared, path)``; the path gets
    ``_<experiment>`` before its suffix when there are several. An experiment without such a
    base row is left out, with a warning."""
    figures = []
    groups = table3_lines(results)
    for exp, lines in groups.items():
        path = Path(plot)
        if len(groups) > 1:
            path = path.with_name(f"{path.stem}_{exp}{path.suffix}")
        if base_line(lines) is None:
            log.warning("%s: no base row trained to its step target; %s not drawn", exp, path)
            continue
        figures.append((exp, [x for x in lines if x.compared], path))
    return figures
