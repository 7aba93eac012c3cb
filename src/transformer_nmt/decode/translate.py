"""Text in, text out: SentencePiece ids -> length-sorted batches -> beam search -> text.

Pipeline position: train -> average -> **translate** -> bleu -> table.

:func:`translate_lines` keeps the input order: lines are encoded, bucketed by length into
token-budget batches (``batching.LengthBucketSampler`` with ``shuffle=False``, so batches
hold sentences of similar length and little padding), decoded (paper section 6.1: beam 4,
alpha 0.6, max length source + 50) and written back to their input positions.

Robustness: an empty (or whitespace-only) line translates to an empty line and never
reaches the model; a line longer than ``decode.max_input_tokens`` pieces (or than a model
with learned positions has positions for: :func:`input_limit`) is truncated with a warning
naming the line, and the count of truncated lines is logged; a batch that runs out of GPU memory is
split in halves and retried.

Progress: a bar over the sentences on a terminal's standard error, else a log line every 30 s
(:mod:`transformer_nmt.decode.progress`). Speed is reported as sentences per second and
target tokens per second (generated SentencePiece pieces, the final ``eos`` included),
wall-clock time over encoding, batching, search and decoding back to text.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from transformer_nmt.checkpoint import check_vocab, load_model, non_finite_parameters
from transformer_nmt.config import Config, DecodeConfig, Engine
from transformer_nmt.data.batching import LengthBucketSampler, collate
from transformer_nmt.data.bpe import load_tokenizer
from transformer_nmt.decode.beam_search import (
    Hypothesis,
    NonFiniteScoresError,
    beam_search,
    greedy_search,
)
from transformer_nmt.decode.prepack import is_prepacked
from transformer_nmt.decode.progress import decode_progress
from transformer_nmt.decode.quantize import INT8, check_int8_device, decoding_model, is_quantized
from transformer_nmt.errors import UserError
from transformer_nmt.fileio import (
    check_output,
    iter_lines,
    read_lines,
    spm_model_path,
    write_error,
    write_output,
)
from transformer_nmt.model.transformer import sdpa_backends, sdpa_context
from transformer_nmt.run.model_file import resolve_checkpoint
from transformer_nmt.runtime import autocast_context, device_name, resolve_device

log = logging.getLogger(__name__)

EngineFactory = Callable[[Any, Path, Config, torch.device], Any]
"""``(model, checkpoint, cfg, device) -> model``: another decoding engine in place of ``model``
as ``decode.engine`` says (:func:`transformer_nmt.interop.ctranslate2.decode_engine`), passed in
by the command line so that decoding never imports interop."""


@contextlib.contextmanager
def non_finite_scores_named(checkpoint: str | Path, model: Any, precision: str):
    """Turn a search's :class:`NonFiniteScoresError` into a UserError naming the checkpoint
    and the cause: parameters that are not all finite, or logits that overflow ``precision``.
    """
    try:
        yield
    except NonFiniteScoresError as e:
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
    unless the model carries its own (:meth:`Transformer.set_sdpa_backends`, a training run's);
    the search reads its finished flags every ``decode_cfg.sync_every`` steps, and runs its
    decoder step compiled where ``decode_cfg.compile`` says.

    Returns:
        Per sentence, up to ``decode_cfg.nbest`` hypotheses, best first.
    """
    names = getattr(decode_cfg, "sdpa_backends", None)
    sync_every = getattr(decode_cfg, "sync_every", None)
    compile_step = getattr(decode_cfg, "compile", False)
    with sdpa_context(sdpa_backends(names) if names is not None else None):
        if decode_cfg.beam_size == 1:
            return greedy_search(model, src_tokens, decode_cfg.max_len_a, decode_cfg.max_len_b,
                                 sync_every=sync_every, compile_step=compile_step)
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
            sync_every=sync_every,
            compile_step=compile_step,
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
        log.warning("out of GPU memory on a batch of %d sentences; splitting it",
                    src_tokens.size(0))
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
    progress: Callable[[int], None] | None = None,
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
        progress: called after each batch with its number of sentences (a host-side count).

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
            if progress is not None:
                progress(len(batch_indices))
    return best, n_batches


