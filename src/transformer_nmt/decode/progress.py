"""Progress of a long decoding (``nmt-translate``, ``nmt-evaluate``, ``nmt-plot``'s BLEU).

:func:`decode_progress` counts the sentences decoded, a batch at a time, from the host-side
batch sizes (no read of a device tensor, no synchronisation). On a terminal it draws a tqdm
bar on standard error, cleared when decoding ends; elsewhere (standard error in a log file or
a pipe) it logs a line every :data:`LOG_EVERY_SECONDS` instead. The final count, time and
speed are logged by the caller (``translated N sentences ... in T s: S sentences/s``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import TextIO

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

log = logging.getLogger(__name__)

LOG_EVERY_SECONDS = 30.0
"""Seconds between two progress log lines when no bar is drawn."""


class DecodeProgress:
    """Sentences decoded so far out of ``total``: a bar when ``stream`` is a terminal, else
    a log line every ``log_every`` seconds (:func:`decode_progress` makes one)."""

    def __init__(self, total: int, stream: TextIO, log_every: float, what: str) -> None:
        self.total, self.done, self.what = int(total), 0, what
        self.start = self.last_log = time.perf_counter()
        self.log_every = float(log_every)
        is_tty = getattr(stream, "isatty", None)
        self.bar = tqdm(total=self.total, desc=what, unit="sent", file=stream, leave=False,
                        dynamic_ncols=True, mininterval=0.5,
                        disable=self.total == 0 or not (is_tty and is_tty()))

    def update(self, n: int) -> None:
        """Count ``n`` more sentences decoded."""
        self.done += int(n)
        if not self.bar.disable:
            self.bar.update(int(n))
            return
        now = time.perf_counter()
        if self.done < self.total and now - self.last_log >= self.log_every:
            self.last_log = now
            seconds = now - self.start
            log.info("%s: %d of %d sentences (%.0f %%) in %.0f s, %.1f sentences/s", self.what,
                     self.done, self.total, 100.0 * self.done / self.total, seconds,
                     self.done / seconds if seconds > 0 else float("nan"))

    def close(self) -> None:
        """Clear the bar."""
        self.bar.close()


@contextlib.contextmanager
def decode_progress(total: int, what: str = "decoding", stream: TextIO | None = None,
                    log_every: float | None = None) -> Iterator[DecodeProgress]:
    """A :class:`DecodeProgress` over ``total`` sentences on ``stream`` (standard error);
    while its bar is drawn, log records go through tqdm so that they do not break it."""
    progress = DecodeProgress(total, sys.stderr if stream is None else stream,
                              LOG_EVERY_SECONDS if log_every is None else log_every, what)
    try:
        if progress.bar.disable:
            yield progress
        else:
            with logging_redirect_tqdm():
                yield progress
    finally:
        progress.close()
