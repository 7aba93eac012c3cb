"""Length-bucketed max-token batches: the sampler and the dataset pair (collate, re-exported
here, is in :mod:`transformer_nmt.data.collate`).

Pipeline position: binarize (``TokenDataset`` per split and language) -> **batching**
-> train / translate.

Paper section 5.1: "Sentence pairs were batched together by approximate sequence
length. Each training batch contained a set of sentence pairs containing
approximately 25000 source tokens and 25000 target tokens." Here the budget is
``max_tokens`` per GPU per micro-batch, counted *with padding*, for the source and
the target each; ``max_tokens x world_size x update_freq`` is the step's budget.

Lengths and costs
    A sentence's length for budgeting is ``size + 1``: the source gets an ``eos``,
    the target becomes ``[bos] + tgt`` (decoder input) and ``tgt + [eos]`` (decoder
    output), each ``size + 1`` long. A batch of ``B`` sentences costs
    ``B x max(source lengths)`` source tokens and ``B x max(target lengths)`` target
    tokens; both must be ``<= max_tokens``.

How batches are formed (:func:`make_batches`)
    1. Sort the examples by (source length, target length); ties are broken by a
       random permutation drawn from ``seed`` (by example index when ``shuffle`` is
       off), so sentences of equal length are mixed across the corpus.
    2. Walk the sorted list and cut it greedily: each batch takes as many next
       examples as fit the budget on both sides.
    3. A batch of at least ``size_multiple`` sentences is trimmed down to a multiple
       of ``size_multiple`` (8 by default, friendly to tensor cores); trimming only
       removes sentences, so the budget still holds. The trimmed sentences start the
       next batch.

Randomness across epochs
    The *composition* of the batches is computed once, from ``seed``; each epoch only
    shuffles the *order* of the batches, from ``(seed, epoch)``. This keeps
    ``len(sampler)`` and the padding efficiency identical in every epoch (so the
    learning-rate schedule and the epoch length are known in advance), and starting
    an epoch costs one permutation of the batch list.

Distributed data parallel
    Every rank builds the same batch list and the same epoch order; after the shuffle,
    batch ``j`` goes to rank ``j % world_size`` (round robin), so each example is seen
    exactly once per epoch over all ranks. Every rank yields ``len(sampler) =
    ceil(num_batches / world_size)`` batches; a rank with no real batch left in the
    last round yields ``[]`` so that all ranks step together (:func:`collate` turns it
    into ``None``).

Resumption
    ``state_dict()`` is ``{"epoch", "position", "seed"}``, ``position`` being the
    number of batches this rank has yielded in the epoch. After
    ``load_state_dict(d)`` the next ``__iter__`` yields the batches of epoch
    ``d["epoch"]`` from ``d["position"]`` on; ``set_epoch(e)`` with another epoch
    starts that epoch from its beginning. As with PyTorch's ``DistributedSampler``,
    the caller calls ``set_epoch`` before each epoch; iterating twice without it
    repeats the epoch.

    A ``DataLoader`` pulls batch indices ahead of the batches the training loop has
    consumed (always with worker processes, which prefetch). The training loop
    therefore counts the batches it has *consumed* and saves
    ``{"epoch": epoch, "position": consumed, "seed": seed}``; the sampler's own
    ``state_dict()`` is exact only when it is iterated directly or through a
    ``DataLoader`` with ``num_workers=0``.

    Another batch layout (another world size, another ``max_tokens`` or padding: a
    requeued job on other GPUs) cannot continue a position counted in batches. The
    position then carries over as the *sentences* consumed in the epoch
    (:meth:`consumed`, saved in the checkpoint): :meth:`resume_epoch` batches the
    sentences the epoch has not yet given with this sampler's budget, shuffles those
    batches from ``(seed, epoch, number consumed)`` and deals them round robin as
    usual, so every sentence of the epoch is still seen once. The next epoch is whole.

Over-long sentences
    A sentence that alone exceeds ``max_tokens`` raises ``ValueError`` naming its
    index, lengths and how many such sentences there are. With
    ``skip_too_long=True`` they are left out instead, with a logged warning; their
    number is ``sampler.num_skipped`` and their indices ``sampler.skipped``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np

from transformer_nmt.data.collate import Batch, collate

__all__ = ["Batch", "LengthBucketSampler", "ParallelDataset", "collate", "make_batches",
           "padding_efficiency"]

log = logging.getLogger(__name__)

# Tags that keep the random streams of batch composition and epoch order apart.
_COMPOSE_TAG = 0x42554B54
_EPOCH_TAG = 0x4550434B
_REST_TAG = 0x52455354


class _Tokens(Protocol):
    """What batching needs from a tokenized split (``binarize.TokenDataset``)."""

    sizes: np.ndarray

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> np.ndarray: ...


# --------------------------------------------------------------------------- dataset


class ParallelDataset:
    """Source and (optional) target token sequences of one split, index-aligned.

    ``ds[i]`` is ``(i, src_ids, tgt_ids)``: ``src_ids`` an ``int64`` array of the
    source ids (no bos/eos), ``tgt_ids`` likewise or ``None`` when there is no target
    (translation of a source-only file).

    Args:
        src: source tokens (a ``binarize.TokenDataset``: ``.sizes``, ``len``, ``[i]``).
        tgt: target tokens with the same number of sentences, or ``None``.

    Raises:
        ValueError: naming both counts when ``src`` and ``tgt`` differ in length.
    """

    def __init__(self, src: _Tokens, tgt: _Tokens | None = None):
        if tgt is not None and len(src) != len(tgt):
            raise ValueError(
                f"source and target differ in length: {len(src)} source sentences "
                f"({getattr(src, 'prefix', 'source')}) vs {len(tgt)} target sentences "
                f"({getattr(tgt, 'prefix', 'target')})"
            )
        self.src = src
        self.tgt = tgt
        self.src_sizes: np.ndarray = np.asarray(src.sizes, dtype=np.int64)
        """(N,) source tokens per sentence, without eos."""
        self.tgt_sizes: np.ndarray | None = (
            None if tgt is None else np.asarray(tgt.sizes, dtype=np.int64)
        )
        """(N,) target tokens per sentence, without bos/eos; None without a target."""

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray, np.ndarray | None]:
        i = int(i)
        src = np.asarray(self.src[i], dtype=np.int64)
        tgt = None if self.tgt is None else np.asarray(self.tgt[i], dtype=np.int64)
        return i, src, tgt


# ------------------------------------------------------------------- pure batching


def _budget_lengths(src_sizes: Any, tgt_sizes: Any) -> tuple[np.ndarray, np.ndarray]:
    """(N,) source and target lengths for budgeting (size + 1; target 0 when absent)."""
    src = np.asarray(src_sizes)
    if src.ndim != 1:
        raise ValueError(f"src_sizes must be one-dimensional, got shape {src.shape}")
    src_len = src.astype(np.int64) + 1
    if tgt_sizes is None:
        return src_len, np.zeros_like(src_len)
    tgt = np.asarray(tgt_sizes)
    if tgt.shape != src.shape:
        raise ValueError(f"src_sizes and tgt_sizes differ in shape: {src.shape} vs {tgt.shape}")
    return src_len, tgt.astype(np.int64) + 1


def _too_long(src_len: np.ndarray, tgt_len: np.ndarray, max_tokens: int) -> np.ndarray:
    """Indices of sentences that alone exceed the budget on either side."""
    return np.flatnonzero((src_len > max_tokens) | (tgt_len > max_tokens))


def _too_long_error(
    bad: np.ndarray, src_len: np.ndarray, tgt_len: np.ndarray, max_tokens: int, has_tgt: bool
) -> ValueError:
    i = int(bad[0])
    tgt_part = f", target length {int(tgt_len[i])} (bos/eos included)" if has_tgt else ""
    more = f"; {len(bad) - 1} more sentence(s) are too long" if len(bad) > 1 else ""
    return ValueError(
        f"example {i} does not fit in max_tokens={max_tokens}: source length "
        f"{int(src_len[i])} (eos included){tgt_part}{more}. Raise max_tokens, filter "
        f"long sentences when cleaning, or pass skip_too_long=True"
    )


def _rounded(lengths: np.ndarray, multiple: int, max_tokens: int) -> np.ndarray:
    """``lengths`` rounded up to a multiple of ``multiple``, none beyond
    ``max(length, max_tokens)``."""
    if multiple <= 1:
        return lengths
    return np.maximum(np.minimum(-(-lengths // multiple) * multiple, max_tokens), lengths)


def _length_order(src_len: np.ndarray, tgt_len: np.ndarray, keep: np.ndarray,
                  rng: np.random.Generator | None) -> np.ndarray:
    """(M,) int64 the indices ``keep`` sorted by source length, then target length; ties
    broken by a random permutation from ``rng`` (permute first, then sort stably), by index
    when None. Radix sort when the key fits in 16 bits."""
    m = len(keep)
    if m == 0:
        return np.zeros(0, np.int64)
    key = src_len * (int(tgt_len.max()) + 1) + tgt_len  # (N,)
    if int(key.max()) < 2**16:
        key = key.astype(np.uint16)
    subset = m < len(key)
    if subset:
        key = key[keep]  # (M,)
    if rng is None:
        local = np.argsort(key, kind="stable")
    else:
        perm = rng.permutation(m)
        local = perm[np.argsort(key[perm], kind="stable")]
    return keep[local] if subset else local.astype(np.int64)  # (M,)


def _bucket(
    src_len: np.ndarray,
    tgt_len: np.ndarray,
    keep: np.ndarray,
    max_tokens: int,
    rng: np.random.Generator | None,
    size_multiple: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Sort ``keep`` by length and cut it into batches.

    Args:
        src_len, tgt_len: (N,) budgeting lengths; every kept one is <= ``max_tokens``.
        keep: (M,) indices to batch.
        rng: tie-breaking generator; None breaks ties by index.

    Returns:
        ``(order, bounds)``: ``order`` (M,) int64 indices in batch order, ``bounds``
        (num_batches + 1,) int64 offsets; batch ``j`` is ``order[bounds[j]:bounds[j+1]]``.
    """
    m = len(keep)
    if m == 0:
        return np.zeros(0, np.int64), np.zeros(1, np.int64)
    order = _length_order(src_len, tgt_len, keep, rng)  # (M,)
    # Sources ascend in the sorted order, so the padded cost of a run of k sentences on
    # either side is at most k x (running max of max(source, target) length); with one
    # budget for both sides the run fits iff that product is <= max_tokens.
    longer = np.maximum(src_len, tgt_len)[order]  # (M,) in batch order

    count = np.arange(1, min(max_tokens, m) + 1, dtype=np.int64)  # candidate batch sizes
    bounds = [0]
    start = 0
    while start < m:
        # The first sentence is in every batch starting here: at most
        # max_tokens // its length sentences fit.
        width = min(m - start, max_tokens // int(longer[start]))
        cost = np.maximum.accumulate(longer[start : start + width]) * count[:width]  # (w,)
        size = int(np.searchsorted(cost, max_tokens, side="right"))  # cost is nondecreasing
        if size >= size_multiple:
            size -= size % size_multiple
        start += size
        bounds.append(start)
    return order, np.asarray(bounds, dtype=np.int64)


def make_batches(
    src_sizes: Sequence[int] | np.ndarray,
    tgt_sizes: Sequence[int] | np.ndarray | None,
    max_tokens: int,
    *,
    seed: int | None = None,
    size_multiple: int = 8,
) -> list[np.ndarray]:
    """Length-bucketed batches of example indices under a padded-token budget.

    Args:
        src_sizes: (N,) source tokens per sentence (no eos).
        tgt_sizes: (N,) target tokens per sentence (no bos/eos), or None.
        max_tokens: budget per batch, counted with padding, for source and target each
            (lengths are size + 1).
        seed: seed of the random tie-break among equal lengths; None = by index.
        size_multiple: batches of at least this many sentences are trimmed to a multiple.

    Returns:
        Batches (int64 index arrays) in length order; every index appears once.

    Raises:
        ValueError: naming the first example that alone exceeds ``max_tokens``.
    """
    src_len, tgt_len = _budget_lengths(src_sizes, tgt_sizes)
    bad = _too_long(src_len, tgt_len, max_tokens)
    if len(bad):
        raise _too_long_error(bad, src_len, tgt_len, max_tokens, tgt_sizes is not None)
    rng = None if seed is None else np.random.default_rng([_COMPOSE_TAG, seed])
    order, bounds = _bucket(
        src_len, tgt_len, np.arange(len(src_len)), max_tokens, rng, size_multiple
    )
    return np.split(order, bounds[1:-1]) if len(bounds) > 1 else []


def padding_efficiency(
    batches: Sequence[Sequence[int]],
    src_sizes: Sequence[int] | np.ndarray,
    tgt_sizes: Sequence[int] | np.ndarray | None,
) -> float:
    """Real tokens / padded tokens over ``batches``, source and target together.

    A sentence counts ``size + 1`` real tokens per side; a batch counts
    ``len(batch) x max length`` padded tokens per side. Returns 1.0 for no batches.
    """
    src_len, tgt_len = _budget_lengths(src_sizes, tgt_sizes)
    real = padded = 0
    for b in batches:
        b = np.asarray(b, dtype=np.int64)
        if len(b) == 0:
            continue
        real += int(src_len[b].sum() + tgt_len[b].sum())
        padded += len(b) * int(src_len[b].max() + tgt_len[b].max())
    return real / padded if padded else 1.0


# -------------------------------------------------------------------------- sampler


class LengthBucketSampler:
    """Batch sampler: yields this rank's batches (``list[int]`` of example indices).

    See the module docstring for how batches are formed, shuffled, split across
    ranks and resumed.

    Args:
        src_sizes: (N,) source tokens per sentence (no eos).
        tgt_sizes: (N,) target tokens per sentence (no bos/eos), or None (source only).
        max_tokens: tokens per batch counted with padding, for source and target each.
        shuffle: random tie-break when bucketing and a new batch order every epoch;
            False keeps batches in length order (decoding).
        seed: non-negative seed of the composition and of every epoch's order.
        rank, world_size: this process's data-parallel rank and the number of ranks.
        size_multiple: trim batches of at least this many sentences to a multiple of it.
        skip_too_long: leave out sentences that alone exceed ``max_tokens`` (logged)
            instead of raising.
        max_positions: leave out (logged) sentences longer than the model's position
            table on either side (size + 1 > ``max_positions``), the rule ``nmt-prepare``
            applies to the training split; None = no such limit.
        pad_to_multiple: the batches are collated with lengths rounded up to a multiple of
            it (:func:`collate`); the budget counts the rounded lengths, so a batch stays
            within ``max_tokens`` once padded.

    Raises:
        ValueError: bad ``max_tokens``/``rank``/``world_size``/``seed``, sizes of
            different shapes, or (without ``skip_too_long``) a sentence that alone
            exceeds ``max_tokens``, naming its index and lengths.
    """

    def __init__(
        self,
        src_sizes: Sequence[int] | np.ndarray,
        tgt_sizes: Sequence[int] | np.ndarray | None,
        max_tokens: int,
        *,
        shuffle: bool = True,
        seed: int = 1,
        rank: int = 0,
        world_size: int = 1,
        size_multiple: int = 8,
        skip_too_long: bool = False,
        max_positions: int | None = None,
        pad_to_multiple: int = 1,
    ):
        if int(max_tokens) < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}"
            )
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        if size_multiple < 1:
            raise ValueError(f"size_multiple must be >= 1, got {size_multiple}")
        self.max_tokens = int(max_tokens)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.rank = rank
        self.world_size = world_size
        self.size_multiple = size_multiple

        src_len, tgt_len = _budget_lengths(src_sizes, tgt_sizes)
        self.has_target = tgt_sizes is not None
        bad = _too_long(src_len, tgt_len, self.max_tokens)
        if len(bad) and not skip_too_long:
            raise _too_long_error(bad, src_len, tgt_len, self.max_tokens, self.has_target)
        self.skipped: np.ndarray = bad if skip_too_long else np.zeros(0, np.int64)
        """Indices left out because they alone exceed ``max_tokens``."""
        if len(bad):
            log.warning(
                "skipping %d sentence(s) longer than max_tokens=%d (first: example %d)",
                len(bad),
                self.max_tokens,
                int(bad[0]),
            )
        self.skipped_positions: np.ndarray = np.zeros(0, np.int64)
        """Indices left out because they exceed ``max_positions`` (and fit ``max_tokens``)."""
        if max_positions is not None:
            beyond = np.setdiff1d(_too_long(src_len, tgt_len, int(max_positions)), bad)
            if len(beyond):
                log.warning("skipping %d sentence(s) longer than model.max_positions=%d "
                            "(first: example %d)", len(beyond), int(max_positions),
                            int(beyond[0]))
                self.skipped_positions = beyond
                bad = np.union1d(bad, beyond)
        keep = np.arange(len(src_len), dtype=np.int64)
        if len(bad):
            keep = np.setdiff1d(keep, bad, assume_unique=True)

        rng = np.random.default_rng([_COMPOSE_TAG, self.seed]) if shuffle else None
        self.pad_to_multiple = max(int(pad_to_multiple), 1)
        # budget the lengths collate(pad_to_multiple=...) pads to (a sentence that fits alone
        # still fits alone)
        budget_src, budget_tgt = (_rounded(x, self.pad_to_multiple, self.max_tokens)
                                  for x in (src_len, tgt_len))
        self._src_len = src_len
        self._tgt_len = tgt_len
        self._budget = (budget_src, budget_tgt)
        self._keep = keep
        self._order, self._bounds = self._compose(keep, rng)
        self.epoch = 0
        self._position = 0
        self._resume = False
        self._rest: tuple[int, np.ndarray, np.ndarray, np.ndarray] | None = None
        # (epoch, sentences consumed before it, order, bounds) of a resumed epoch's rest

    def _compose(self, keep: np.ndarray,
                 rng: np.random.Generator | None) -> tuple[np.ndarray, np.ndarray]:
        """``(order, bounds)`` of the batches of the sentences ``keep`` (:func:`_bucket`
        with this sampler's budget); ``rng`` breaks ties among equal lengths."""
        return _bucket(*self._budget, keep, self.max_tokens, rng, self.size_multiple)

    # -- sizes and statistics -----------------------------------------------------
    @property
    def num_skipped(self) -> int:
        """Number of sentences left out by ``skip_too_long``."""
        return len(self.skipped)

    @property
    def num_batches(self) -> int:
        """Batches per epoch over all ranks."""
        return len(self._bounds) - 1

    @property
    def num_examples(self) -> int:
        """Sentences of the split, the skipped ones included (the range of the indices)."""
        return len(self._src_len)

    @property
    def num_sentences(self) -> int:
        """Sentences an epoch gives over all ranks (the skipped ones left out)."""
        return len(self._keep)

    def _layout(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """``(order, bounds, consumed_before)`` of ``epoch``: the rest of a resumed epoch
        (:meth:`resume_epoch`), else the whole composition (``consumed_before`` None)."""
        if self._rest is not None and self._rest[0] == epoch:
            return self._rest[2], self._rest[3], self._rest[1]
        return self._order, self._bounds, None

    def __len__(self) -> int:
        """Batches this rank yields in the current epoch (the same on every rank)."""
        bounds = self._layout(self.epoch)[1]
        return math.ceil((len(bounds) - 1) / self.world_size)

    @property
    def padding_efficiency(self) -> float:
        """Real tokens / padded tokens over all batches (all ranks), source + target; the
        padded widths are the lengths rounded to ``pad_to_multiple``, as collated."""
        if self.num_batches == 0:
            return 1.0
        starts = self._bounds[:-1]
        counts = np.diff(self._bounds)  # (num_batches,)
        src_s = self._src_len[self._order]
        tgt_s = self._tgt_len[self._order]
        src_w, tgt_w = (x[self._order] for x in self._budget)  # (M,) rounded lengths
        padded = (np.maximum.reduceat(src_w, starts) * counts).sum() + (
            np.maximum.reduceat(tgt_w, starts) * counts
        ).sum()
        return float((src_s.sum() + tgt_s.sum()) / padded)

    @property
    def real_tokens_per_batch(self) -> tuple[float, float]:
        """Mean real (non-pad) ``(source, target)`` tokens per batch over all batches of an
        epoch (all ranks), eos included: what a batch holds, where ``max_tokens`` bounds
        the padded size (batch size x longest sentence). (0.0, 0.0) for no batches."""
        if self.num_batches == 0:
            return 0.0, 0.0
        src = float(self._src_len[self._order].sum()) / self.num_batches
        tgt = float(self._tgt_len[self._order].sum()) / self.num_batches
        return src, tgt

    # -- epochs ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose batch order the next ``__iter__`` yields.

        Calling it with the epoch just restored by :meth:`load_state_dict` keeps the
        restored position; any other epoch starts from its first batch.
        """
        epoch = int(epoch)
        if epoch != self.epoch:
            self.epoch = epoch
            self._position = 0
            self._resume = False
            if self._rest is not None and self._rest[0] != epoch:
                self._rest = None

    def _batch_order(self, epoch: int) -> np.ndarray:
        """(batches of the epoch,) batch numbers in this epoch's order (same on every rank)."""
        _, bounds, before = self._layout(epoch)
        n = len(bounds) - 1
        if not self.shuffle:
            return np.arange(n)
        if before is not None:
            rng = np.random.default_rng([_EPOCH_TAG, self.seed, epoch, _REST_TAG, len(before)])
        else:
            rng = np.random.default_rng([_EPOCH_TAG, self.seed, epoch])
        return rng.permutation(n)

    def _rank_batches(self, epoch: int, start: int = 0) -> Iterator[list[int]]:
        """This rank's batches of ``epoch`` from position ``start`` on, ``[]`` padding included."""
        mine = self._batch_order(epoch)[self.rank :: self.world_size]
        order, bounds, _ = self._layout(epoch)
        per_rank = math.ceil((len(bounds) - 1) / self.world_size)
        for j in mine[start:]:
            yield order[bounds[j] : bounds[j + 1]].tolist()
        for _ in range(max(start, len(mine)), per_rank):
            yield []

    def consumed(self, epoch: int, position: int) -> np.ndarray:
        """(K,) sorted indices of the sentences every rank together has consumed after
        ``position`` batches per rank of ``epoch`` (those of a resumed epoch's earlier
        segments included): the data position independent of the batch layout."""
        order, bounds, before = self._layout(int(epoch))
        taken = self._batch_order(int(epoch))[: int(position) * self.world_size]
        parts = [order[bounds[j] : bounds[j + 1]] for j in taken]
        if before is not None:
            parts.append(before)
        if not parts:
            return np.zeros(0, np.int64)
        return np.sort(np.concatenate(parts)).astype(np.int64)

    def epoch_fraction(self, epoch: int, position: int) -> float:
        """The part of ``epoch`` given after ``position`` batches per rank, in [0, 1]: the
        batches taken over the epoch's batches (all ranks); in a resumed epoch's rest
        (:meth:`resume_epoch`, another world size or budget), the sentences given before it
        count as their share of the epoch's sentences and the rest's batches as the share
        left."""
        _, bounds, before = self._layout(int(epoch))
        n = len(bounds) - 1
        done = min(int(position) * self.world_size, n) / n if n else 1.0
        if before is None:
            return done
        earlier = min(len(before) / self.num_sentences, 1.0) if self.num_sentences else 1.0
        return earlier + (1.0 - earlier) * done

    def resume_epoch(self, epoch: int, consumed: np.ndarray) -> None:
        """Continue ``epoch`` after the sentences ``consumed`` (indices, from
        :meth:`consumed` of the sampler that wrote the checkpoint, whatever its world size
        or budget): the next ``__iter__`` yields the batches of the rest of the epoch,
        batched with this sampler's budget, from their first on.

        Raises:
            ValueError: an index outside the split.
        """
        consumed = np.unique(np.asarray(consumed, dtype=np.int64))
        if len(consumed) and (consumed[0] < 0 or consumed[-1] >= self.num_examples):
            raise ValueError(f"consumed sentence indices must lie in [0, {self.num_examples}), "
                             f"got {int(consumed[0])}..{int(consumed[-1])}")
        epoch = int(epoch)
        keep = np.setdiff1d(self._keep, consumed, assume_unique=True)
        rng = (np.random.default_rng([_COMPOSE_TAG, self.seed, epoch, len(consumed)])
               if self.shuffle else None)
        order, bounds = self._compose(keep, rng)
        self._rest = (epoch, consumed, order, bounds)
        self.epoch = epoch
        self._position = 0
        self._resume = True

    def epoch_batches(self, epoch: int | None = None) -> list[list[int]]:
        """All ``len(self)`` batches this rank yields in ``epoch`` (default: the current
        one), ``[]`` padding included; does not change the iteration state."""
        return list(self._rank_batches(self.epoch if epoch is None else int(epoch)))

    def __iter__(self) -> Iterator[list[int]]:
        start = self._position if self._resume else 0
        self._resume = False
        self._position = start
        for batch in self._rank_batches(self.epoch, start):
            self._position += 1
            yield batch

    # -- resumption -----------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "position", "seed"}``; position = batches yielded this epoch."""
        return {"epoch": self.epoch, "position": self._position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume: the next ``__iter__`` yields epoch ``state["epoch"]`` from batch
        ``state["position"]`` on.

        Raises:
            ValueError: when the saved seed differs from this sampler's (the batches
                would differ) or the position lies outside ``[0, len(self)]``.
        """
        if int(state["seed"]) != self.seed:
            raise ValueError(
                f"sampler state has seed {state['seed']} but this sampler uses seed "
                f"{self.seed}; resuming would visit different batches"
            )
        position = int(state["position"])
        epoch = int(state["epoch"])
        per_rank = math.ceil((len(self._layout(epoch)[1]) - 1) / self.world_size)
        if not 0 <= position <= per_rank:
            raise ValueError(
                f"sampler state position {position} is outside [0, {per_rank}] "
                f"(batches per epoch on this rank)"
            )
        if self._rest is not None and self._rest[0] != epoch:
            self._rest = None
        self.epoch = epoch
        self._position = position
        self._resume = True