def input_limit(decode_cfg: DecodeConfig, model_cfg: Any = None,
                max_positions: int | None = None) -> tuple[int, str]:
    """The most source tokens (eos not counted) a line may have, and the settings that say so.

    ``decode.max_input_tokens`` and ``decode.max_tokens - 1``, and, for a model with learned
    positions (``model_cfg.positions``) or a position table of fixed size
    (``max_positions``: CTranslate2's copy of ours), ``max_positions - 1`` (the source and its
    eos must have positions; a trained model's table cannot grow).

    Returns:
        ``(limit, why)``: ``why`` names the settings, e.g. ``"decode.max_input_tokens=1024,
        decode.max_tokens=4096, model.max_positions=64 with learned positions"``.
    """
    limit = max(1, min(int(decode_cfg.max_input_tokens), int(decode_cfg.max_tokens) - 1))
    why = (f"decode.max_input_tokens={decode_cfg.max_input_tokens}, "
           f"decode.max_tokens={decode_cfg.max_tokens}")
    if max_positions is None and model_cfg is not None:
        kind = getattr(model_cfg, "positions", None)
        if str(getattr(kind, "value", kind)) == "learned":
            max_positions = int(model_cfg.max_positions)
            why += f", model.max_positions={max_positions} with learned positions"
    elif max_positions is not None:
        why += f", model.max_positions={max_positions} of the converted model"
    if max_positions is not None:
        limit = max(1, min(limit, int(max_positions) - 1))
    return limit, why


