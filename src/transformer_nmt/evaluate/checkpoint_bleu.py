"""BLEU of every kept checkpoint and of the average: what averaging buys (section 6.1).

:func:`checkpoint_bleu` decodes the validation set with every kept ``checkpoint_<step>.pt``
and the averaged model (``averaged.pt``, else the in-memory average of the last
``average.last``), caching the scores in ``plots/checkpoint_bleu.json``;
:func:`transformer_nmt.plot.checkpoint_bleu.plot_checkpoint_bleu` draws them (``nmt-plot``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from transformer_nmt.checkpoint import (
    AVERAGED_NAME,
    average_model,
    checkpoint_dir,
    checkpoint_metadata,
    config_of,
    load_model,
    read_checkpoint,
    step_checkpoints,
)
from transformer_nmt.config import DecodeConfig
from transformer_nmt.data.bpe import load_tokenizer
from transformer_nmt.decode.quantize import decoding_model
from transformer_nmt.decode.translate import translate_lines
from transformer_nmt.errors import JsonFileError
from transformer_nmt.evaluate.bleu import sacrebleu_score
from transformer_nmt.fileio import atomic_write, raw_path, read_json, read_lines

log = logging.getLogger(__name__)

BLEU_CACHE_NAME = "checkpoint_bleu.json"
"""The cache of :func:`checkpoint_bleu`'s scores, in the run's ``plots/`` folder."""


def _file_key(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"name": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _decode_key(decode_cfg: DecodeConfig) -> dict[str, Any]:
    keys = ("beam_size", "lenpen", "lenpen_form", "stopping", "max_len_a", "max_len_b",
            "max_input_tokens", "precision")
    return {k: getattr(decode_cfg, k) for k in keys}


def _cache_id(entry: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()[:16]


def read_cache(path: Path) -> dict[str, Any]:
    """The score cache at ``path`` ({} when absent, or unreadable: a warning, decoded again)."""
    if not path.is_file():
        return {}
    try:
        data = read_json(path)
    except JsonFileError as e:
        log.warning("%s; decoding again", e)
        return {}
    return data if isinstance(data, dict) else {}


def checkpoint_bleu(
    run_dir: str | Path,
    decode_cfg: DecodeConfig,
    device: str | torch.device = "cpu",
    max_sentences: int | None = None,
    cache_dir: str | Path | None = None,
    average_last: int = 5,
) -> list[dict[str, Any]]:
    """sacreBLEU on the validation set of every kept checkpoint of a run and of its average.

    Each ``checkpoint_<step>.pt`` and the averaged model are decoded with
    :func:`transformer_nmt.decode.translate.translate_lines` (``decode_cfg``'s beam settings) and
    scored with :func:`transformer_nmt.evaluate.bleu.sacrebleu_score` against the raw validation
    references of the data config stored in the checkpoint. The averaged model is
    ``checkpoints/averaged.pt`` when it exists, else the average of the last
    ``average_last`` kept checkpoints (``average.last``) computed in memory (section 6.1). Scores
    are cached in ``<cache_dir>/checkpoint_bleu.json`` keyed by the file names, sizes and
    modification times and the decode settings, so re-plotting decodes nothing new.

    Args:
        run_dir: ``runs/<name>``.
        decode_cfg: :class:`transformer_nmt.config.DecodeConfig`.
        device: where to decode.
        max_sentences: decode only the first N validation sentences (None = all).
        cache_dir: folder of the cache (default ``<run_dir>/plots``).

    Returns:
        One dict per model, checkpoints by step then the average: ``{"label", "step",
        "averaged_from" (names or None), "bleu", "sentences", "signature"}``.

    Raises:
        FileNotFoundError: no step checkpoint in the run, or missing validation files
            (named).
    """
    run_dir = Path(run_dir)
    paths = step_checkpoints(run_dir)
    if not paths:
        raise FileNotFoundError(f"no checkpoint_<step>.pt in {checkpoint_dir(run_dir)}")
    cache_path = Path(cache_dir or run_dir / "plots") / BLEU_CACHE_NAME
    cache = read_cache(cache_path)

    models: list[dict[str, Any]] = []  # {label, step, sources: [Path], averaged}
    for p in paths:
        models.append({"label": p.name, "files": [p], "averaged": False})
    averaged = checkpoint_dir(run_dir) / AVERAGED_NAME
    if averaged.is_file():
        models.append({"label": AVERAGED_NAME, "files": [averaged], "averaged": True})
    else:
        last = paths[-int(average_last):]
        models.append({"label": f"average of {len(last)}", "files": last, "averaged": True,
                       "in_memory": True})

    run_cfg = config_of(read_checkpoint(paths[-1], mmap=True))
    data = run_cfg.data
    src_file = raw_path(data, data.valid_split, data.src_lang)
    ref_file = raw_path(data, data.valid_split, data.tgt_lang)
    for f in (src_file, ref_file):
        if not f.is_file():
            raise FileNotFoundError(f"validation file {f} not found (run nmt-prepare first)")
    sources = list(read_lines(src_file, hint=None))
    references = list(read_lines(ref_file, hint=None))
    if max_sentences is not None:
        sources, references = sources[:max_sentences], references[:max_sentences]
    tokenizer = None

    results = []
    for m in models:
        key = {"files": [_file_key(p) for p in m["files"]], "decode": _decode_key(decode_cfg),
               "sentences": len(sources), "valid": str(src_file),
               "in_memory": bool(m.get("in_memory"))}
        cid = _cache_id(key)
        if cid in cache:
            results.append(cache[cid]["result"])
            continue
        if tokenizer is None:
            tokenizer = load_tokenizer(data)
        if m.get("in_memory"):
            model, _ = average_model(m["files"], device)
            step = max(checkpoint_metadata(p)["step"] or 0 for p in m["files"])
            names = [p.name for p in m["files"]]
        else:
            model, _ = load_model(m["files"][0], device)
            meta = checkpoint_metadata(m["files"][0])
            step, names = meta["step"], meta["averaged_from"]
            if names is None and m["averaged"]:
                names = [m["files"][0].name]
        model = decoding_model(model, decode_cfg, device, m["files"][0])  # int8: quantized
        log.info("decoding %d validation sentences with %s", len(sources), m["label"])
        hyps, _ = translate_lines(model, tokenizer, sources, decode_cfg, device)
        # the validation file is the prepared text: Moses-tokenized under data.pretokenize=moses,
        # where the hypotheses come out detokenized
        score = sacrebleu_score(hyps, tokenizer.detokenize(references))
        result = {"label": m["label"], "step": step,
                  "averaged_from": names if m["averaged"] else None,
                  "bleu": score["score"], "sentences": len(sources),
                  "signature": score["signature"]}
        cache[cid] = {"key": key, "result": result}
        with atomic_write(cache_path) as f:  # after each model: an interrupted run keeps them
            json.dump(cache, f, indent=1)
        results.append(result)
        del model
    return results
