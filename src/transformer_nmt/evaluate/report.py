"""``nmt-table``: the paper's tables rebuilt from every run's results.json.

Pipeline position: bleu -> **table**. Reads ``cfg.table.results_glob``
(``runs/**/results.json``, written by :mod:`transformer_nmt.evaluate.evaluate`) and writes
``cfg.table.output`` (``runs/results.md``; ``docs/results.md``, the committed page)
atomically, with the sections ``cfg.table.tables`` names:

* **Table 2** (paper section 6.1): newstest2014 BLEU, EN-DE and EN-FR, and training cost,
  for Transformer base and big; the paper's numbers beside ours. Runs qualify when their
  corpus is ``wmt14``, their model preset ``base`` or ``big``, they name no Table 3 row, and
  they followed the paper's whole recipe, setting by setting, as their preset has it
  (:func:`table2_exclusions`, :func:`transformer_nmt.evaluate.gate.recipe_differences`); the
  others are listed under Other runs with each difference.
* **Table 3** (paper section 6.2): the runs of Table 3 rows
  (:mod:`transformer_nmt.evaluate.table3`), one table per base experiment, each row beside the
  paper's line it varies (by ``table3.variant``; a run configured by hand: the line with the same
  setting), the seeds of one whole recipe averaged, and each row's BLEU difference to the base
  row beside the paper's (rows of other settings and short runs apart, with a note; the
  configured rows not run listed: :mod:`transformer_nmt.evaluate.table3_groups`). With
  ``table.table3_plot`` the differences are drawn too
  (:func:`transformer_nmt.plot.table3.plot_table3`).
* **Other runs** (Multi30k, custom corpora, ...): every test set's scores.

Every BLEU number is in a column or cell that names its kind. The paper's numbers are
tokenized BLEU; they are compared only with ours computed the same way (``paper_bleu`` in
results.json: tensor2tensor's ``get_ende_bleu.sh`` in its 2017 form for EN-DE, Moses
tokenizer + multi-bleu for EN-FR, see :mod:`transformer_nmt.evaluate.bleu`; the other forms
are in results.json as ``paper_bleu:<form>`` and listed with the signatures; the Multi30k
papers' form, ``paper_bleu:mmt``, has its own column in the per-test-set tables); sacreBLEU, our
headline, is shown beside it.
A results.json without ``paper_bleu`` (written before it existed) shows "–" there. Training
cost, in two columns named by their definitions: the paper's FLOPs are GPU time x sustained
single-precision TFLOPS of the GPUs; ours come from the run's train_summary.json (its
``flops`` field, model FLOPs of the tokens trained on).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from transformer_nmt.config import Config, to_plain
from transformer_nmt.evaluate.bleu import CASED_KIND
from transformer_nmt.evaluate.gate import paper_bleu_of_form, preset_for, recipe_differences
from transformer_nmt.evaluate.paper import (
    PAPER_TABLE2,
    PAPER_TABLE3,
    PAPER_TOKENS_PER_STEP,
    SETTING_KEYS,
    TABLE2_TEST_SET,
)
from transformer_nmt.evaluate.results_glob import find_results_files
from transformer_nmt.evaluate.table3_groups import (
    Table3Line,
    base_line,
    dev_split,
    is_table3_run,
    rows_not_run,
    run_setting,
    table3_lines,
)
from transformer_nmt.fileio import check_output, write_output
from transformer_nmt.run.results import (
    NATIVE,
    Results,
    ResultsError,
    TestSet,
    engine_results,
    format_value,
    read_results,
)

log = logging.getLogger(__name__)

TOK = "paper BLEU"
TOK_DE = "paper BLEU (t2t get_ende_bleu.sh, 2017 form)"
TOK_FR = "paper BLEU (Moses tokenizer, multi-bleu)"
SACRE = "sacreBLEU"
MMT = "Multi30k BLEU (mmt)"
PAPER_KIND = "paper_bleu"
"""results.json key of our BLEU computed the paper's way."""
MMT_KIND = "paper_bleu:mmt"
"""results.json key of the Multi30k papers' BLEU (lowercased, Moses-tokenized, multi-bleu -lc)."""


