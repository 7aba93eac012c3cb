"""``nmt-prepare``: download -> clean -> bpe -> binarize for ``cfg.data``, then a summary.

Each stage is skipped when its outputs are up to date (``fileio.is_up_to_date``: every
output exists and is newer than every input) and were made with the same settings (the
cleaning report and ``spm.json`` keep the settings they were made with). Every file is
written through ``fileio.atomic_write``, so a failed or killed run leaves no
half-written output.

Outputs::

    <root>/raw/<name>/<split>.<lang>, clean_report.json     cleaned text + counts per rule
    <root>/spm/<name>/spm.model, spm.vocab, spm.json         shared SentencePiece model
    <root>/bin/<name>/<split>.<lang>.bin/.idx, summary.json  token ids + the summary
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from transformer_nmt import binarize, bpe, clean, corpora
from transformer_nmt.config import UNK_ID
from transformer_nmt.fileio import atomic_write, bin_prefix, is_up_to_date, raw_path, spm_model_path

log = logging.getLogger(__name__)

SUMMARY_MAX_TOKENS = 4096
"""Token budget (per batch, source and target each) at which padding efficiency is reported."""


def summary_path(data_cfg: Any) -> Path:
    """``<root>/bin/<name>/summary.json``."""
    return Path(data_cfg.root) / "bin" / data_cfg.name / "summary.json"


def _load_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _same_params(saved: dict | None, params: dict) -> bool:
    return saved is not None and saved.get("params") == json.loads(json.dumps(params))


def prepare(cfg: Any) -> dict:
    """Run the data stage for ``cfg.data``.

    Args:
        cfg: the composed :class:`transformer_nmt.config.Config` (only ``cfg.data`` is used).

    Returns:
        The summary (also written to ``<root>/bin/<name>/summary.json``): ``pairs`` (read,
        kept and dropped per rule, per split), ``vocab_size``, ``sentences`` and ``tokens``
        per split and language, ``unk_rate``, ``padding_efficiency`` of the training
        batches at ``max_tokens=4096``, and ``stages`` (``done`` or ``skipped``, seconds).

    Raises:
        transformer_nmt.corpora.DataError: unknown corpus, missing file, misaligned files,
            invalid UTF-8, a split empty after cleaning, a vocabulary too large for the data.
    """
    d = cfg.data
    langs = (d.src_lang, d.tgt_lang)
    stages: dict[str, dict] = {}

    t = time.perf_counter()
    sources, fetched = corpora.fetch(d)
    stages["download"] = {"status": "done" if fetched else "skipped",
                          "seconds": round(time.perf_counter() - t, 2)}
    split_names = [s.split for s in sources]

    # clean -------------------------------------------------------------------------------------
    t = time.perf_counter()
    text = {(s, lang): raw_path(d, s, lang) for s in split_names for lang in langs}
    report_file = clean.report_path(d)
    report = _load_json(report_file)
    if (is_up_to_date([*text.values(), report_file],
                      [p for s in sources for p in (s.src, s.tgt)])
            and _same_params(report, clean.clean_params(d))
            and set(report.get("splits", {})) == set(split_names)):
        stages["clean"] = {"status": "skipped"}
    else:
        report = clean.clean_corpus(d, sources)
        stages["clean"] = {"status": "done"}
    stages["clean"]["seconds"] = round(time.perf_counter() - t, 2)

    # bpe ---------------------------------------------------------------------------------------
    t = time.perf_counter()
    model = spm_model_path(d)
    train_text = [text[(d.train_split, lang)] for lang in langs]
    if (is_up_to_date([model, bpe.meta_path(model)], train_text)
            and _same_params(_load_json(bpe.meta_path(model)), bpe.spm_params(d))):
        stages["bpe"] = {"status": "skipped"}
    else:
        bpe.train_spm(d, train_text, model)
        stages["bpe"] = {"status": "done"}
    tokenizer = bpe.SentencePieceTokenizer(model)
    stages["bpe"]["seconds"] = round(time.perf_counter() - t, 2)

    # binarize ----------------------------------------------------------------------------------
    t = time.perf_counter()
    jobs = []
    for (split, lang), path in text.items():
        prefix = bin_prefix(d, split, lang)
        if not is_up_to_date([Path(f"{prefix}.bin"), Path(f"{prefix}.idx")], [path, model]):
            jobs.append((path, prefix))
    results = binarize.binarize_files(jobs, model, tokenizer.vocab_size, d.num_workers)
    for (path, _), r in zip(jobs, results):
        log.info("binarize %s: %d sentences, %d tokens, %d unk", path.name, r["sentences"],
                 r["tokens"], r["unk"])
    done = len(jobs)
    stages["binarize"] = {"status": "done" if done else "skipped",
                          "seconds": round(time.perf_counter() - t, 2)}

    summary = _summary(d, report, tokenizer.vocab_size, split_names, langs)
    summary["stages"] = stages
    with atomic_write(summary_path(d)) as f:
        json.dump(summary, f, indent=2)
    log.info("summary written to %s", summary_path(d))
    return summary


def _summary(d: Any, report: dict, vocab_size: int, split_names: list[str],
             langs: tuple[str, str]) -> dict:
    """Figures of the prepared corpus, read back from the binarized files."""
    from transformer_nmt.batching import LengthBucketSampler

    sentences, tokens, unk = {}, {}, {}
    data = {}
    for split in split_names:
        tokens[split], unk[split] = {}, {}
        for lang in langs:
            ds = binarize.TokenDataset(bin_prefix(d, split, lang))
            data[(split, lang)] = ds
            sentences[split] = len(ds)
            tokens[split][lang] = ds.num_tokens
            n_unk = _count_id(ds, UNK_ID)
            unk[split][lang] = round(n_unk / max(1, ds.num_tokens), 6)
    src, tgt = data[(d.train_split, langs[0])], data[(d.train_split, langs[1])]
    sampler = LengthBucketSampler(src.sizes, tgt.sizes, SUMMARY_MAX_TOKENS, shuffle=True, seed=1,
                                  skip_too_long=True)
    efficiency = sampler.padding_efficiency
    if callable(efficiency):
        efficiency = efficiency()
    return {
        "name": d.name,
        "corpus": d.corpus,
        "src_lang": langs[0],
        "tgt_lang": langs[1],
        "pairs": report["splits"],
        "vocab_size": vocab_size,
        "sentences": sentences,
        "tokens": tokens,
        "unk_rate": unk,
        "padding_efficiency": {"max_tokens": SUMMARY_MAX_TOKENS, "batches": len(sampler),
                               "value": round(float(efficiency), 4)},
    }


def _count_id(ds: binarize.TokenDataset, token_id: int, block: int = 1 << 22) -> int:
    """Occurrences of ``token_id`` in a binarized file, read in blocks of ``block`` ids
    (plain reads, not the memory map, so the file does not stay resident)."""
    n = 0
    with open(f"{ds.prefix}.bin", "rb") as f:
        while True:
            ids = np.fromfile(f, dtype=ds.dtype, count=block)
            if not len(ids):
                return n
            n += int(np.count_nonzero(ids == token_id))


def format_summary(summary: dict) -> str:
    """The summary as Markdown tables (what ``nmt-prepare`` prints)."""
    src, tgt = summary["src_lang"], summary["tgt_lang"]
    rules = list(clean.RULES)
    lines = [f"## {summary['name']} ({src}-{tgt}), vocabulary {summary['vocab_size']}", "",
             (f"| split | pairs read | kept | {' | '.join('dropped ' + r for r in rules)} "
              f"| tokens {src} | tokens {tgt} | unk {src} | unk {tgt} |"),
             "|---" * (7 + len(rules)) + "|"]
    for split, p in summary["pairs"].items():
        dropped = [str(p["dropped"].get(r, "-")) if p["dropped"] else "-" for r in rules]
        tok, unk = summary["tokens"][split], summary["unk_rate"][split]
        lines.append(f"| {split} | {p['read']} | {p['kept']} | {' | '.join(dropped)} "
                     f"| {tok[src]} | {tok[tgt]} | {unk[src]:.2%} | {unk[tgt]:.2%} |")
    pe = summary["padding_efficiency"]
    lines += ["", (f"padding efficiency of training batches at max_tokens={pe['max_tokens']}: "
                   f"{pe['value']:.2%} ({pe['batches']} batches)")]
    if "stages" in summary:
        lines.append("stages: " + ", ".join(f"{k} {v['status']} ({v['seconds']} s)"
                                            for k, v in summary["stages"].items()))
    return "\n".join(lines)
