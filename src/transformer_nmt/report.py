"""``nmt-table``: the paper's tables rebuilt from every run's results.json.

Pipeline position: bleu -> **table**. Reads ``cfg.results_glob`` (``runs/*/results.json``,
written by :mod:`transformer_nmt.evaluate`) and writes ``cfg.table_output``
(``docs/results.md``) atomically, with three sections:

* **Table 2** (paper section 6.1): newstest2014 BLEU, EN-DE and EN-FR, and training cost,
  for Transformer base and big; the paper's numbers beside ours. Runs qualify when their
  corpus is ``wmt14``, their model preset ``base`` or ``big`` and they name no Table 3 row.
* **Table 3** (paper section 6.2): variant runs (``table3_row`` A-E, or base/big), each
  matched to the paper line with the same N, d_model, d_ff, h, d_k, d_v, P_drop,
  epsilon_ls and positional encoding.
* **Other runs** (Multi30k, custom corpora, ...): every test set's scores.

Every BLEU number is in a column or cell that names its kind. The paper's numbers are
tokenized BLEU; they are compared only with ours computed the same way (``paper_bleu`` in
results.json: tensor2tensor's ``get_ende_bleu.sh`` for EN-DE, Moses tokenizer + multi-bleu
for EN-FR, see :mod:`transformer_nmt.bleu`); sacreBLEU, our headline, is shown beside it.
A results.json without ``paper_bleu`` (written before it existed) shows "–" there. Training cost: the paper's FLOPs are GPU time x sustained single-precision
TFLOPS of the GPUs; ours come from the run's train_summary.json (its ``flops`` field).
"""

from __future__ import annotations

import glob
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from transformer_nmt.config import Config
from transformer_nmt.fileio import atomic_write

log = logging.getLogger(__name__)

# Paper Table 2 (newstest2014): tokenized BLEU and training cost in FLOPs.
PAPER_TABLE2 = {
    "base": {"de": 27.3, "fr": 38.1, "cost_de": 3.3e18, "cost_fr": 3.3e18},
    "big": {"de": 28.4, "fr": 41.8, "cost_de": 2.3e19, "cost_fr": 2.3e19},
}
TABLE2_TEST_SET = "newstest2014"

# Paper Table 3 (EN-DE newstest2013, no checkpoint averaging): row, change, the full
# (N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, positions) setting, PPL, BLEU, params (M).
_BASE = {"N": 6, "d_model": 512, "d_ff": 2048, "h": 8, "d_k": 64, "d_v": 64,
         "P_drop": 0.1, "eps_ls": 0.1, "positions": "sinusoidal"}


def _setting(**changes: Any) -> dict[str, Any]:
    return {**_BASE, **changes}


PAPER_TABLE3: list[tuple[str, str, dict[str, Any], float, float, float | None]] = [
    ("base", "base model", _setting(), 4.92, 25.8, 65),
    ("A", "h=1, d_k=d_v=512", _setting(h=1, d_k=512, d_v=512), 5.29, 24.9, None),
    ("A", "h=4, d_k=d_v=128", _setting(h=4, d_k=128, d_v=128), 5.00, 25.5, None),
    ("A", "h=16, d_k=d_v=32", _setting(h=16, d_k=32, d_v=32), 4.91, 25.8, None),
    ("A", "h=32, d_k=d_v=16", _setting(h=32, d_k=16, d_v=16), 5.01, 25.4, None),
    ("B", "d_k=16", _setting(d_k=16), 5.16, 25.1, 58),
    ("B", "d_k=32", _setting(d_k=32), 5.01, 25.4, 60),
    ("C", "N=2", _setting(N=2), 6.11, 23.7, 36),
    ("C", "N=4", _setting(N=4), 5.19, 25.3, 50),
    ("C", "N=8", _setting(N=8), 4.88, 25.5, 80),
    ("C", "d_model=256, d_k=d_v=32", _setting(d_model=256, d_k=32, d_v=32), 5.75, 24.5, 28),
    ("C", "d_model=1024, d_k=d_v=128", _setting(d_model=1024, d_k=128, d_v=128), 4.66, 26.0, 168),
    ("C", "d_ff=1024", _setting(d_ff=1024), 5.12, 25.4, 53),
    ("C", "d_ff=4096", _setting(d_ff=4096), 4.75, 26.2, 90),
    ("D", "P_drop=0.0", _setting(P_drop=0.0), 5.77, 24.6, None),
    ("D", "P_drop=0.2", _setting(P_drop=0.2), 4.95, 25.5, None),
    ("D", "eps_ls=0.0", _setting(eps_ls=0.0), 4.67, 25.3, None),
    ("D", "eps_ls=0.2", _setting(eps_ls=0.2), 5.47, 25.7, None),
    ("E", "learned positional embedding", _setting(positions="learned"), 4.92, 25.7, None),
    ("big", "big model", _setting(d_model=1024, d_ff=4096, h=16, P_drop=0.3), 4.33, 26.4, 213),
]
TABLE3_TEST_SET = "newstest2013"