def load_results(pattern: str, skipped: list[tuple[str, str]] | None = None
                 ) -> list[dict[str, Any]]:
    """All results.json files matching ``pattern``, each real file once
    (:func:`find_results_files`), sorted by experiment name.

    Each is read and checked by :func:`transformer_nmt.run.results.read_results`, the
    check of every reader (a regular file only: never a FIFO or a device); a file that fails
    it is left out with one warning naming it and the field at fault, and the tables are built
    from the rest. Each dict returned carries its file (``_path``) and its typed record
    (``_record``, :class:`Results`); ``skipped`` gets ``(file, problem)`` of each file left
    out.
    """
    out = []
    for path in find_results_files(pattern):
        try:
            record = read_results(path)
        except ResultsError as e:
            log.warning("skipping %s", e)
            if skipped is not None:
                skipped.append((path, e.problem))
            continue
        out.append({**record.raw, "_path": path, "_record": record})
    return sorted(out, key=lambda r: (str(r.get("experiment")), r["_path"]))


def record(result: dict[str, Any]) -> Results:
    """The typed record of a results dict (:func:`load_results`'s, or one built by hand)."""
    found = result.get("_record")
    return found if isinstance(found, Results) else Results.parse(
        result, result.get("_path", "results.json"))


def _score(result: dict[str, Any], split: str, kind: str) -> float | None:
    test = record(result).test_sets.get(split)
    return None if test is None else test.score(kind)


LOWERCASED = "lowercased"
"""How a sacreBLEU cell marks a lowercased headline (a run on ``data.lowercase`` data)."""


def is_lowercased(test: TestSet | None) -> bool:
    """A test set whose headline sacreBLEU is lowercased (signature ``case:lc``)."""
    entry = test.bleu.get("sacrebleu") if test is not None else None
    return entry is not None and "case:lc" in entry.signature


def sacre_cell(test: TestSet | None, digits: int = 2) -> str:
    """A test set's headline sacreBLEU for a table cell; a lowercased one is marked, with its
    mixed-case score beside it: ``40.66 (lowercased; mixed case 8.02)``."""
    if test is None:
        return "–"
    text = format_value(test.score("sacrebleu"), digits)
    if not is_lowercased(test):
        return text
    cased = test.score(CASED_KIND)
    return f"{text} ({LOWERCASED}" + ("" if cased is None else
                                      f"; mixed case {cased:.{digits}f}") + ")"


LEGACY_MARK = " (†)"
LEGACY_NOTE = (
    "(†): a results.json written before nmt-evaluate scored against the official reference "
    "files: its sacreBLEU used the cleaned test files, and it has no paper BLEU."
)


def is_legacy(result: dict[str, Any]) -> bool:
    """True for results scored before ``paper_bleu`` and the official references existed."""
    tests = record(result).test_sets.values()
    return bool(tests) and not any(PAPER_KIND in t.bleu for t in tests)


def _name(result: dict[str, Any]) -> str:
    label = result.get("_label") or str(result["experiment"])
    return label + (LEGACY_MARK if is_legacy(result) else "")


def run_folder(result: dict[str, Any]) -> str:
    """The folder of a run's results.json, relative to the working directory when it lies
    under it (its recorded ``run_dir`` when the file's path is not known)."""
    if "_path" not in result:
        return str(result.get("run_dir") or "–")
    folder = Path(result["_path"]).parent
    with contextlib.suppress(ValueError, OSError):
        return str(folder.resolve().relative_to(Path.cwd().resolve()))
    return str(folder)


