"""Validation during training: label-smoothed loss / perplexity and greedy BLEU on the valid split.

BLEU decodes with the same core as ``nmt-translate``
(:func:`transformer_nmt.decode.translate.decode_ids`).
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any

import torch
from torch.utils.data import DataLoader

from transformer_nmt.config import PAD_ID, Config
from transformer_nmt.data.batching import ParallelDataset
from transformer_nmt.decode.beam_search import greedy_search
from transformer_nmt.decode.translate import decode_ids
from transformer_nmt.fileio import raw_path
from transformer_nmt.train import distributed
from transformer_nmt.train.loss import label_smoothed_nll_loss
from transformer_nmt.train.state import TrainState

log = logging.getLogger(__name__)


@torch.no_grad()
def validate_loss(
    model: torch.nn.Module,
    loader: DataLoader,
    *,
    epsilon: float,
    device: torch.device,
    autocast: Any = contextlib.nullcontext,
    max_batches: int | None = None,
) -> dict[str, float]:
    """Label-smoothed loss, NLL and perplexity on the valid split, summed over ranks.

    Returns:
        ``{"loss": smoothed loss per target token (nats), "nll_loss": NLL per token (nats),
        "ppl": exp(nll_loss), "ntokens": tokens scored over all ranks}``.
    """
    was_training = model.training
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, nll, ntokens
    for i, batch in enumerate(loader):
        if max_batches is not None and i >= max_batches:
            break
        if batch is None:
            continue
        batch = batch.to(device)
        keep = batch.tgt_out.ne(PAD_ID)  # (B, T)
        with autocast():
            logits = model(batch.src_tokens, batch.tgt_in, keep)  # (N, V)
        loss, nll = label_smoothed_nll_loss(logits, batch.tgt_out[keep], epsilon, ignore_index=None)
        sums += torch.stack([loss.double(), nll.double(), torch.tensor(
            float(batch.ntokens), dtype=torch.float64, device=device)])
    distributed.all_reduce_sum(sums)
    model.train(was_training)
    n = max(float(sums[2]), 1.0)
    nll_loss = float(sums[1]) / n
    return {
        "loss": float(sums[0]) / n,
        "nll_loss": nll_loss,
        "ppl": math.exp(min(nll_loss, 100.0)),
        "ntokens": float(sums[2]),
    }


@torch.no_grad()
def validate_bleu(
    model: torch.nn.Module,
    dataset: ParallelDataset,
    references: list[str],
    tokenizer: Any,
    cfg: Config,
    device: torch.device,
    autocast: Any = contextlib.nullcontext,
) -> float:
    """sacreBLEU of greedy translations of the first ``len(references)`` valid sentences.

    Batches hold at most ``cfg.decode.max_tokens`` source tokens; a sentence longer than
    that, or longer than ``model.max_positions``, is left out of the batches and scored as
    an empty translation. Length limit:
    ``decode.max_len_a * source length + decode.max_len_b``.
    """
    import sacrebleu

    n = len(references)
    was_training = model.training
    model.eval()
    max_len_a, max_len_b = cfg.decode.max_len_a, cfg.decode.max_len_b
    # a source beyond the position table (learned positions: no vector for it) is left out
    # of the decoding, as the validation loss leaves it out, and scored as empty
    limit = int(getattr(getattr(model, "cfg", None), "max_positions", 0) or 0)
    fits = [i for i in range(n) if not limit or len(dataset[i][1]) + 1 <= limit]
    nbest, _ = decode_ids(
        [dataset[i][1] for i in fits],
        lambda src: greedy_search(model, src, max_len_a=max_len_a, max_len_b=max_len_b),
        cfg.decode.max_tokens, device, autocast=autocast, skip_too_long=True,
    )
    hyps = [""] * n
    for i, h in zip(fits, nbest):
        hyps[i] = tokenizer.decode(h[0].tokens) if h else ""
    model.train(was_training)
    return float(sacrebleu.corpus_bleu(hyps, [references]).score)


def valid_references(cfg: Config, dataset: ParallelDataset, tokenizer: Any, n: int) -> list[str]:
    """The first ``n`` valid targets as text: the cleaned text file, else decoded ids."""
    path = raw_path(cfg.data, cfg.data.valid_split, cfg.data.tgt_lang)
    n = min(n, len(dataset))
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for _, line in zip(range(n), f)]
        if len(lines) == n:
            return lines
    return [tokenizer.decode(dataset[i][2]) for i in range(n)]


def run_validation(cfg: Config, model: torch.nn.Module, loader: DataLoader,
                   dataset: ParallelDataset, tokenizer: Any, state: TrainState, *,
                   device: torch.device, autocast: Any,
                   is_main: bool, references: list[str],
                   max_batches: int | None = None) -> tuple[dict[str, float], bool]:
    """One validation of the training loop: loss on every rank, BLEU on rank 0 (broadcast)
    when ``trainer.valid_bleu``; updates ``state``'s best results and patience counter.

    The best validation is the lowest loss, or with ``trainer.valid_bleu`` the highest BLEU.

    Returns:
        ``(results, improved)``: :func:`validate_loss`'s dict (plus ``"bleu"``) and whether
        this validation is the best so far.
    """
    t_cfg = cfg.trainer
    res = validate_loss(model, loader, epsilon=t_cfg.label_smoothing, device=device,
                        autocast=autocast, max_batches=max_batches)
    if t_cfg.valid_bleu:
        bleu = None
        if is_main:
            bleu = validate_bleu(model, dataset, references, tokenizer, cfg, device, autocast)
        res["bleu"] = distributed.broadcast_object(bleu)
    if res["ntokens"] == 0:  # nothing scored: no loss to compare, never the best
        log.warning("valid step %d: no validation token was scored", state.step)
        return {}, False
    loss_improved = state.best_valid_loss is None or res["loss"] < state.best_valid_loss
    if loss_improved:
        state.best_valid_loss = res["loss"]
    improved = loss_improved
    if t_cfg.valid_bleu:
        improved = state.best_valid_bleu is None or res["bleu"] > state.best_valid_bleu
        if improved:
            state.best_valid_bleu = res["bleu"]
    state.validations_without_improvement = (
        0 if improved else state.validations_without_improvement + 1
    )
    log.info(
        "valid step %d | loss %.4f | nll %.4f | ppl %.2f%s%s", state.step, res["loss"],
        res["nll_loss"], res["ppl"],
        f" | bleu {res['bleu']:.2f}" if "bleu" in res else "", " | best" if improved else "",
    )
    return res, improved
