"""The dump's progress on stderr: a bar on a terminal, a log line every few seconds elsewhere.

Under cron, systemd or Kubernetes stderr is a file or a pipe, where a bar is noise; :class:`LogProgress`
writes one line through :mod:`logging` every ``interval`` seconds instead (epoch, samples, rate, ETA, and
the parts done of an epoch spread on Ray), so a log collector or a cron mail shows a long dump moving.
``--log-format json`` makes every line a JSON object (:class:`JsonFormatter`).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NoReturn

if TYPE_CHECKING:  # imported when a bar is drawn: a dump under cron or with --json draws none
    from tqdm import tqdm


class BarProgress:
    """A :class:`pgprefetch.write.batches.Progress` drawn with tqdm; does nothing when ``enabled`` is false."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: tqdm[NoReturn] | None = None  # counted by hand: no iterable
        self._bytes = 0
        self._started = 0.0
        self._parts = ""  # "parts 3/8" for a spread epoch; nothing for the single process

    def reading(self, epoch: int) -> None:
        """Open a bar counting the table rows a scan reads (the total is not known ahead)."""
        if not self.enabled:
            return
        self._bar = _bar(f"epoch {epoch}: reading", " rows", None)

    def rows(self, n: int) -> None:
        """Count table rows read."""
        if self._bar is not None:
            self._bar.update(n)

    def start(self, epoch: int, n_samples: int) -> None:
        """Open a bar for one epoch (closing the reading bar, if any)."""
        if not self.enabled:
            return
        self.close()
        self._bytes, self._started, self._parts = 0, time.monotonic(), ""
        self._bar = _bar(f"epoch {epoch}", " samples", n_samples)

    def advance(self, samples: int, nbytes: int) -> None:
        """Count one written batch."""
        if self._bar is None:
            return
        if not nbytes and not self._bytes:  # batches kept from an interrupted dump: done, but not at this rate
            self._bar.initial += samples  # tqdm's rate counts from `initial`
        self._bytes += nbytes
        self._postfix(self._bar, refresh=False)
        self._bar.update(samples)

    def parts(self, done: int, total: int) -> None:
        """Show the parts done of a spread epoch after the rate."""
        self._parts = f"parts {done}/{total}"
        if self._bar is not None:
            self._postfix(self._bar, refresh=True)

    def _postfix(self, bar: tqdm[NoReturn], refresh: bool) -> None:
        """The bar's postfix: the write rate in bytes, and a spread epoch's parts done."""
        shown = [self._parts] if self._parts else []
        if self._bytes:
            rate = self._bytes / max(time.monotonic() - self._started, 1e-3)
            shown.insert(0, bar.format_sizeof(rate, "B/s", divisor=1000))
        if shown:
            bar.set_postfix_str(", ".join(shown), refresh=refresh)

    def close(self) -> None:
        """Remove the bar (the summary line replaces it)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _bar(description: str, unit: str, total: int | None) -> tqdm[NoReturn]:
    """A bar on stderr that the summary line replaces (``leave=False``)."""
    from tqdm import tqdm

    return tqdm(
        total=total, desc=description, unit=unit, unit_scale=True, file=sys.stderr, dynamic_ncols=True, leave=False
    )


log = logging.getLogger("pgprefetch")


class LogProgress:
    """A :class:`pgprefetch.write.batches.Progress` that logs a line at most every ``interval`` seconds."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._epoch = 0
        self._total = 0
        self._done = 0
        self._kept = 0  # samples of batches an interrupted dump left: not written at this run's rate
        self._rows = 0
        self._parts: tuple[int, int] | None = None  # a spread epoch's parts done and in all
        self._started = self._last = 0.0

    def reading(self, epoch: int) -> None:
        """A scan read begins."""
        self._epoch, self._rows = epoch, 0
        self._started = self._last = time.monotonic()
        log.info("epoch %d: reading the table", epoch, extra={"epoch": epoch, "phase": "reading"})

    def rows(self, n: int) -> None:
        """Count table rows read."""
        self._rows += n
        if self._due():
            log.info("epoch %d: %s table rows read", self._epoch, f"{self._rows:,}", extra={"rows_read": self._rows})

    def start(self, epoch: int, n_samples: int) -> None:
        """The epoch's size is known."""
        self._epoch, self._total, self._done, self._kept, self._parts = epoch, n_samples, 0, 0, None
        self._started = self._last = time.monotonic()

    def advance(self, samples: int, nbytes: int) -> None:
        """Count samples written (those of batches kept from an interrupted dump, ``nbytes`` 0, not in the rate)."""
        self._done += samples
        if not nbytes and self._done == samples:
            self._kept = samples
        if self._due():
            self._line()

    def parts(self, done: int, total: int) -> None:
        """A spread epoch's parts done: a part that finished is news, logged now whatever the interval."""
        news = self._parts is not None and done > self._parts[0]
        self._parts = (done, total)
        if news:
            self._last = time.monotonic()
            self._line()

    def _line(self) -> None:
        """The progress line: samples, rate, ETA, and the parts done of a spread epoch."""
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rate = (self._done - self._kept) / elapsed
        eta = (self._total - self._done) / rate if rate else float("inf")
        extra = {"epoch": self._epoch, "samples": self._done, "total": self._total,
                 "samples_per_s": round(rate, 1), "eta_s": round(eta, 1)}  # fmt: skip
        parts = ""
        if self._parts is not None:
            parts = f", parts {self._parts[0]}/{self._parts[1]}"
            extra.update(parts_done=self._parts[0], parts=self._parts[1])
        log.info(
            "epoch %d: %s of %s samples (%.0f%%), %s samples/s, ETA %.0f s%s",
            self._epoch, f"{self._done:,}", f"{self._total:,}", 100 * self._done / max(self._total, 1),
            f"{rate:,.0f}", eta, parts, extra=extra,
        )  # fmt: skip

    def close(self) -> None:
        """Nothing to tidy: the summary follows."""

    def _due(self) -> bool:
        now = time.monotonic()
        if now - self._last < self.interval:
            return False
        self._last = now
        return True


_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, message, and the record's extra fields (epoch, samples, ...)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        out = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        return json.dumps(out, default=str)