def label_runs(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``results`` with ``_label``, the name a row shows: the experiment's name, followed by
    the run folder (:func:`run_folder`) when another run outside Table 3 has the same name
    (two runs of one experiment in other run directories)."""
    names = Counter(str(r.get("experiment")) for r in results if not is_table3_run(r))
    return [{**r, "_label": f"{r['experiment']} ({run_folder(r)})"}
            if not is_table3_run(r) and names[str(r.get("experiment"))] > 1 else r
            for r in results]


def _fmt_e(x: float | None) -> str:
    return "–" if x is None else f"{x:.1e}"


def _cost(result: dict[str, Any]) -> tuple[float | None, float | None]:
    cost = result.get("training_cost") or {}
    return cost.get("flops"), cost.get("gpu_hours")


def _params(result: dict[str, Any]) -> str:
    p = (result.get("model") or {}).get("params")
    return "–" if p is None else f"{p / 1e6:.1f}M"


def md_line(text: Any) -> str:
    """``text`` on one markdown line: each line break (``\\n``, ``\\r``, U+2028, ...) a
    space, so that a name from a results file cannot start a heading, list or table row."""
    return " ".join(str(text).splitlines())


def md_cell(text: Any) -> str:
    """``text`` as one markdown table cell: on one line (:func:`md_line`), ``|`` escaped."""
    return md_line(text).replace("|", "\\|")


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(md_cell(cell) for cell in row) + " |" for row in rows]
    return lines


def is_table2_candidate(result: dict[str, Any]) -> bool:
    """WMT14 runs of the base or big preset (no Table 3 row): the runs that may enter
    Table 2 (:func:`table2_exclusions` says whether they do)."""
    return (
        (result.get("data") or {}).get("corpus") == "wmt14"
        and (result.get("model") or {}).get("name") in PAPER_TABLE2
        and not is_table3_run(result)
    )


TABLE2_FORMS = {"de": "t2t-2017", "fr": "moses"}
"""The paper-BLEU form of each Table 2 column (its label: TOK_DE, TOK_FR)."""


def preset_config(name: str) -> dict[str, Any] | None:
    """The composed config of ``experiment=<name>`` as a plain dict (a copy of its own);
    None when there is no such preset. Works inside a Hydra application (``nmt-table``) and
    outside it."""
    return copy.deepcopy(_preset_config(name))


@functools.cache
def _preset_config(name: str) -> dict[str, Any] | None:
    import os

    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    package = Path(__file__).resolve().parents[1]
    folders = [Path(os.environ["NMT_CONFIG_DIR"])] if os.environ.get("NMT_CONFIG_DIR") else []
    folders += [package / "configs", package.parents[1] / "configs"]  # as the entry points
    folder = next((f for f in folders if (f / "config.yaml").is_file()), None)
    if folder is None or not (folder / "experiment" / f"{name}.yaml").is_file():
        return None
    overrides = [f"experiment={name}"]
    if GlobalHydra.instance().is_initialized():  # inside nmt-table: its own config folder
        return to_plain(compose(config_name="config", overrides=overrides))
    with initialize_config_dir(config_dir=str(folder), version_base="1.3"):
        return to_plain(compose(config_name="config", overrides=overrides))


def table2_exclusions(result: dict[str, Any], preset: dict[str, Any] | None = None) -> list[str]:
    """Why a Table 2 candidate is not comparable with the paper's row ([] = it is): each
    recipe setting in which it differs from its preset ``wmt14_<src>_<tgt>_<size>``
    (:func:`transformer_nmt.evaluate.gate.recipe_differences`: model, dropout, label
    smoothing, optimizer, schedule, exact steps, the last N periodic checkpoints averaged,
    vocabulary and data, the measured batch within the run's own tolerance, decoding).

    Args:
        preset: the preset's plain config; None composes it (:func:`preset_config`).
    """
    if preset is None:
        preset = preset_config(preset_for(result))
        if preset is None:
            return [f"no preset {preset_for(result)} to compare the recipe with"]
    return recipe_differences(result, preset)


def is_table2_run(result: dict[str, Any]) -> bool:
    """A run that enters Table 2: a candidate (:func:`is_table2_candidate`) with no
    exclusion (:func:`table2_exclusions`)."""
    return is_table2_candidate(result) and not table2_exclusions(result)


COST_PAPER = "training cost: GPU time x sustained TFLOPS (FLOPs, the paper's)"
COST_OURS = "training cost: 6 x weights x tokens + attention (FLOPs, ours)"


def _paper_cost(p: dict[str, Any]) -> str:
    if p["cost_de"] == p["cost_fr"]:
        return _fmt_e(p["cost_de"])
    return f"EN-DE {_fmt_e(p['cost_de'])}, EN-FR {_fmt_e(p['cost_fr'])}"


def table2_section(results: list[dict[str, Any]]) -> list[str]:
    """Markdown lines of the Table 2 section (paper rows always, ours when comparable:
    :func:`is_table2_run`)."""
    header = [
        "model", f"EN-DE {TOK_DE}", f"EN-DE {SACRE}", f"EN-FR {TOK_FR}",
        f"EN-FR {SACRE}", COST_PAPER, COST_OURS, "GPU-hours",
    ]
    rows = []
    for size in ("base", "big"):
        p = PAPER_TABLE2[size]
        rows.append([f"Transformer ({size}), paper", format_value(p["de"], 1), "–",
                     format_value(p["fr"], 1), "–", _paper_cost(p), "–", "–"])
        for r in results:
            if not is_table2_run(r) or r["model"]["name"] != size:
                continue
            tgt = r["data"]["tgt_lang"]
            flops, hours = _cost(r)
            bleu = ((r.get("test_sets") or {}).get(TABLE2_TEST_SET) or {}).get("bleu") or {}
            tok = format_value(paper_bleu_of_form(bleu, TABLE2_FORMS.get(tgt, "moses")), 1)
            sacre = sacre_cell(record(r).test_sets.get(TABLE2_TEST_SET), 1)
            de = tgt == "de"
            rows.append([
                f"Transformer ({size}), ours: {_name(r)}",
                tok if de else "–", sacre if de else "–",
                "–" if de else tok, "–" if de else sacre,
                "–", _fmt_e(flops), format_value(hours, 1),
            ])
    return [
        "## Table 2: newstest2014 (full, 3,003 sentences)",
        "",
        "The paper's numbers are tokenized BLEU; beside them only ours computed the same way:",
        f"{TOK_DE} (hypothesis through Moses tokenizer -l de, reference with German quotes",
        "as &quot;, ##AT## compound split, multi-bleu; the 2018 form, with",
        "replace-unicode-punctuation on the hypothesis first, is `paper_bleu:t2t-2018` in",
        "results.json, see docs/paper_bleu.md) and",
        f"{TOK_FR}. {SACRE} (detokenized, 13a, mixed case, against the official reference)",
        "is our headline; the paper has no such number.",
        *([LEGACY_NOTE] if any(is_table2_run(r) and is_legacy(r) for r in results) else []),
        "A run of ours enters the table only when it followed its preset's whole recipe: model",
        "dimensions, dropout, label smoothing, optimizer, schedule, exactly the paper's steps",
        "(100k base, 300k big), the last 5 (base) / 20 (big) periodic checkpoints averaged,",
        f"the vocabulary and the full data, {PAPER_TOKENS_PER_STEP:,} real source and target",
        "tokens per step (measured, within the run's own tolerance), and decoding with beam 4,",
        "α 0.6, maximum length source + 50, by our engine in fp32 or bf16; a paper-BLEU cell",
        "shows only a score computed in the column's form. The others are under Other runs",
        "with each difference. The two cost columns are two",
        "definitions: the paper's is training time x GPUs x the GPUs' sustained single-precision",
        "TFLOPS; ours is the `flops` of the run's train_summary.json (model FLOPs counted from",
        "the tokens it trained on, transformer_nmt.model.flops), not comparable with the paper's.",
        "",
        *_table(header, rows),
        "",
    ]


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, None
    return mean, (sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5


def _fmt_ms(mean: float | None, std: float | None, digits: int) -> str:
    if mean is None:
        return "–"
    return f"{mean:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")


def _fmt_delta(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:+.{digits}f}"


def _setting_text(r: dict[str, Any]) -> str:
    run = run_setting(r)
    if run is None:
        return "–"
    return ", ".join(f"{run[k]:g}" if isinstance(run[k], float) else str(run[k])
                     for k in SETTING_KEYS)


def _table3_row(x: Table3Line, base: Table3Line | None) -> list[str]:
    p, r0 = x.paper, x.runs[0]
    bleu, std = _mean_std(x.values(PAPER_KIND))
    ppl, ppl_std = _mean_std(x.values("ppl"))
    sacre, sacre_std = _mean_std(x.values("sacrebleu"))
    base_bleu = _mean_std(base.values(PAPER_KIND))[0] if base else None
    delta = (bleu - base_bleu if x.compared and bleu is not None and base_bleu is not None
             else None)
    base_paper = PAPER_TABLE3["base"]
    return [
        p.row if p else str(r0.get("table3_row") or "–"), p.change if p else x.variant,
        _setting_text(r0), str(len(x.runs)), str(r0.get("steps", "–")), _params(r0),
        f"{p.params:g}M" if p and p.params else "–",
        _fmt_ms(ppl, ppl_std, 2), format_value(p.ppl, 2) if p else "–",
        _fmt_ms(bleu, std, 2),
        _fmt_ms(sacre, sacre_std, 2) + (f" ({LOWERCASED})" if sacre is not None and any(
            is_lowercased(record(r).test_sets.get(dev_split(r) or "")) for r in x.runs)
            else ""),
        format_value(p.bleu, 1) if p else "–",
        "0 (base)" if x.is_base else _fmt_delta(delta, 2),
        "0 (base)" if p is base_paper
        else (_fmt_delta(p.bleu - base_paper.bleu) if p else "–"),
        x.note(),
    ]


def table3_section(results: list[dict[str, Any]]) -> list[str]:
    """Markdown lines of the Table 3 section (empty when no run names a Table 3 row): per
    base experiment, its rows (:func:`transformer_nmt.evaluate.table3_groups.table3_lines`),
    the seed noise of the base row, the configured rows not run, and results left out as
    repeats of a seed."""
    groups = table3_lines(results)
    if not groups:
        return []
    out = [
        "## Table 3: variations on the base model (EN-DE)",
        "",
        f"Paper: newstest2013, beam search without checkpoint averaging, {TOK} and perplexity",
        "per word-piece on the development set. Ours: the same way on the experiment's",
        "development set (its last checkpoint, no averaging): the last validation perplexity",
        f"(per SentencePiece piece), {TOK} and {SACRE}. Δ: the row's BLEU ({TOK}) minus its",
        "base row's; with several seeds a cell is mean ± standard deviation over the seeds, and",
        "the base row's deviation is the seed noise each Δ is to be read against. Setting: N,",
        "d_model, d_ff, h, d_k, d_v, P_drop, ε_ls, positions.",
        "Runs are seeds of one row only when their whole recipe is equal (model, dropout, label",
        "smoothing, optimizer, schedule, steps, batch, data, vocabulary, decoding; not the seed,",
        "paths, logging or workers). Δ compares a row with the base row only when its recipe is",
        "exactly what its change makes of the base recipe; a row of other settings, or one whose",
        "training stopped before its step target (short), is listed with a note and left out of",
        "Δ and of the seed noise.",
        "",
    ]
    header = ["row", "change (paper)", "setting (ours)", "seeds", "steps", "params (ours)",
              "params (paper)", "PPL (ours)", "PPL (paper)", f"{TOK} (ours)", f"{SACRE} (ours)",
              f"{TOK} (paper)", "Δ (ours)", "Δ (paper)", "note"]
    for exp, lines in groups.items():
        base = base_line(lines)
        base_std = _mean_std(base.values(PAPER_KIND))[1] if base else None
        splits = sorted({dev_split(r) or "–" for x in lines for r in x.runs})
        rows = [_table3_row(x, base) for x in lines]
        noise = "" if base_std is None else f"; seed noise of the base row: ± {base_std:.2f} BLEU"
        missing = rows_not_run(lines)
        repeats = [p for x in lines for p in x.repeats]
        out += [md_line(f"### {exp} (dev set: {', '.join(splits)}{noise})"), "",
                *_table(header, rows), ""]
        if base is None:
            out += ["No base row trained to its step target: no Δ.", ""]
        if missing:
            out += [md_line(f"Not run (no results.json): {', '.join(missing)}."), ""]
        if repeats:
            out += [md_line("Left out as older results of a seed already in its row: "
                            f"{', '.join(repeats)}."), ""]
    return out


def _per_test_set_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        data = r.get("data") or {}
        flops, hours = _cost(r)
        rec = record(r)
        for engine, part in engine_results(r).items():
            n_avg = part.get("num_checkpoints_averaged")
            tests = rec.test_sets if engine == NATIVE else rec.engines[engine]
            for split, test in tests.items():
                rows.append([
                    _name(r),
                    f"{data.get('name')} ({data.get('src_lang')}-{data.get('tgt_lang')})",
                    str((r.get("model") or {}).get("name")), _params(r),
                    str(part.get("steps", "–")), str(n_avg) if n_avg else "none",
                    _test_set_label(split, engine, test.raw.get("decode") or part.get("decode")),
                    format_value(test.score(PAPER_KIND), 2), format_value(test.score(MMT_KIND), 2),
                    sacre_cell(test),
                    format_value(test.score("chrf"), 2), format_value(hours, 2), _fmt_e(flops),
                ])
    return rows


ENGINE_LABELS = {"ctranslate2": "CTranslate2", "ctranslate2_int8": "CTranslate2 int8"}
"""How the table names a score decoded by another engine than ours (beside the test set)."""


def _test_set_label(split: str, engine: str, decode: Any) -> str:
    """The test-set cell: the split, with the engine that decoded it when not ours
    (``test (CTranslate2 int8)``), or our engine's precision when not fp32 (``test (int8)``,
    ``test (bf16)``)."""
    if engine != NATIVE:
        return f"{split} ({ENGINE_LABELS.get(engine, engine)})"
    precision = decode.get("precision") if isinstance(decode, dict) else None
    return split if precision in (None, "fp32") else f"{split} ({precision})"


_PER_TEST_SET_HEADER = [
    "run", "data", "model", "params", "steps", "checkpoints averaged", "test set",
    TOK, MMT, SACRE, "chrF", "GPU-hours", "FLOPs",
]
_PER_TEST_SET_LEGEND = (
    f"{TOK}: the paper's way (German targets: t2t get_ende_bleu.sh, 2017 form; others: Moses "
    f"tokenizer, multi-bleu); {MMT}: the Multi30k papers' way (lowercased, Moses "
    "normalize-punctuation and tokenizer, multi-bleu -lc; Elliott et al. 2016, Wu et al. 2021); "
    f"{SACRE}: detokenized, 13a, mixed case, official reference (a run on lowercased data, "
    "`data.lowercase`: lowercased, `case:lc`, marked (lowercased; mixed case X) with its "
    "mixed-case score beside it); chrF: sacreBLEU's chrF."
)
ENGINE_NOTE = (
    "A test set followed by (CTranslate2) was decoded by CTranslate2 (`decode.engine=ctranslate2`: "
    "fairseq length penalty, beam stopping), the others by our beam search."
)
PRECISION_NOTE = (
    "A test set followed by a precision (int8, bf16, fp16) was decoded by our beam search in that "
    "`decode.precision` (int8: the linear layers' weights in int8, on a CPU), the others in fp32."
)


def _engine_note(results: list[dict[str, Any]]) -> list[str]:
    """:data:`ENGINE_NOTE` when a row of ``results`` comes from another engine than ours, and
    :data:`PRECISION_NOTE` when one comes from ours in another precision than fp32."""
    notes = [ENGINE_NOTE] if any(set(engine_results(r)) - {NATIVE} for r in results) else []
    if any(_test_set_label("", NATIVE, t.raw.get("decode") or r.get("decode")) != ""
           for r in results for t in record(r).test_sets.values()):
        notes.append(PRECISION_NOTE)
    return notes


def table2_details_section(results: list[dict[str, Any]]) -> list[str]:
    """Every test set (newstest2014 full and filtered) of the Table 2 runs, all scores."""
    runs = [r for r in results if is_table2_run(r)]
    if not runs:
        return []
    return [
        "### Table 2 runs on every test set",
        "",
        _PER_TEST_SET_LEGEND,
        *_engine_note(runs),
        *([LEGACY_NOTE] if any(is_legacy(r) for r in runs) else []),
        "",
        *_table(_PER_TEST_SET_HEADER, _per_test_set_rows(runs)),
        "",
    ]


def others_section(results: list[dict[str, Any]]) -> list[str]:
    """Markdown lines for every run outside Tables 2 and 3, one row per test set."""
    others = [r for r in results if not is_table2_run(r) and not is_table3_run(r)]
    if not others:
        return []
    excluded = [md_line(f"- {_name(r)} ({r.get('_path', '–')}): "
                        + "; ".join(table2_exclusions(r)))
                for r in others if is_table2_candidate(r)]
    return [
        "## Other runs",
        "",
        _PER_TEST_SET_LEGEND,
        *_engine_note(others),
        *([LEGACY_NOTE] if any(is_legacy(r) for r in others) else []),
        "",
        *_table(_PER_TEST_SET_HEADER, _per_test_set_rows(others)),
        "",
        *(["WMT14 runs not in Table 2, and why:", "", *excluded, ""] if excluded else []),
    ]


def signatures_section(results: list[dict[str, Any]]) -> list[str]:
    """The distinct labels and signatures of every score in the tables."""
    seen: dict[tuple[str, str], None] = {}
    for r in results:
        rec = record(r)
        for test in [*rec.test_sets.values(),
                     *(t for e in rec.engines.values() for t in e.values())]:
            for entry in [*test.bleu.values(), test.chrf]:
                seen[(entry.label, entry.signature)] = None
    if not seen:
        return []
    return ["## Score signatures", "", *[md_line(f"- {label}: `{sig}`") for label, sig in seen], ""]


ELSEWHERE = [
    "## Measured elsewhere",
    "",
    "- docs/table3.md: Table 3 at CPU scale (Multi30k, the `tiny` model as the base row).",
    ("- docs/equal_work.md: fairseq's tiny Multi30k recipe trained by both toolkits, per-epoch "
     "loss, valid perplexity and sacreBLEU."),
    "- docs/benchmarks.md: training and decoding speed against fairseq and Marian.",
    "",
]
"""The closing section of results.md: the measurements that come from other commands."""


def build_report(results: list[dict[str, Any]],
                 tables: Iterable[str] = ("table2", "table3", "other")) -> str:
    """The whole results.md text, with the sections named in ``tables``."""
    tables = set(tables)
    results = label_runs(results)
    lines = [
        "# Results",
        "",
        "Built by `nmt-table` from "
        + (md_line(", ".join(sorted(r["_path"] for r in results if "_path" in r)))
           or "no results.json files")
        + ".",
        "",
        *(table2_section(results) if "table2" in tables else []),
        *(table2_details_section(results) if "table2" in tables else []),
        *(table3_section(results) if "table3" in tables else []),
        *(others_section(results) if "other" in tables else []),
        *signatures_section(results),
        *(ELSEWHERE if "table2" in tables else []),
    ]
    return "\n".join(lines).rstrip() + "\n"


def _kind_of_problem(problem: str) -> str:
    """A skipped file's problem without its values, to count files by it
    (``test_sets.x.bleu.sacrebleu.score is -50.0, outside 0 to 100`` -> ``outside 0 to 100``)."""
    if " is " in problem and ", " in problem:
        problem = problem.rsplit(", ", 1)[1]
    return problem.split(" (")[0]


def write_report(cfg: Config, results: list[dict[str, Any]] | None = None,
                 skipped: list[tuple[str, str]] | None = None) -> Path:
    """``nmt-table``: read ``cfg.table.results_glob`` (or take its ``results`` and the files
    ``skipped`` as :func:`load_results` gives them), write ``cfg.table.output``
    (:func:`transformer_nmt.fileio.write_output`: atomically for a regular file, in place for a
    FIFO or device, through symlinks; never over a results file or a model).

    Returns:
        The path written.
    """
    t = cfg.table
    out = Path(t.output)
    check_output(out, "table.output", inputs=find_results_files(t.results_glob))
    if results is None:
        skipped = []
        results = load_results(t.results_glob, skipped)
    skipped = skipped or []
    if not results and skipped:
        why = Counter(_kind_of_problem(problem) for _, problem in skipped)
        log.warning("%d results files match %s, and every one was skipped (%s; each named "
                    "above); writing the paper's numbers only", len(skipped), t.results_glob,
                    "; ".join(f"{kind}: {n} file{'s' * (n > 1)}" for kind, n in why.most_common()))
    elif not results:
        log.warning("no results files match %s; writing the paper's numbers only", t.results_glob)
    with write_output(out, what="table.output") as f:
        f.write(build_report(results, t.tables))
    log.info("wrote %s from %d results files", out, len(results))
    return out