TOK = "paper BLEU"
TOK_DE = "paper BLEU (t2t get_ende_bleu.sh)"
TOK_FR = "paper BLEU (Moses tokenizer, multi-bleu)"
SACRE = "sacreBLEU"
PAPER_KIND = "paper_bleu"
"""results.json key of our BLEU computed the paper's way."""


def load_results(pattern: str) -> list[dict[str, Any]]:
    """All results.json files matching ``pattern``, sorted by experiment name.

    Raises:
        ValueError: naming a file that is not valid JSON.
    """
    out = []
    for path in sorted(glob.glob(pattern)):
        try:
            result = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from e
        result["_path"] = path
        out.append(result)
    return sorted(out, key=lambda r: (str(r.get("experiment")), r["_path"]))


def run_setting(result: dict[str, Any]) -> dict[str, Any] | None:
    """A run's (N, d_model, d_ff, h, d_k, d_v, P_drop, eps_ls, positions), as in Table 3.

    None when the encoder and decoder depths differ or the config is missing.
    """
    m = (result.get("model") or {}).get("config")
    if not m or m.get("encoder_layers") != m.get("decoder_layers"):
        return None
    heads, d_model = m["heads"], m["d_model"]
    return {
        "N": m["encoder_layers"], "d_model": d_model, "d_ff": m["d_ff"], "h": heads,
        "d_k": m.get("d_k") or d_model // heads, "d_v": m.get("d_v") or d_model // heads,
        "P_drop": float(m.get("dropout", 0.1)),
        "eps_ls": float((result.get("trainer") or {}).get("label_smoothing") or 0.0),
        "positions": m.get("positions", "sinusoidal"),
    }


def paper_table3_line(result: dict[str, Any]):
    """The paper's Table 3 line with the same setting as the run, or None."""
    setting = run_setting(result)
    if setting is None:
        return None
    for line in PAPER_TABLE3:
        if all(_same(setting[k], line[2][k]) for k in _BASE):
            return line
    return None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return abs(float(a) - float(b)) < 1e-9
    return a == b


def _score(result: dict[str, Any], split: str, kind: str) -> float | None:
    test = (result.get("test_sets") or {}).get(split)
    if not test:
        return None
    entry = test["chrf"] if kind == "chrf" else test["bleu"].get(kind)
    return None if entry is None else float(entry["score"])


LEGACY_MARK = " (†)"
LEGACY_NOTE = (
    "(†): a results.json written before nmt-evaluate scored against the official reference "
    "files: its sacreBLEU used the cleaned test files, and it has no paper BLEU."
)


def is_legacy(result: dict[str, Any]) -> bool:
    """True for results scored before ``paper_bleu`` and the official references existed."""
    tests = (result.get("test_sets") or {}).values()
    return bool(tests) and not any(PAPER_KIND in (t.get("bleu") or {}) for t in tests)


def _name(result: dict[str, Any]) -> str:
    return str(result["experiment"]) + (LEGACY_MARK if is_legacy(result) else "")


def _fmt(x: float | None, digits: int = 1) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _fmt_e(x: float | None) -> str:
    return "–" if x is None else f"{x:.1e}"


def _cost(result: dict[str, Any]) -> tuple[float | None, float | None]:
    cost = result.get("training_cost") or {}
    return cost.get("flops"), cost.get("gpu_hours")


