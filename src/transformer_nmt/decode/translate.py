"""Text in, text out: SentencePiece ids -> length-sorted batches -> beam search -> text.

Pipeline position: train -> average -> **translate** -> bleu -> table.

:func:`translate_lines` keeps the input order: lines are encoded, bucketed by length into
token-budget batches (``batching.LengthBucketSampler`` with ``shuffle=False``, so batches
hold sentences of similar length and little padding), decoded (paper section 6.1: beam 4,
alpha 0.6, max length source + 50) and written back to their input positions.

Robustness: an empty (or whitespace-only) line translates to an empty line and never
reaches the model; a line longer than ``decode.max_input_tokens`` pieces is truncated
with a warning naming the line; a batch that runs out of GPU memory is split in halves
and retried.

Speed is reported as sentences per second and target tokens per second (generated
SentencePiece pieces, the final ``eos`` included), wall-clock time over encoding,
batching, search and decoding back to text.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer_nmt.checkpoint import AVERAGED_NAME, checkpoint_dir, latest_checkpoint
from transformer_nmt.config import Config, DecodeConfig
from transformer_nmt.data.batching import LengthBucketSampler, collate
from transformer_nmt.data.bpe import load_tokenizer
from transformer_nmt.decode.beam_search import (
    Hypothesis,
    NonFiniteScoresError,
    beam_search,
    greedy_search,
)
from transformer_nmt.errors import UserError
from transformer_nmt.fileio import atomic_write, iter_lines
from transformer_nmt.fileio import read_lines as fileio_read_lines
from transformer_nmt.model.transformer import sdpa_backends, sdpa_context
from transformer_nmt.runtime import autocast_context, resolve_device

log = logging.getLogger(__name__)

def resolve_checkpoint(cfg: Config) -> Path:
    """The model file to decode with.

    Order: ``cfg.decode.checkpoint``; else ``<run_dir>/checkpoints/averaged.pt``; else the
    run's latest ``checkpoint_<step>.pt``.

    Raises:
        FileNotFoundError: naming what was looked for.
    """
    if cfg.decode.checkpoint:
        path = Path(cfg.decode.checkpoint)
        if not path.is_file():
            raise FileNotFoundError(f"decode.checkpoint={path} does not exist")
        return path
    folder = checkpoint_dir(cfg.run_dir)
    averaged = folder / AVERAGED_NAME
    latest = latest_checkpoint(cfg.run_dir)
    if averaged.is_file():
        if latest is not None and latest.stat().st_mtime > averaged.stat().st_mtime:
            log.warning(
                "%s is older than %s; run nmt-average again to include the newest checkpoints",
                averaged, latest.name,
            )
        return averaged
    if latest is not None:
        log.info("no %s in %s; decoding with the latest checkpoint %s", AVERAGED_NAME, folder,
                 latest.name)
        return latest
    raise FileNotFoundError(
        f"no model to decode with: decode.checkpoint is unset, {averaged} does not exist and "
        f"{folder} holds no checkpoint_<step>.pt (train first, or set decode.checkpoint=PATH)"
    )


@contextlib.contextmanager
def non_finite_scores_named(checkpoint: str | Path, model: Any, precision: str):
    """Turn a search's :class:`NonFiniteScoresError` into a UserError naming the checkpoint
    and the cause: parameters that are not all finite, or logits that overflow ``precision``.
    """
    try:
        yield
    except NonFiniteScoresError as e:
        from transformer_nmt.checkpoint import non_finite_parameters

        params = getattr(model, "state_dict", None)
        bad = non_finite_parameters(params()) if params is not None else []
        if bad:
            cause = (f"{len(bad)} of its parameter tensors hold NaN or inf values (e.g. {bad[0]}); "
                     "decode with an earlier checkpoint (decode.checkpoint=...)")
        else:
            cause = (f"its parameters are finite, so its logits overflow in decode.precision="
                     f"{precision}; decode with decode.precision=fp32")
        raise UserError(f"{checkpoint}: non-finite scores in decoding ({e}): {cause}") from e


def search(model: Any, src_tokens: torch.Tensor, decode_cfg: DecodeConfig
           ) -> list[list[Hypothesis]]:
    """Beam search with ``decode_cfg``'s settings; ``beam_size`` 1 is greedy decoding.

    Args:
        src_tokens: (B, S) long on the model's device.

    The attention runs under ``decode_cfg.sdpa_backends`` (``torch.nn.attention.sdpa_kernel``)
    unless the model carries its own (:meth:`Transformer.set_sdpa_backends`, a training run's).

    Returns:
        Per sentence, up to ``decode_cfg.nbest`` hypotheses, best first.
    """
    names = getattr(decode_cfg, "sdpa_backends", None)
    with sdpa_context(sdpa_backends(names) if names is not None else None):
        if decode_cfg.beam_size == 1:
            return greedy_search(model, src_tokens, decode_cfg.max_len_a, decode_cfg.max_len_b)
        return beam_search(
            model,
            src_tokens,
            beam_size=decode_cfg.beam_size,
            lenpen=decode_cfg.lenpen,
            lenpen_form=decode_cfg.lenpen_form,
            max_len_a=decode_cfg.max_len_a,
            max_len_b=decode_cfg.max_len_b,
            nbest=decode_cfg.nbest,
            stopping=decode_cfg.stopping,
        )


def _search_splitting_on_oom(model, src_tokens, decode_cfg):
    """:func:`search`, halving the batch while the GPU runs out of memory."""
    try:
        return search(model, src_tokens, decode_cfg)
    except torch.cuda.OutOfMemoryError:
        if src_tokens.size(0) == 1:
            raise
        torch.cuda.empty_cache()
        half = src_tokens.size(0) // 2
        log.warning("out of GPU memory on a batch of %d sentences; splitting it", src_tokens.size(0))
        return _search_splitting_on_oom(model, src_tokens[:half], decode_cfg) + (
            _search_splitting_on_oom(model, src_tokens[half:], decode_cfg)
        )


def decode_ids(
    ids: Sequence[np.ndarray],
    search_fn: Callable[[torch.Tensor], list[list[Hypothesis]]],
    max_tokens: int,
    device: torch.device,
    *,
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    skip_too_long: bool = False,
) -> tuple[list[list[Hypothesis]], int]:
    """Decode source id sequences in length-sorted batches; results in input order.

    The decoding core of :func:`translate_lines` and of validation BLEU
    (:func:`transformer_nmt.train.validation.validate_bleu`): sentences are bucketed by length
    into batches of at most ``max_tokens`` source tokens (``LengthBucketSampler``,
    ``shuffle=False``), collated (``src + [eos]``, right-padded) and searched.

    Args:
        ids: source ids per sentence (int64 arrays, no eos): a list or a ``TokenDataset``.
        search_fn: ``(B, S) long src_tokens on device -> per sentence an n-best list``.
        max_tokens: source tokens per batch (padding included, eos counted).
        autocast: a callable returning the autocast context the search runs in.
        skip_too_long: leave sentences longer than ``max_tokens`` undecoded (an empty
            n-best list) instead of raising ValueError.

    Returns:
        ``(nbest, batches)``: per input sentence its n-best list (``[]`` when skipped),
        and the number of batches searched.
    """
    best: list[list[Hypothesis]] = [[] for _ in range(len(ids))]
    if not best:
        return best, 0
    sizes = np.fromiter((len(ids[j]) for j in range(len(ids))), dtype=np.int64, count=len(ids))
    sampler = LengthBucketSampler(sizes, None, int(max_tokens), shuffle=False,
                                  skip_too_long=skip_too_long)
    n_batches = 0
    with autocast():
        for batch_indices in sampler:
            batch = collate([(j, ids[j], None) for j in batch_indices])
            if batch is None:
                continue
            hyps = search_fn(batch.src_tokens.to(device))
            for j, h in zip(batch.ids.tolist(), hyps):
                best[j] = h
            n_batches += 1
    return best, n_batches


def translate_lines(
    model: Any,
    tokenizer: Any,
    lines: Sequence[str],
    decode_cfg: DecodeConfig,
    device: str | torch.device | None = None,
    *,
    return_hypotheses: bool = False,
) -> tuple[list[Any], dict[str, Any]]:
    """Translate lines of text, keeping their order.

    Args:
        model: the Transformer, in eval mode, on ``device``.
        tokenizer: ``encode(str) -> list[int]`` and ``decode(ids) -> str``
            (:class:`transformer_nmt.data.bpe.SentencePieceTokenizer`).
        lines: source sentences (a trailing newline is ignored).
        decode_cfg: :class:`transformer_nmt.config.DecodeConfig` (beam_size, lenpen,
            lenpen_form, max_len_a, max_len_b, nbest, max_tokens = source tokens per batch,
            max_input_tokens, precision).
        device: where the model lives; None = the device of its parameters.
        return_hypotheses: return, per line, the n-best list ``[(text, score), ...]``
            instead of the best text (an empty line gives ``[("", 0.0)]``).

    Returns:
        ``(outputs, stats)``: one output per input line; stats has ``sentences``,
        ``empty``, ``truncated``, ``target_tokens``, ``seconds``, ``sentences_per_second``,
        ``target_tokens_per_second``, ``batches``, ``device``, ``precision``, ``beam_size``.
    """
    if getattr(model, "is_ctranslate2", False):  # decode.engine=ctranslate2 (interop/ctranslate2.py)
        return model.translate_lines(tokenizer, lines, decode_cfg, return_hypotheses)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    start = time.perf_counter()
    limit = max(1, min(int(decode_cfg.max_input_tokens), int(decode_cfg.max_tokens) - 1))
    empty = truncated = 0
    ids: list[np.ndarray] = []  # encoded non-empty lines
    positions: list[int] = []  # their line numbers (0-based)
    for i, line in enumerate(lines):
        text = line.strip()
        if not text:
            empty += 1
            continue
        pieces = tokenizer.encode(text)
        if len(pieces) > limit:
            log.warning(
                "line %d has %d source tokens, more than the %d allowed "
                "(decode.max_input_tokens=%d, decode.max_tokens=%d); truncated",
                i + 1, len(pieces), limit, decode_cfg.max_input_tokens, decode_cfg.max_tokens,
            )
            pieces = pieces[:limit]
            truncated += 1
        if not pieces:
            empty += 1
            continue
        ids.append(np.asarray(pieces, dtype=np.int64))
        positions.append(i)

    best, n_batches = decode_ids(
        ids, lambda src: _search_splitting_on_oom(model, src, decode_cfg),
        int(decode_cfg.max_tokens), device,
        autocast=lambda: autocast_context(decode_cfg.precision, device),
    )

    outputs: list[Any] = [[("", 0.0)] if return_hypotheses else "" for _ in lines]
    target_tokens = 0
    for j, hyps in enumerate(best):
        target_tokens += len(hyps[0].tokens) + 1
        if return_hypotheses:
            outputs[positions[j]] = [(tokenizer.decode(h.tokens), h.score) for h in hyps]
        else:
            outputs[positions[j]] = tokenizer.decode(hyps[0].tokens)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    stats = {
        "sentences": len(lines),
        "empty": empty,
        "truncated": truncated,
        "target_tokens": target_tokens,
        "seconds": seconds,
        "sentences_per_second": len(lines) / seconds if seconds > 0 else float("nan"),
        "target_tokens_per_second": target_tokens / seconds if seconds > 0 else float("nan"),
        "batches": n_batches,
        "device": str(device),
        "precision": decode_cfg.precision,
        "beam_size": decode_cfg.beam_size,
    }
    log.info(
        "translated %d sentences (%d empty, %d truncated) in %.2f s on %s (%s, beam %d): "
        "%.1f sentences/s, %.0f target tokens/s",
        len(lines), empty, truncated, seconds, device, decode_cfg.precision,
        decode_cfg.beam_size, stats["sentences_per_second"], stats["target_tokens_per_second"],
    )
    return outputs, stats


def read_lines(path: str | Path | None) -> list[str]:
    """Lines of a UTF-8 file (plain or gzip; standard input when None), without their endings.

    The data stage's rule (:func:`transformer_nmt.fileio.iter_lines`): ``\\n`` or
    ``\\r\\n`` ends a line, a lone ``\\r`` stays inside it, so there is one output line
    per input line.

    Raises:
        FileNotFoundError: naming the file.
        DataError (a ValueError): naming the file and line number of invalid UTF-8.
    """
    if path is None:
        return list(iter_lines(sys.stdin.buffer, "<stdin>", hint=None))
    if not Path(path).is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    return list(fileio_read_lines(path, hint=None))


def write_lines(lines: Iterable[str], path: str | Path | None) -> None:
    """Write one line per item, atomically to ``path``, or to standard output when None."""
    if path is None:
        for line in lines:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()
        return
    with atomic_write(path) as f:
        for line in lines:
            f.write(line + "\n")


def translate_file(
    model: Any,
    tokenizer: Any,
    decode_cfg: DecodeConfig,
    device: str | torch.device | None = None,
    input_path: str | Path | None = None,
    output_path: str | Path | None = None,
) -> dict[str, Any]:
    """Translate a file (or standard input) to a file (or standard output).

    With ``decode_cfg.nbest > 1`` each input line gives ``nbest`` lines
    ``<line number, 0-based> ||| <translation> ||| <score>`` (the Moses n-best layout).

    Returns:
        The stats of :func:`translate_lines`.
    """
    lines = read_lines(input_path)
    if decode_cfg.nbest > 1 and decode_cfg.beam_size > 1:
        nbest, stats = translate_lines(
            model, tokenizer, lines, decode_cfg, device, return_hypotheses=True
        )
        out = [f"{i} ||| {text} ||| {score:.4f}" for i, hyps in enumerate(nbest) for text, score in hyps]
    else:
        out, stats = translate_lines(model, tokenizer, lines, decode_cfg, device)
    write_lines(out, output_path)
    return stats


def translate(cfg: Config, engine: Callable[..., Any] | None = None) -> dict[str, Any]:
    """``nmt-translate``: load the run's model and translate ``translate.input`` (a file or
    standard input) to ``translate.output`` (a file or standard output).

    Args:
        cfg: the run's config (``decode``, ``data``, ``translate``).
        engine: ``(model, checkpoint, cfg, device) -> model`` that swaps in another decoding
            engine as ``decode.engine`` says (the CLI passes
            :func:`transformer_nmt.interop.ctranslate2.decode_engine`); None = ours only.

    Returns:
        The stats of :func:`translate_lines` plus ``checkpoint``.

    Raises:
        UserError: another ``decode.engine`` than ``native`` without an ``engine``; a
            checkpoint whose vocabulary is not the tokenizer's; a model that gives NaN or
            infinite scores (named); ``translate.output`` a folder; a device not present.
    """
    from transformer_nmt.checkpoint import load_model
    from transformer_nmt.data.bpe import check_vocab

    if engine is None and str(cfg.decode.engine) != "native":
        raise UserError(f"decode.engine={cfg.decode.engine} is decoded by nmt-translate / "
                        "nmt-evaluate; this call decodes with ours only")
    output = cfg.translate.output
    if output is not None and Path(output).is_dir():  # found before decoding, not after
        raise UserError(f"translate.output={output} is a folder; give a file path")
    device = resolve_device(cfg.decode.device)
    path = resolve_checkpoint(cfg)
    tokenizer = load_tokenizer(cfg.data)
    check_vocab(path, tokenizer)  # before any engine conversion reads the tokenizer
    model, _ = load_model(path, device)
    if engine is not None:
        model = engine(model, path, cfg, device)  # itself unless decode.engine says otherwise
    log.info("decoding with %s on %s", path, device)
    with non_finite_scores_named(path, model, cfg.decode.precision):
        stats = translate_file(model, tokenizer, cfg.decode, device, cfg.translate.input,
                               cfg.translate.output)
    stats["checkpoint"] = str(path)
    return stats
