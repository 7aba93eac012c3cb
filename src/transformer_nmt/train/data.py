"""What training reads and what it reports about it at start-up: the prepared files
(:func:`check_data`: one line naming the first missing one and the command that makes it),
the binarized splits as :class:`~transformer_nmt.data.batching.ParallelDataset`, and the real
(non-pad) tokens a step holds. The data is prepared by ``nmt-prepare``, never here."""

from __future__ import annotations

import logging
from pathlib import Path

from transformer_nmt.config import Config
from transformer_nmt.data.batching import LengthBucketSampler, ParallelDataset
from transformer_nmt.data.binarize import TokenDataset
from transformer_nmt.errors import MissingDataError
from transformer_nmt.fileio import bin_prefix, spm_model_path

log = logging.getLogger(__name__)


def required_files(cfg: Config) -> list[Path]:
    """The prepared files training reads: the SentencePiece model and the binarized
    ``.bin`` / ``.idx`` of the train and valid splits, both languages."""
    d = cfg.data
    needed = [spm_model_path(d)]
    for split in (d.train_split, d.valid_split):
        for lang in (d.src_lang, d.tgt_lang):
            prefix = bin_prefix(d, split, lang)
            needed += [Path(f"{prefix}.bin"), Path(f"{prefix}.idx")]
    return needed


def data_ready(cfg: Config) -> bool:
    """True when every file of :func:`required_files` exists."""
    return all(p.is_file() for p in required_files(cfg))


def check_data(cfg: Config) -> None:
    """Raise :class:`MissingDataError` (one line: the first missing file and the command that
    makes it) unless the prepared data exists."""
    missing = [p for p in required_files(cfg) if not p.is_file()]
    if missing:
        exp = cfg.name
        raise MissingDataError(
            f"prepared data not found: {missing[0]}"
            f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; run "
            f"`nmt-prepare experiment={exp or '<experiment>'}` with the same data overrides "
            f"(or `make data EXP={exp or '<experiment>'}`) first"
        )


def load_split(cfg: Config, split: str) -> ParallelDataset:
    """The binarized ``split`` as a :class:`ParallelDataset` (source and target)."""
    d = cfg.data
    src = TokenDataset(bin_prefix(d, split, d.src_lang))
    tgt = TokenDataset(bin_prefix(d, split, d.tgt_lang))
    return ParallelDataset(src, tgt)


def real_tokens_per_step(sampler: LengthBucketSampler, update_freq: int,
                         world_size: int) -> tuple[float, float]:
    """Mean real (non-pad, eos included) ``(source, target)`` tokens per optimizer step:
    the sampler's mean per batch x ``update_freq`` x ``world_size``."""
    src, tgt = sampler.real_tokens_per_batch
    return src * update_freq * world_size, tgt * update_freq * world_size


def log_data_report(cfg: Config, sampler: LengthBucketSampler, train_set: ParallelDataset,
                    valid_set: ParallelDataset, vocab_size: int, steps_per_epoch: int,
                    world_size: int) -> None:
    """Log the real tokens a step holds (:func:`real_tokens_per_step`) and the data's sizes."""
    t_cfg = cfg.trainer
    src_step, tgt_step = real_tokens_per_step(sampler, t_cfg.update_freq, world_size)
    log.info(
        "a step holds %s real source and %s real target tokens on average (max_tokens %d "
        "padded x %d micro-batches x %d ranks, over every batch of an epoch)",
        f"{src_step:,.0f}", f"{tgt_step:,.0f}", t_cfg.max_tokens, t_cfg.update_freq,
        world_size,
    )
    log.info(
        "data %s: %d train pairs in %d batches/rank/epoch (%d steps/epoch), %d valid pairs, "
        "vocab %d, padding efficiency %.3f",
        cfg.data.name, len(train_set), len(sampler), steps_per_epoch, len(valid_set),
        vocab_size, sampler.padding_efficiency,
    )
