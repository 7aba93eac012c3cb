"""When beam and greedy search read the device (``decode.sync_every``): the host's
bookkeeping between two reads of the finished flags (docs/model.md, "Beam search on the
device")."""

from __future__ import annotations

import torch

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
        self.sentences = [self.sentences[i] for i in rows]
        self.limits = {self.max_len[i] for i in self.sentences}

    def due(self, t: int) -> bool:
        """Read after step ``t``: every ``sync_every`` steps, and at the last step any active
        sentence may take (all are finished then)."""
        return (t + 1) % self.sync_every == 0 or t >= max(self.limits)