def _params(result: dict[str, Any]) -> str:
    p = (result.get("model") or {}).get("params")
    return "–" if p is None else f"{p / 1e6:.1f}M"


def _table(header: list[str], rows: Iterable[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def is_table2_run(result: dict[str, Any]) -> bool:
    """WMT14 runs of the base or big preset that reproduce Table 2 (no Table 3 row)."""
    return (
        (result.get("data") or {}).get("corpus") == "wmt14"
        and (result.get("model") or {}).get("name") in PAPER_TABLE2
        and not result.get("table3_row")
    )


def table2_section(results: list[dict[str, Any]]) -> list[str]:
    """Markdown lines of the Table 2 section (paper rows always, ours when present)."""
    header = [
        "model", f"EN-DE {TOK_DE}", f"EN-DE {SACRE}", f"EN-FR {TOK_FR}",
        f"EN-FR {SACRE}", "training cost EN-DE (FLOPs)", "EN-FR (FLOPs)", "GPU-hours",
    ]
    rows = []
    for size in ("base", "big"):
        p = PAPER_TABLE2[size]
        rows.append([f"Transformer ({size}), paper", _fmt(p["de"]), "–", _fmt(p["fr"]), "–",
                     _fmt_e(p["cost_de"]), _fmt_e(p["cost_fr"]), "–"])
        for r in results:
            if not is_table2_run(r) or r["model"]["name"] != size:
                continue
            tgt = r["data"]["tgt_lang"]
            flops, hours = _cost(r)
            tok = _fmt(_score(r, TABLE2_TEST_SET, PAPER_KIND))
            sacre = _fmt(_score(r, TABLE2_TEST_SET, "sacrebleu"))
            de = tgt == "de"
            rows.append([
                f"Transformer ({size}), ours: {_name(r)}",
                tok if de else "–", sacre if de else "–",
                "–" if de else tok, "–" if de else sacre,
                _fmt_e(flops) if de else "–", "–" if de else _fmt_e(flops), _fmt(hours),
            ])
    return [
        "## Table 2: newstest2014 (full, 3,003 sentences)",
        "",
        "The paper's numbers are tokenized BLEU; beside them only ours computed the same way:",
        f"{TOK_DE} (hypothesis through Moses replace-unicode-punctuation and tokenizer -l de,",
        "reference with German quotes as &quot;, ##AT## compound split, multi-bleu) and",
        f"{TOK_FR}. {SACRE} (detokenized, 13a, mixed case, against the official reference)",
        "is our headline; the paper has no such number.",
        *([LEGACY_NOTE] if any(is_table2_run(r) and is_legacy(r) for r in results) else []),
        "Paper cost = training time x GPUs x sustained TFLOPS; ours = the `flops` of the run's",
        "train_summary.json (6 x parameters x tokens).",
        "",
        *_table(header, rows),
        "",
    ]


def table3_section(results: list[dict[str, Any]]) -> list[str]:
    """Markdown lines of the Table 3 section (empty when no run names a Table 3 row)."""
    variants = [r for r in results if r.get("table3_row")]
    if not variants:
        return []
    header = [
        "row", "run", "change from base", "params", "PPL (dev, ours)",
        f"{TOK} (ours)", f"{SACRE} (ours)", "test set (ours)",
        "PPL (paper)", f"{TOK} (paper, newstest2013)", "params (paper)",
    ]
    rows = []
    for r in sorted(variants, key=lambda r: (str(r["table3_row"]), r["experiment"])):
        line = paper_table3_line(r)
        splits = list(r.get("test_sets") or {})
        split = TABLE3_TEST_SET if TABLE3_TEST_SET in splits else (splits[0] if splits else "–")
        ppl = ((r.get("train_summary") or {}).get("valid") or {}).get("ppl")
        rows.append([
            str(r["table3_row"]), r["experiment"], line[1] if line else "(no paper line)",
            _params(r), _fmt(ppl, 2), _fmt(_score(r, split, PAPER_KIND)),
            _fmt(_score(r, split, "sacrebleu")), split,
            _fmt(line[3], 2) if line else "–", _fmt(line[4]) if line else "–",
            f"{line[5]}M" if line and line[5] else "–",
        ])
    return [
        "## Table 3: variants (EN-DE)",
        "",
        f"Paper: newstest2013, beam search without checkpoint averaging, {TOK}, PPL per",
        "word-piece on the development set. Ours: the run's last validation perplexity (per",
        "SentencePiece piece) and both BLEU kinds on the test set named in the row.",
        "",
        *_table(header, rows),
        "",
    ]


def _per_test_set_rows(results: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for r in results:
        data = r.get("data") or {}
        flops, hours = _cost(r)
        n_avg = r.get("num_checkpoints_averaged")
        for split in r.get("test_sets") or {}:
            rows.append([
                _name(r), f"{data.get('name')} ({data.get('src_lang')}-{data.get('tgt_lang')})",
                str((r.get("model") or {}).get("name")), _params(r), str(r.get("steps", "–")),
                str(n_avg) if n_avg else "none", split,
                _fmt(_score(r, split, PAPER_KIND), 2), _fmt(_score(r, split, "sacrebleu"), 2),
                _fmt(_score(r, split, "chrf"), 2), _fmt(hours, 2), _fmt_e(flops),
            ])
    return rows


_PER_TEST_SET_HEADER = [
    "run", "data", "model", "params", "steps", "checkpoints averaged", "test set",
    TOK, SACRE, "chrF", "GPU-hours", "FLOPs",
]
_PER_TEST_SET_LEGEND = (
    f"{TOK}: the paper's way (German targets: t2t get_ende_bleu.sh; others: Moses tokenizer, "
    f"multi-bleu); {SACRE}: detokenized, 13a, mixed case, official reference; chrF: sacreBLEU's chrF."
)


def table2_details_section(results: list[dict[str, Any]]) -> list[str]:
    """Every test set (newstest2014 full and filtered) of the Table 2 runs, all scores."""
    runs = [r for r in results if is_table2_run(r)]
    if not runs:
        return []
    return [
        "### Table 2 runs on every test set",
        "",
        _PER_TEST_SET_LEGEND,
        *([LEGACY_NOTE] if any(is_legacy(r) for r in runs) else []),
        "",
        *_table(_PER_TEST_SET_HEADER, _per_test_set_rows(runs)),
        "",
    ]


def others_section(results: list[dict[str, Any]]) -> list[str]:
    """Markdown lines for every run outside Tables 2 and 3, one row per test set."""
    others = [r for r in results if not is_table2_run(r) and not r.get("table3_row")]
    if not others:
        return []
    return [
        "## Other runs",
        "",
        _PER_TEST_SET_LEGEND,
        *([LEGACY_NOTE] if any(is_legacy(r) for r in others) else []),
        "",
        *_table(_PER_TEST_SET_HEADER, _per_test_set_rows(others)),
        "",
    ]


def signatures_section(results: list[dict[str, Any]]) -> list[str]:
    """The distinct labels and signatures of every score in the tables."""
    seen: dict[tuple[str, str], None] = {}
    for r in results:
        for test in (r.get("test_sets") or {}).values():
            for entry in [*test["bleu"].values(), test["chrf"]]:
                seen[(entry["label"], entry["signature"])] = None
    if not seen:
        return []
    return ["## Score signatures", "", *[f"- {label}: `{sig}`" for label, sig in seen], ""]


def build_report(results: list[dict[str, Any]]) -> str:
    """The whole results.md text."""
    lines = [
        "# Results",
        "",
        "Built by `nmt-table` from "
        + (", ".join(sorted(r["_path"] for r in results if "_path" in r)) or "no results.json files")
        + ".",
        "",
        *table2_section(results),
        *table2_details_section(results),
        *table3_section(results),
        *others_section(results),
        *signatures_section(results),
    ]
    return "\n".join(lines).rstrip() + "\n"


def write_report(cfg: Config) -> Path:
    """``nmt-table``: read ``cfg.results_glob``, write ``cfg.table_output`` atomically.

    Returns:
        The path written.
    """
    results = load_results(cfg.results_glob)
    if not results:
        log.warning("no results files match %s; writing the paper's numbers only", cfg.results_glob)
    out = Path(cfg.table_output)
    with atomic_write(out) as f:
        f.write(build_report(results))
    log.info("wrote %s from %d results files", out, len(results))
    return out
