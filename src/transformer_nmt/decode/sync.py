"""When beam and greedy search read the device (``decode.sync_every``): the host's
bookkeeping between two reads of the finished flags (docs/model.md, "Beam search on the
device")."""

from __future__ import annotations

import math

import torch
from torch import Tensor


class NonFiniteScoresError(ValueError):
    """The model gave NaN or infinite logits (NaN weights, or fp16 logits that overflow)."""


def non_finite_error(t: int) -> NonFiniteScoresError:
    """The error for non-finite logits first met at step ``t`` (0-based)."""
    return NonFiniteScoresError(
        f"the model gave NaN or infinite logits at output position {t + 1} (NaN or inf "
        "parameters, or logits beyond the range of the decoding precision)")


def read_flags(active: Tensor, bad_step: Tensor) -> list[int]:
    """The one host read between steps: the active flags (A,) and the first step with
    non-finite scores; raises :class:`NonFiniteScoresError` when there is one. Returns the
    indices of the active rows."""
    flags = torch.cat([active.long(), bad_step.view(1)]).tolist()
    if flags[-1] >= 0:
        raise non_finite_error(flags[-1])
    return [i for i, a in enumerate(flags[:-1]) if a]


SYNC_EVERY_CUDA = 8
"""``decode.sync_every=auto`` on a CUDA device: the host reads the finished flags once every 8
decoding steps (1 elsewhere, where the extra steps of finished sentences cost real compute)."""


def resolve_sync_every(value: int | str | None, device: torch.device | str) -> int:
    """Decoding steps between two host reads of the finished flags (``decode.sync_every``).

    Args:
        value: an int >= 1 (or its text), or ``auto``/None: :data:`SYNC_EVERY_CUDA` on a CUDA
            device, 1 elsewhere.
        device: where the search runs.

    Raises:
        ValueError: anything else (names the value).
    """
    if value is None or str(value).strip().lower() == "auto":
        return SYNC_EVERY_CUDA if torch.device(device).type == "cuda" else 1
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise ValueError(f"sync_every={value!r} must be auto or a whole number >= 1 (decoding "
                         "steps between two host reads of the finished flags)")
    return int(text)


class Reads:
    """The host's view of the search between two reads of the device: which sentences may
    still be active (a superset of the truly active ones), their length limits, and the
    step of the next read."""

    def __init__(self, max_len: list[int], sync_every: int) -> None:
        self.max_len = max_len  # per original sentence
        self.sync_every = sync_every
        self.sentences = list(range(len(max_len)))  # original index of each active row
        self.limits = set(max_len)

    def keep(self, rows: list[int]) -> None:
        """Only the active rows ``rows`` (indices into :attr:`sentences`) go on."""
        self.retain([self.sentences[i] for i in rows])

    def retain(self, sentences: list[int]) -> None:
        """Only the ``sentences`` (original indices) go on."""
        self.sentences = sentences
        self.limits = {self.max_len[i] for i in self.sentences}

    def due(self, t: int) -> bool:
        """Read after step ``t``: every ``sync_every`` steps, and at the last step any active
        sentence may take (all are finished then)."""
        return (t + 1) % self.sync_every == 0 or t >= max(self.limits)


class BeamOutputs:
    """Beam search's results on the device for the B sentences of a batch, filled as the
    sentences finish: the back-pointers of every step, ``hist`` (T, B + 1, K, 2) long (the
    token and the beam of the step before, of beam j of sentence b after step t; row B takes
    the writes of search rows that hold no sentence), and each sentence's finished n-best,
    ``out_f`` (B, n, 2) (score, log-prob; -inf score = empty) and ``out_i`` (B, n, 2) long
    (tokens before ``eos``, the beam it extends); with ``sent_ids`` (A,) long, the original
    index of each active sentence of the eager search."""

    def __init__(self, sentences: int, steps: int, k: int, n_keep: int,
                 device: torch.device) -> None:
        self.hist = torch.zeros(steps, sentences + 1, k, 2, dtype=torch.long, device=device)
        self.out_f = torch.full((sentences, n_keep, 2), -math.inf, device=device)
        self.out_i = torch.zeros(sentences, n_keep, 2, dtype=torch.long, device=device)
        self.sent_ids = torch.arange(sentences, device=device)
        self.sentences = sentences
        self.steps = 0  # steps recorded

    def back_pointers(self) -> Tensor:
        """(T, B, K, 2) the back-pointers of the steps recorded."""
        return self.hist[: self.steps, : self.sentences]

    def record(self, t: int, step_hist: Tensor, where: Tensor | None = None) -> None:
        """Step ``t``'s back-pointers (A, K, 2) of the search's rows, which hold the
        sentences ``where`` (A,) long (B: none), or :attr:`sent_ids` by default."""
        if where is not None:
            self.hist[t].index_copy_(0, where, step_hist)
        elif step_hist.size(0) == self.sentences:
            self.hist[t, : self.sentences].copy_(step_hist)
        else:
            self.hist[t].index_copy_(0, self.sent_ids, step_hist)
        self.steps = t + 1

    def store(self, rows: Tensor, sentences: Tensor, fin_f: Tensor, fin_i: Tensor) -> None:
        """Keep the finished n-best (``fin_f``/``fin_i`` (A, n, 2)) of the search's ``rows``
        (G,) long as the results of ``sentences`` (G,) long."""
        self.out_f.index_copy_(0, sentences, fin_f.index_select(0, rows))
        self.out_i.index_copy_(0, sentences, fin_i.index_select(0, rows))

    def read(self, host: Reads, active: Tensor, bad_step: Tensor, fin_f: Tensor,
             fin_i: Tensor) -> Tensor | None:
        """Read the flags of the A active sentences (``active`` (A,) bool and ``bad_step``,
        :func:`read_flags`), store the finished n-best (``fin_f``/``fin_i``, (A, n, 2)) of
        those that leave, and return the kept ones' indices (A',) long (empty when none
        is), or None when all stay.

        Raises:
            NonFiniteScoresError: as :func:`read_flags`.
        """
        n_act = self.sent_ids.numel()
        kept = read_flags(active, bad_step)
        if len(kept) == n_act:
            return None
        device = self.out_f.device
        gone = torch.tensor(sorted(set(range(n_act)) - set(kept)), device=device)
        self.store(gone, self.sent_ids[gone], fin_f, fin_i)
        keep = torch.tensor(kept, dtype=torch.long, device=device)
        if kept:
            host.keep(kept)
            self.sent_ids = self.sent_ids[keep]
        return keep
