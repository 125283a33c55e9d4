"""The dump's progress bar on stderr: samples/s, MB/s and ETA (only on a terminal)."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


class BarProgress:
    """A :class:`pgprefetch.pipeline.Progress` drawn with tqdm; does nothing when ``enabled`` is false."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: tqdm | None = None
        self._bytes = 0
        self._started = 0.0

    def reading(self, epoch: int) -> None:
        """Open a bar counting the table rows a scan reads (the total is not known ahead)."""
        if not self.enabled:
            return
        self._bar = tqdm(
            desc=f"epoch {epoch}: reading",
            unit=" rows",
            unit_scale=True,
            file=sys.stderr,
            dynamic_ncols=True,
            leave=False,
        )

    def rows(self, n: int) -> None:
        """Count table rows read."""
        if self._bar is not None:
            self._bar.update(n)

    def start(self, epoch: int, n_samples: int) -> None:
        """Open a bar for one epoch (closing the reading bar, if any)."""
        if not self.enabled:
            return
        self.close()
        self._bytes, self._started = 0, time.monotonic()
        self._bar = tqdm(
            total=n_samples,
            desc=f"epoch {epoch}",
            unit=" samples",
            unit_scale=True,
            file=sys.stderr,
            dynamic_ncols=True,
            leave=False,
        )

    def advance(self, samples: int, nbytes: int) -> None:
        """Count one written batch."""
        if self._bar is None:
            return
        self._bytes += nbytes
        if self._bytes:  # batches kept from an interrupted dump count as samples, not as bytes written now
            rate = self._bytes / max(time.monotonic() - self._started, 1e-3)
            self._bar.set_postfix_str(tqdm.format_sizeof(rate, "B/s", divisor=1000), refresh=False)
        self._bar.update(samples)

    def close(self) -> None:
        """Remove the bar (the summary line replaces it)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
