"""Collate: example lists to padded tensors (:class:`Batch`), the last step before the model.

Pipeline position: batching (:class:`~transformer_nmt.data.batching.LengthBucketSampler`
gives the indices) -> **collate** -> train / translate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from transformer_nmt.config import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Batch:
    """One padded batch (PAD_ID on the right).

    Fields (B sentences, S = longest source + 1, T = longest target + 1):
        ids: (B,) long, example indices (to restore input order after decoding).
        src_tokens: (B, S) long, ``src + [eos]``.
        src_lengths: (B,) long, source lengths including eos.
        tgt_in: (B, T) long, ``[bos] + tgt`` (decoder input); None without target.
        tgt_out: (B, T) long, ``tgt + [eos]`` (decoder output); None without target.
        ntokens: non-pad target tokens (``tgt_out != PAD_ID``); 0 without target.
        nsentences: B.

    A packed batch (:func:`transformer_nmt.data.packing.collate_packed`) holds its B
    sentences in R rows of L positions: ``src_tokens``, ``tgt_in``, ``tgt_out`` are (R, L),
    and it also has ``tgt_lengths`` (B,) and the (R, L) ``src_segments``, ``src_positions``,
    ``tgt_segments``, ``tgt_positions``; these are None in a padded batch.
    """

    ids: torch.Tensor
    src_tokens: torch.Tensor
    src_lengths: torch.Tensor
    tgt_in: torch.Tensor | None
    tgt_out: torch.Tensor | None
    ntokens: int
    nsentences: int
    tgt_lengths: torch.Tensor | None = None
    src_segments: torch.Tensor | None = None
    src_positions: torch.Tensor | None = None
    tgt_segments: torch.Tensor | None = None
    tgt_positions: torch.Tensor | None = None

    @property
    def packed(self) -> bool:
        """True for a packed batch (segments and positions per sentence)."""
        return self.src_segments is not None

    def _map(self, fn) -> Batch:
        values = {}
        for f in fields(self):
            v = getattr(self, f.name)
            values[f.name] = fn(v) if isinstance(v, torch.Tensor) else v
        return Batch(**values)

    def to(self, device: torch.device | str, non_blocking: bool = True) -> Batch:
        """A copy with every tensor on ``device`` (asynchronous from pinned memory)."""
        return self._map(lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """A copy with every tensor in page-locked memory (``DataLoader(pin_memory=True)``)."""
        return self._map(lambda t: t.pin_memory())


def _pad_rows(seqs: list[np.ndarray], lengths: np.ndarray, width: int, offset: int) -> np.ndarray:
    """(B, width) int64 PAD_ID array with ``seqs[b]`` written at columns ``offset..``."""
    out = np.full((len(seqs), width), PAD_ID, dtype=np.int64)
    cols = np.arange(width)
    mask = (cols >= offset) & (cols < (lengths + offset)[:, None])  # (B, width)
    if lengths.sum():
        out[mask] = np.concatenate(seqs)  # row-major fill = concatenation order
    return out


def _round_up(width: int, multiple: int, max_length: int | None) -> int:
    """``width`` rounded up to a multiple of ``multiple``, not beyond ``max_length`` (never
    below ``width``)."""
    rounded = -(-width // multiple) * multiple
    if max_length is not None:
        rounded = min(rounded, max(width, max_length))
    return rounded


def collate(
    samples: Sequence[tuple[int, np.ndarray, np.ndarray | None]],
    pad_to_multiple: int = 1,
    max_length: int | None = None,
) -> Batch | None:
    """Pad ``(i, src_ids, tgt_ids)`` samples into a :class:`Batch`.

    Source rows are ``src + [eos]``; target rows are ``[bos] + tgt`` (``tgt_in``) and
    ``tgt + [eos]`` (``tgt_out``); all right-padded with PAD_ID. An empty sample list
    (the ``[]`` batch a rank gets when it has no data left in an epoch) gives None.

    ``pad_to_multiple``: the padded source and target lengths are rounded up to a multiple
    of it (training uses 8, ``trainer.pad_to_multiple``: fewer distinct shapes for
    ``torch.compile`` and tensor-core-sized matrices), but not beyond ``max_length`` (the
    model's ``max_positions``) when given. The extra positions are padding: nothing the
    model computes for real positions changes.

    Raises:
        ValueError: when some samples have a target and others do not.
    """
    if len(samples) == 0:
        return None
    ids = np.fromiter((s[0] for s in samples), dtype=np.int64, count=len(samples))
    srcs = [np.asarray(s[1], dtype=np.int64) for s in samples]
    src_sizes = np.fromiter((len(s) for s in srcs), dtype=np.int64, count=len(srcs))
    b = len(samples)
    rows = np.arange(b)

    multiple = max(int(pad_to_multiple), 1)
    src_width = _round_up(int(src_sizes.max()) + 1, multiple, max_length)
    src_tokens = _pad_rows(srcs, src_sizes, src_width, 0)  # (B, S)
    src_tokens[rows, src_sizes] = EOS_ID

    has_tgt = [s[2] is not None for s in samples]
    if any(has_tgt) and not all(has_tgt):
        missing = [int(ids[k]) for k, h in enumerate(has_tgt) if not h]
        raise ValueError(f"examples {missing[:5]} have no target but others in the batch do")
    tgt_in = tgt_out = None
    ntokens = 0
    if all(has_tgt):
        tgts = [np.asarray(s[2], dtype=np.int64) for s in samples]
        tgt_sizes = np.fromiter((len(t) for t in tgts), dtype=np.int64, count=b)
        width = _round_up(int(tgt_sizes.max()) + 1, multiple, max_length)
        tgt_in_np = _pad_rows(tgts, tgt_sizes, width, 1)  # (B, T)
        tgt_in_np[:, 0] = BOS_ID
        tgt_out_np = _pad_rows(tgts, tgt_sizes, width, 0)  # (B, T)
        tgt_out_np[rows, tgt_sizes] = EOS_ID
        tgt_in = torch.from_numpy(tgt_in_np)
        tgt_out = torch.from_numpy(tgt_out_np)
        ntokens = int(tgt_sizes.sum()) + b

    return Batch(
        ids=torch.from_numpy(ids),
        src_tokens=torch.from_numpy(src_tokens),
        src_lengths=torch.from_numpy(src_sizes + 1),
        tgt_in=tgt_in,
        tgt_out=tgt_out,
        ntokens=ntokens,
        nsentences=b,
    )
