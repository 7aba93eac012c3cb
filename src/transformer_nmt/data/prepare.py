"""``nmt-prepare``: download -> clean -> bpe -> binarize for ``cfg.data``, then a summary.

Each stage is skipped only when its completion stamp (``clean.stamp.json``,
``spm.stamp.json``, ``binarize.stamp.json``) says it was built from the same inputs with the
same parameters and its outputs are the ones it wrote. A stamp holds the stage's parameters
and, for every input and output file, its path, size, ``mtime_ns`` and SHA-256 digest; it is
written last, after every output, and deleted before a stage rebuilds, so outputs become valid
together (an ``spm.json`` renamed before its ``spm.model`` by a killed run does not match).
A file whose size and ``mtime_ns`` equal the stamp's is taken as unchanged (the fast path,
as make and git do); any other file is hashed again and compared by content, so a different
corpus under the same name rebuilds whatever its file times, and a touched but identical
file does not. Every file is written through ``fileio.atomic_write``, so a failed or killed
run leaves no half-written output; the temporary files a killed run leaves behind
(``.*.tmp``, SentencePiece's ``.spm_sample.*.txt``) are deleted when the same stage next
starts.

Outputs::

    <root>/raw/<name>/<split>.<lang>, clean_report.json     cleaned text + counts per rule
    <root>/spm/<name>/spm.model, spm.vocab, spm.json         shared SentencePiece model
    <root>/bin/<name>/<split>.<lang>.bin/.idx, summary.json  token ids + the summary
    clean.stamp.json, spm.stamp.json, binarize.stamp.json    completion stamps (beside each)
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from transformer_nmt.config import UNK_ID, Config, DataConfig
from transformer_nmt.data import binarize, bpe, clean, corpora
from transformer_nmt.errors import DataError
from transformer_nmt.fileio import atomic_write, bin_prefix, raw_path, spm_model_path, write_json

log = logging.getLogger(__name__)

SUMMARY_MAX_TOKENS = 4096
"""Token budget (per batch, source and target each) at which padding efficiency is reported."""


def summary_path(data_cfg: DataConfig) -> Path:
    """``<root>/bin/<name>/summary.json``."""
    return Path(data_cfg.root) / "bin" / data_cfg.name / "summary.json"


def _load_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _plain(value: Any) -> Any:
    """``value`` as JSON would give it back (tuples become lists, keys strings)."""
    return json.loads(json.dumps(value))


def _fingerprint(path: Path, known: dict | None = None) -> dict:
    """``{"size", "mtime_ns", "sha256"}`` of a file; the digest of ``known`` is reused when
    size and ``mtime_ns`` are those of ``known``."""
    st = path.stat()
    if known and known.get("size") == st.st_size and known.get("mtime_ns") == st.st_mtime_ns:
        return dict(known)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": bpe.file_digest(path)}


def _fingerprints(paths: list[Path]) -> dict[str, dict]:
    return {str(p): _fingerprint(p) for p in paths}


def _same_files(recorded: dict | None, paths: list[Path]) -> bool:
    """True when ``paths`` are exactly the recorded files, each with the recorded content."""
    if not isinstance(recorded, dict) or set(recorded) != {str(p) for p in paths}:
        return False
    for p in paths:
        rec = recorded[str(p)]
        if not p.is_file():
            return False
        now = _fingerprint(p, rec)
        if (now["size"], now["sha256"]) != (rec.get("size"), rec.get("sha256")):
            return False
    return True


def stamp_is_current(stamp: Path, params: Any, inputs: list[Path], outputs: list[Path]) -> bool:
    """True when ``stamp`` records these ``params`` and the current content of ``inputs`` and
    ``outputs`` (see the module docstring)."""
    saved = _load_json(stamp)
    return (saved is not None and saved.get("params") == _plain(params)
            and _same_files(saved.get("inputs"), inputs)
            and _same_files(saved.get("outputs"), outputs))


def write_stamp(stamp: Path, params: Any, inputs: list[Path], outputs: list[Path]) -> None:
    """Record a finished stage (written last, atomically)."""
    with atomic_write(stamp) as f:
        json.dump({"params": _plain(params), "inputs": _fingerprints(inputs),
                   "outputs": _fingerprints(outputs)}, f, indent=2)


def remove_orphans(folder: Path, patterns: tuple[str, ...] = (".*.tmp",)) -> list[Path]:
    """Delete temporary files that a killed run of a stage left in ``folder``."""
    removed = []
    if folder.is_dir():
        for pattern in patterns:
            for p in folder.glob(pattern):
                if p.is_file():
                    p.unlink(missing_ok=True)
                    removed.append(p)
    if removed:
        log.info("removed %d temporary files of an earlier run from %s: %s", len(removed), folder,
                 ", ".join(p.name for p in removed))
    return removed


def token_filter_params(cfg: Config) -> dict:
    """The training-pair token limit of the binarize stage (part of its stamp, so a change
    rebuilds the training split): ``max_positions`` (``cfg.model``), ``max_tokens``
    (``cfg.trainer``) and ``max_len`` (:func:`transformer_nmt.data.binarize.max_train_tokens`);
    all None when ``cfg`` has no model or trainer section (no filter)."""
    model, trainer = getattr(cfg, "model", None), getattr(cfg, "trainer", None)
    max_positions = getattr(model, "max_positions", None) if model is not None else None
    max_tokens = getattr(trainer, "max_tokens", None) if trainer is not None else None
    if max_positions is None or max_tokens is None:
        return {"max_positions": None, "max_tokens": None, "max_len": None}
    return {"max_positions": int(max_positions), "max_tokens": int(max_tokens),
            "max_len": binarize.max_train_tokens(max_positions, max_tokens)}


def training_data_identity(d: DataConfig) -> dict:
    """The identity of the binarized training split that training reads:
    ``{"name", "split", "pairs", "sha256"}``, the digest taken over the SHA-256 of the
    ``.bin`` and ``.idx`` files of both languages (from ``binarize.stamp.json`` when a file's
    size and ``mtime_ns`` are the recorded ones, else read again). Training records it in
    its checkpoints; a resume on other data (prepared again with other limits, or another
    corpus under the name) is refused.

    Raises:
        FileNotFoundError: a binarized training file is missing.
    """
    saved = _load_json(summary_path(d).with_name("binarize.stamp.json")) or {}
    jobs = saved.get("jobs") if isinstance(saved.get("jobs"), dict) else {}
    digest = hashlib.sha256()
    pairs = 0
    for lang in (d.src_lang, d.tgt_lang):
        prefix = bin_prefix(d, d.train_split, lang)
        recorded = (jobs.get(str(prefix)) or {}).get("outputs") or {}
        for path in (Path(f"{prefix}.bin"), Path(f"{prefix}.idx")):
            known = recorded.get(str(path)) if isinstance(recorded, dict) else None
            digest.update(f"{path.name} {_fingerprint(path, known)['sha256']}\n".encode())
        pairs = len(binarize.TokenDataset(prefix))
    return {"name": d.name, "split": d.train_split, "pairs": pairs, "sha256": digest.hexdigest()}


def prepare(cfg: Config) -> dict:
    """Run the data stage for ``cfg.data``.

    A split whose source and target are one file, or a training split whose kept pairs are
    mostly copies (:data:`transformer_nmt.data.clean.IDENTICAL_PAIRS_WARN`), gets one warning
    (:func:`transformer_nmt.data.clean.copy_warning`) on every run, stages skipped or not.

    Args:
        cfg: the composed :class:`transformer_nmt.config.Config`: ``cfg.data``, and
            ``cfg.model.max_positions`` / ``cfg.trainer.max_tokens`` for the token limit of
            training pairs (:func:`token_filter_params`).

    Returns:
        The summary (also written to ``<root>/bin/<name>/summary.json``): ``pairs`` (read,
        kept and dropped per rule, per split), ``vocab_size``, ``sentences`` and ``tokens``
        per split and language, ``unk_rate``, ``padding_efficiency`` of the training
        batches at ``max_tokens=4096``, ``token_filter`` (the limit and the training pairs
        dropped for it) and ``stages`` (``done`` or ``skipped``, seconds).

    Raises:
        transformer_nmt.data.corpora.DataError: unknown corpus, missing file, misaligned files,
            invalid UTF-8, a split empty after cleaning, a vocabulary too large for the data.
    """
    d = cfg.data
    langs = (d.src_lang, d.tgt_lang)
    stages: dict[str, dict] = {}

    t = time.perf_counter()
    remove_orphans(corpora.orig_dir(d))  # downloads and streamed WMT14 text
    sources, fetched = corpora.fetch(d)
    stages["download"] = {"status": "done" if fetched else "skipped",
                          "seconds": round(time.perf_counter() - t, 2)}
    split_names = [s.split for s in sources]
    text = {(s, lang): raw_path(d, s, lang) for s in split_names for lang in langs}

    report_file = clean.report_path(d)
    _run_stage(
        stages, "clean", report_file.with_name("clean.stamp.json"),
        params={"clean": clean.clean_params(d),
                "splits": [[s.split, s.is_train, s.max_pairs] for s in sources]},
        inputs=[p for s in sources for p in (s.src, s.tgt)],
        outputs=[*text.values(), report_file],
        build=lambda: clean.clean_corpus(d, sources))
    report = _load_json(report_file)
    for source in sources:  # also when cleaning was skipped: the report keeps the counts
        warning = clean.copy_warning(source, (report or {}).get("splits", {}).get(source.split)
                                     or {})
        if warning:
            log.warning(warning)

    model = spm_model_path(d)
    train_text = [text[(d.train_split, lang)] for lang in langs]
    earlier = _earlier_vocabulary(model)
    _run_stage(
        stages, "bpe", model.with_name("spm.stamp.json"), params=bpe.spm_params(d),
        inputs=train_text, outputs=[model, model.with_suffix(".vocab"), bpe.meta_path(model)],
        build=lambda: bpe.train_spm(d, train_text, model),
        orphans=(".*.tmp", ".spm_sample.*.txt"))
    if stages["bpe"]["status"] == "done":
        _warn_new_vocabulary(d, model, earlier)
    tokenizer = bpe.SentencePieceTokenizer(model)

    filter_params, token_filter = _binarize_stage(cfg, stages, text, tokenizer)

    summary = _summary(d, report, tokenizer.vocab_size, split_names, langs)
    summary["clean_params"] = dict(report.get("params") or {})
    summary["token_filter"] = {**filter_params, "split": d.train_split,
                               "dropped": int(token_filter.get("dropped", 0))}
    summary["stages"] = stages
    before = _load_json(summary_path(d)) or {}
    unchanged = {k: v for k, v in before.items() if k != "stages"} == _plain(
        {k: v for k, v in summary.items() if k != "stages"})
    if unchanged and all(v["status"] == "skipped" for v in stages.values()):
        # nothing was rebuilt: the data root is left untouched (it may be read-only)
        log.info("the prepared data is up to date: %s", summary_path(d))
        return summary
    write_json(summary_path(d), summary)
    log.info("summary written to %s", summary_path(d))
    return summary


def _run_stage(stages: dict[str, dict], name: str, stamp: Path, *, params: Any,
               inputs: list[Path], outputs: list[Path], build: Callable[[], Any],
               orphans: tuple[str, ...] = (".*.tmp",)) -> None:
    """One stage of :func:`prepare`: remove a killed run's temporary files (``orphans``) from
    the stamp's folder, then skip the stage when ``stamp`` is current
    (:func:`stamp_is_current`), else delete the stamp, ``build()`` the outputs and write the
    stamp last. Records ``{"status": "done" | "skipped", "seconds"}`` in ``stages[name]``."""
    t = time.perf_counter()
    remove_orphans(stamp.parent, orphans)
    if stamp_is_current(stamp, params, inputs, outputs):
        status = "skipped"
    else:
        stamp.unlink(missing_ok=True)
        build()
        write_stamp(stamp, params, inputs, outputs)
        status = "done"
    stages[name] = {"status": status, "seconds": round(time.perf_counter() - t, 2)}


def _binarize_stage(cfg: Config, stages: dict[str, dict], text: dict[tuple[str, str], Path],
                    tokenizer: bpe.SentencePieceTokenizer) -> tuple[dict, dict]:
    """The binarize stage of :func:`prepare`: each ``(split, lang)`` text file whose record in
    ``binarize.stamp.json`` is not current is encoded again, and the training split is
    filtered to the token limit (:func:`token_filter_params`) when it was rebuilt or the
    limit changed. Records the stage in ``stages["binarize"]``.

    Returns:
        ``(filter_params, token_filter)``: the limit and the filter's counts.
    """
    d = cfg.data
    langs = (d.src_lang, d.tgt_lang)
    model = tokenizer.model_path
    t = time.perf_counter()
    stamp = summary_path(d).with_name("binarize.stamp.json")
    remove_orphans(stamp.parent)
    jobs, job_files = [], {}
    for (split, lang), path in text.items():
        prefix = bin_prefix(d, split, lang)
        job_files[str(prefix)] = ([path, model], [Path(f"{prefix}.bin"), Path(f"{prefix}.idx")])
    saved = _load_json(stamp) or {}
    done_before = saved.get("jobs", {}) if isinstance(saved.get("jobs"), dict) else {}
    filter_params = token_filter_params(cfg)
    saved_filter = saved.get("token_filter") if isinstance(saved.get("token_filter"), dict) else {}
    same_filter = saved_filter.get("params") == _plain(filter_params)
    for (split, lang), path in text.items():
        prefix = bin_prefix(d, split, lang)
        ins, outs = job_files[str(prefix)]
        rec = done_before.get(str(prefix)) or {}
        if not (rec and _same_files(rec.get("inputs"), ins)
                and _same_files(rec.get("outputs"), outs)
                and (split != d.train_split or same_filter)):
            jobs.append((path, prefix))
    if jobs:
        stamp.unlink(missing_ok=True)
    results = binarize.binarize_files(jobs, model, tokenizer.vocab_size, d.num_workers)
    for (path, _), r in zip(jobs, results):
        log.info("binarize %s: %d sentences, %d tokens, %d unk", path.name, r["sentences"],
                 r["tokens"], r["unk"])
    token_filter = dict(saved_filter.get("result") or {}) if same_filter else {}
    rebuilt_train = any(str(p) in {str(bin_prefix(d, d.train_split, lang)) for lang in langs}
                        for _, p in jobs)
    if rebuilt_train or not token_filter:
        _warn_refilter(d, saved_filter.get("params"), filter_params, same_filter)
        token_filter = {"dropped": 0}
        if filter_params["max_len"] is not None:
            token_filter = binarize.filter_long_pairs(
                bin_prefix(d, d.train_split, langs[0]), bin_prefix(d, d.train_split, langs[1]),
                filter_params["max_len"])
            log.info("training pairs longer than %d pieces on either side (model.max_positions "
                     "%s, trainer.max_tokens %s): %d dropped, %d kept", filter_params["max_len"],
                     filter_params["max_positions"], filter_params["max_tokens"],
                     token_filter["dropped"], token_filter["kept"])
    if jobs or set(done_before) != set(job_files) or not same_filter:
        with atomic_write(stamp) as f:
            json.dump({"jobs": {k: {"inputs": _fingerprints(ins), "outputs": _fingerprints(outs)}
                                for k, (ins, outs) in job_files.items()},
                       "token_filter": {"params": _plain(filter_params), "result": token_filter}},
                      f, indent=2)
    stages["binarize"] = {"status": "done" if jobs else "skipped",
                          "seconds": round(time.perf_counter() - t, 2)}
    return filter_params, token_filter


def _earlier_vocabulary(model: Path) -> tuple[dict, dict] | None:
    """``(params, identity)`` of the SentencePiece model a finished bpe stage left at
    ``model`` (its stamp's parameters, :func:`transformer_nmt.data.bpe.vocab_identity`), or
    None when there is none (never prepared, deleted, or not a model)."""
    stamp = _load_json(model.with_name("spm.stamp.json"))
    if not isinstance(stamp, dict) or not isinstance(stamp.get("params"), dict):
        return None
    try:
        return stamp["params"], bpe.vocab_identity(model)
    except (OSError, DataError):
        return None


def _warn_new_vocabulary(d: DataConfig, model: Path, earlier: tuple[dict, dict] | None) -> None:
    """Warn when the bpe stage replaced a finished vocabulary of ``data.name`` with another
    one (other ``lowercase``, ``pretokenize`` or vocabulary settings, or other training
    text): every run trained on the earlier one refuses to translate, evaluate, export or
    resume with it. The same vocabulary built again (a deleted stamp, a touched file) says
    nothing."""
    if earlier is None:
        return
    before, identity = earlier
    now = bpe.vocab_identity(model)
    if bpe.same_vocabulary(identity, now):
        return
    steps = {"lowercase": False, "pretokenize": "none"}  # absent from parameters when off
    before, params = {**steps, **before}, {**steps, **_plain(bpe.spm_params(d))}
    changed = [f"data.{k}: {before.get(k)} -> {params.get(k)}"
               for k in sorted(set(before) & set(params)) if before[k] != params[k]]
    log.warning(
        "%s now holds another vocabulary than before (%s; before: %s; now: %s): runs trained "
        "on the earlier one can no longer translate, evaluate, export or resume with "
        "data.name=%s; give data prepared with other settings its own data.name", model,
        "; ".join(changed) if changed else "other training text",
        bpe.describe_vocabulary(identity, now), bpe.describe_vocabulary(now, identity), d.name)


def _warn_refilter(d: DataConfig, before: Any, now: dict, same: bool) -> None:
    """Warn when the training split, filtered before for other limits (another experiment
    sharing ``data.name``, or other ``model.max_positions`` / ``trainer.max_tokens``), is
    filtered again: runs trained on the earlier data refuse to resume on it."""
    if same or not isinstance(before, dict) or before.get("max_len") is None:
        return
    log.warning(
        "the training split of %s (%s) was filtered for pairs of at most %s pieces "
        "(model.max_positions %s, trainer.max_tokens %s) and is now filtered for %s "
        "(model.max_positions %s, trainer.max_tokens %s): runs trained on the earlier data "
        "refuse to resume on it; give experiments with other limits their own data.name",
        d.name, Path(d.root) / "bin" / d.name, before.get("max_len"),
        before.get("max_positions"), before.get("max_tokens"), now["max_len"],
        now["max_positions"], now["max_tokens"])


def _summary(d: Any, report: dict, vocab_size: int, split_names: list[str],
             langs: tuple[str, str]) -> dict:
    """Figures of the prepared corpus, read back from the binarized files."""
    from transformer_nmt.data.batching import LengthBucketSampler

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


def filter_lines(summary: dict) -> list[str]:
    """What each training-pair filter of the table tests, with the values it ran with
    (``summary["clean_params"]``; [] for a summary written before it was recorded)."""
    p = summary.get("clean_params")
    if not p:
        return []
    train = next((v for k, v in summary["pairs"].items() if v.get("dropped")), {})
    dropped = train.get("dropped") or {}
    limit = p.get("max_train_pairs")
    return [
        "training-pair filters (training split only; test and valid sets are never filtered):",
        f"- empty: either side empty after normalisation: {dropped.get('empty', 0)} dropped",
        (f"- too_long: more than {p['max_len']} words on either side (data.max_len): "
        f"{dropped.get('too_long', 0)} dropped"),
        (f"- ratio: longer / shorter side > {p['max_ratio']} counted in whitespace words, not "
        f"pieces, where the longer side has >= {p['ratio_min_len']} words (data.max_ratio, "
        f"data.ratio_min_len; not in the paper): {dropped.get('ratio', 0)} dropped"),
        (f"- duplicate: the same pair again (data.dedup={p['dedup']}): "
        f"{dropped.get('duplicate', 0) if p['dedup'] else 'off'}"),
        ("- data.max_train_pairs: "
        f"{'all pairs read' if limit is None else f'reading stops after {limit} pairs'}"),
    ]


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
    tf = summary.get("token_filter")
    if tf and tf.get("max_len") is not None:
        lines.append(f"training pairs longer than {tf['max_len']} pieces (model.max_positions "
                     f"{tf['max_positions']}, trainer.max_tokens {tf['max_tokens']}): "
                     f"{tf['dropped']} dropped")
    lines += filter_lines(summary)
    if "stages" in summary:
        lines.append("stages: " + ", ".join(f"{k} {v['status']} ({v['seconds']} s)"
                                            for k, v in summary["stages"].items()))
    return "\n".join(lines)