def warn_truncated(truncated: int, total: int, limit: int, why: str) -> None:
    """One warning that counts the lines :func:`input_limit` cut (none when nothing was)."""
    if truncated:
        log.warning("%d of %d lines were longer than %d source tokens (%s) and were "
                    "translated truncated; split them to translate them whole",
                    truncated, total, limit, why)


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
            (:class:`transformer_nmt.data.bpe.SentencePieceTokenizer`); its
            ``detokenize(lines)``, when it has one, turns the decoded text into the output
            (Moses detokenization for data prepared with ``data.pretokenize=moses``).
        lines: source sentences as the data stage wrote them (a trailing newline is ignored).
        decode_cfg: :class:`transformer_nmt.config.DecodeConfig` (beam_size, lenpen,
            lenpen_form, max_len_a, max_len_b, nbest, max_tokens = source tokens per batch,
            max_input_tokens, precision).
        device: where the model lives; None = the device of its parameters.
        return_hypotheses: return, per line, the n-best list ``[(text, score), ...]``
            instead of the best text (an empty line gives ``[("", 0.0)]``).

    Returns:
        ``(outputs, stats)``: one output per input line; stats has ``sentences``,
        ``empty``, ``truncated``, ``target_tokens``, ``seconds``, ``sentences_per_second``,
        ``target_tokens_per_second``, ``batches``, ``device``, ``hardware`` (the GPU's name, or
        the CPU's model, vector instructions and threads: :func:`transformer_nmt.runtime.
        device_name`), ``precision``, ``weight_prepack`` (the linear weights ran packed:
        :mod:`transformer_nmt.decode.prepack`), ``beam_size``.

    Raises:
        ValueError: ``decode_cfg.precision`` int8 with a model that is not quantized, or
            another precision with one that is (:func:`transformer_nmt.decode.quantize.
            decoding_model` makes the model for a precision).
    """
    detokenize = getattr(tokenizer, "detokenize", None) or list  # data.pretokenize=moses
    # decode.engine=ctranslate2 (interop/ctranslate2.py)
    if getattr(model, "is_ctranslate2", False):
        outputs, stats = model.translate_lines(tokenizer, lines, decode_cfg, return_hypotheses)
        if return_hypotheses:
            return [list(zip(detokenize([t for t, _ in h]), [s for _, s in h]))
                    for h in outputs], stats
        return detokenize(outputs), stats
    device = torch.device(device) if device is not None else next(model.parameters()).device
    if (str(decode_cfg.precision) == INT8) != is_quantized(model):
        raise ValueError(f"decode.precision={decode_cfg.precision} with a model "
                         f"{'not ' if str(decode_cfg.precision) == INT8 else ''}quantized to "
                         "int8; decoding_model() gives the model for a precision")
    start = time.perf_counter()
    limit, why = input_limit(decode_cfg, getattr(model, "cfg", None))
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
            log.warning("line %d has %d source tokens, more than the %d allowed (%s); truncated",
                        i + 1, len(pieces), limit, why)
            pieces = pieces[:limit]
            truncated += 1
        if not pieces:
            empty += 1
            continue
        ids.append(np.asarray(pieces, dtype=np.int64))
        positions.append(i)

    with decode_progress(len(ids)) as progress:
        best, n_batches = decode_ids(
            ids, lambda src: _search_splitting_on_oom(model, src, decode_cfg),
            decode_cfg.max_tokens, device,
            autocast=lambda: autocast_context(decode_cfg.precision, device),
            progress=progress.update,
        )

    outputs: list[Any] = [[("", 0.0)] if return_hypotheses else "" for _ in lines]
    target_tokens = 0
    for j, hyps in enumerate(best):
        target_tokens += len(hyps[0].tokens) + 1
        texts = detokenize([tokenizer.decode(h.tokens) for h in hyps])
        if return_hypotheses:
            outputs[positions[j]] = [(text, h.score) for text, h in zip(texts, hyps)]
        else:
            outputs[positions[j]] = texts[0]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    warn_truncated(truncated, len(lines), limit, why)
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
        "hardware": device_name(device),
        "precision": decode_cfg.precision,
        "weight_prepack": is_prepacked(model),
        "beam_size": decode_cfg.beam_size,
    }
    log.info(
        "translated %d sentences (%d empty, %d truncated) in %.2f s on %s (%s, beam %d): "
        "%.1f sentences/s, %.0f target tokens/s",
        len(lines), empty, truncated, seconds, device, decode_cfg.precision,
        decode_cfg.beam_size, stats["sentences_per_second"], stats["target_tokens_per_second"],
    )
    return outputs, stats


def read_input(path: str | Path | None) -> list[str]:
    """The lines of ``translate.input``: a UTF-8 file (plain or gzip), a pipe or a device, or
    standard input when None, without their endings.

    The data stage's rule (:func:`transformer_nmt.fileio.iter_lines`): ``\\n`` or
    ``\\r\\n`` ends a line, a lone ``\\r`` stays inside it, so there is one output line
    per input line. A FIFO or a character device (``<(cmd)``, ``/dev/stdin``, ``/dev/null``)
    is read as a stream, once (gzip recognised by its first bytes too).

    Raises:
        FileNotFoundError: naming the path.
        UserError: the path is a folder, a socket or a block device (named as such).
        DataError (a ValueError): naming the file and line number of invalid UTF-8.
    """
    if path is None:
        return list(iter_lines(sys.stdin.buffer, "<stdin>", hint=None))
    kind = path_kind(path)
    if kind == "missing":
        raise FileNotFoundError(f"translate.input={path}: no such file")
    if kind == "file":
        return list(read_lines(path, hint=None))
    if kind not in ("FIFO", "character device"):
        raise UserError(f"translate.input={path} is a {kind}, not a text file; give a file, a "
                        "pipe, or leave translate.input unset to read standard input")
    with open(path, "rb") as raw:
        stream = gzip.GzipFile(fileobj=raw) if raw.peek(2)[:2] == b"\x1f\x8b" else raw
        return list(iter_lines(stream, str(path), hint=None))


def path_kind(path: str | Path) -> str:
    """What ``path`` names, through symlinks: ``file``, ``folder``, ``FIFO``, ``character
    device``, ``block device``, ``socket`` or ``missing``."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "missing"
    for test, kind in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return "special file"


def write_lines(lines: Iterable[str], path: str | Path | None) -> None:
    """Write one line per item to ``path`` (:func:`transformer_nmt.fileio.write_output`:
    atomically for a regular file, in place for a FIFO or device, through symlinks), or to
    standard output when None.

    Raises:
        WriteError: the file or standard output (``> /dev/full``) cannot take the bytes for a
            cause the user fixes (full disk, quota, file-size limit, read-only file system);
            standard output is then pointed at ``/dev/null`` so that the interpreter's final
            flush stays silent.
    """
    if path is None:
        try:
            for line in lines:
                sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            raise
        except OSError as e:
            error = write_error(e, "<standard output>")
            if error is None:
                raise
            _stdout_to_devnull()
            raise error from e
        return
    with write_output(path, what="translate.output") as f:
        for line in lines:
            f.write(line + "\n")


def _stdout_to_devnull() -> None:
    """Drop what standard output still buffers and point it at /dev/null."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def translate_file(
    model: Any,
    tokenizer: Any,
    decode_cfg: DecodeConfig,
    device: str | torch.device | None = None,
    input_path: str | Path | None = None,
    output_path: str | Path | None = None,
) -> dict[str, Any]:
    """Translate a file (or standard input) to a file (or standard output).

    Input lines are lowercased and Moses-tokenized first when the data was
    (``tokenizer.preprocess``). With ``decode_cfg.nbest > 1`` each input line gives ``nbest`` lines
    ``<line number, 0-based> ||| <translation> ||| <score>`` (the Moses n-best layout).

    Returns:
        The stats of :func:`translate_lines`.
    """
    lines = read_input(input_path)
    if hasattr(tokenizer, "preprocess"):  # data.lowercase, data.pretokenize
        lines = tokenizer.preprocess(lines)
    if decode_cfg.nbest > 1 and decode_cfg.beam_size > 1:
        nbest, stats = translate_lines(
            model, tokenizer, lines, decode_cfg, device, return_hypotheses=True
        )
        out = [f"{i} ||| {text} ||| {score:.4f}"
               for i, hyps in enumerate(nbest) for text, score in hyps]
    else:
        out, stats = translate_lines(model, tokenizer, lines, decode_cfg, device)
    write_lines(out, output_path)
    return stats


def check_standard_streams(input_path: str | Path | None, output_path: str | Path | None) -> None:
    """Check that standard input (output) is open where it is read (written): a process
    started with it closed (``<&-``, ``>&-``) has none.

    Raises:
        UserError: standard input closed and no ``translate.input``, or standard output closed
            and no ``translate.output``.
    """
    if input_path is None and sys.stdin is None:
        raise UserError("standard input is closed (<&-) and translate.input is not set: nothing "
                        "to translate; give translate.input=FILE or pipe the text in")
    if output_path is None and sys.stdout is None:
        raise UserError("standard output is closed (>&-) and translate.output is not set: the "
                        "translations would be lost; give translate.output=FILE")


def translate(cfg: Config, engine: EngineFactory | None = None) -> dict[str, Any]:
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
            infinite scores (named); ``translate.output`` a folder, the input, the model, the
            tokenizer, any ``.pt``/``.safetensors`` file or a file in a run's ``checkpoints/``
            (:func:`transformer_nmt.fileio.check_output`); a device not present; standard
            input or output closed where it is used (:func:`check_standard_streams`);
            ``decode.precision=int8`` on a GPU or with a model it cannot quantize.
    """
    if engine is None and cfg.decode.engine != Engine.native:
        raise UserError(f"decode.engine={cfg.decode.engine} is decoded by nmt-translate / "
                        "nmt-evaluate; this call decodes with ours only")
    check_standard_streams(cfg.translate.input, cfg.translate.output)
    output = cfg.translate.output
    if output is not None:  # found before decoding, not after
        check_output(output, "translate.output",
                     inputs=(cfg.translate.input, spm_model_path(cfg.data)))
    device = resolve_device(cfg.decode.device)
    if cfg.decode.precision == INT8 and cfg.decode.engine == Engine.native:
        check_int8_device(device)  # before the model is read
    path = resolve_checkpoint(cfg)
    if output is not None:
        check_output(output, "translate.output", inputs=(path,))
    tokenizer = load_tokenizer(cfg.data)
    check_vocab(path, tokenizer)  # before any engine conversion reads the tokenizer
    model, _ = load_model(path, device)
    if engine is not None:
        model = engine(model, path, cfg, device)  # itself unless decode.engine says otherwise
    model = decoding_model(model, cfg.decode, device, path)  # int8: quantized, once
    log.info("decoding with %s on %s", path, device)
    with non_finite_scores_named(path, model, cfg.decode.precision):
        stats = translate_file(model, tokenizer, cfg.decode, device, cfg.translate.input,
                               cfg.translate.output)
    stats["checkpoint"] = str(path)
    return stats
