"""How the command line reads epoch lists and words a dump's result: one line a human reads in a cron mail."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pgprefetch.config.values import show_size
from pgprefetch.errors import ConfigError

if TYPE_CHECKING:
    from datetime import datetime, timedelta

    from pgprefetch.store.consumers import ConsumerInfo
    from pgprefetch.write.pipeline import DumpResult


def parse_epochs(value: str) -> list[int]:
    """Parse ``3``, ``3-5`` or ``1,4-6`` into a list of epochs."""
    out: list[int] = []
    for part in value.split(","):
        m = re.fullmatch(r"\s*(-?[0-9]+)\s*(?:-\s*([0-9]+)\s*)?", part)
        if not m:
            raise ConfigError(f"--epochs: expected N, A-B or a comma-separated list of them, got {value!r}")
        lo, hi = int(m[1]), int(m[2] if m[2] is not None else m[1])
        if lo < 0:
            raise ConfigError(f"--epochs: epochs are 0 or more, got {lo}")
        if hi < lo:
            raise ConfigError(f"--epochs: empty range {part.strip()!r}")
        out.extend(range(lo, hi + 1))
    return out


def summary(r: DumpResult) -> str:
    """One line for a dump's result: what was written, how fast, where, and what happened on the way."""
    if r.status == "skipped":
        return f"epoch {r.epoch}: already complete in {r.path}, left untouched (use --force to rewrite)"
    if r.status == "busy":
        return f"epoch {r.epoch}: another dump is writing it ({r.holder}); skipped"
    notes = ""
    if r.sources:
        notes += " (" + ", ".join(f"{name} {n:,}" for name, n in r.sources.items()) + ")"
    if r.duplicates_dropped:
        notes += f" ({r.duplicates_dropped:,} repeated keys dropped)"
    if r.last_dropped:
        notes += (
            f" ({_count(r.last_dropped, 'sample')} of a short last batch dropped, others each epoch: "
            "drop_last = false keeps them)"
        )
    if r.rows_read == 0:
        notes += " (cut from the table read for an earlier epoch)"
    elif r.rows_read:
        notes += f" ({r.rows_read:,} table rows read)"
    if r.retries:
        causes = ", ".join(f"{cause} {n}" for cause, n in sorted(r.retry_causes.items()))
        notes += f" (survived {r.retries} lost connection(s): {causes})"
    if r.restarted:
        notes += f" (an interrupted dump was started over: {r.restarted})"
    if r.resumed:
        notes += f" (resumed: {r.resumed} of {r.n_batches} batches kept from an interrupted dump)"
    if r.executor:
        retried = sum(r.part_retries)
        notes += f" (on {r.executor}, {_count(r.parts, 'part')}" + (f", {retried} rerun)" if retried else ")")
    return (
        f"epoch {r.epoch}: {_count(r.n_batches, 'batch', 'batches')}, {_count(r.n_samples, 'sample')}, "
        f"{show_size(r.bytes)} "
        f"in {r.seconds:.1f} s ({r.samples_per_s:,.0f} samples/s) -> {r.path}{notes}"
        + (f" (peak memory {r.peak_rss / (1 << 20):,.0f} MiB)" if r.peak_rss else "")
    )


def _count(n: int, one: str, many: str | None = None) -> str:
    """``1 batch``, ``2 batches``, ``1,024 samples``."""
    return f"{n:,} {one if n == 1 else many or one + 's'}"


def consumer_lines(readers: list[ConsumerInfo], now: datetime) -> list[str]:
    """``ls``'s consumers: each run's ranks, the epoch each opened last, how long ago; stale ones marked."""
    out = ["consumers (--keep keeps what the slowest may read):"]
    for r in readers:
        name = r.run if r.rank == 0 else f"{r.run}@{r.rank}"
        epoch = (
            "damaged record (holds every epoch until it is rewritten or forgotten)"
            if r.epoch is None
            else "not started"
            if r.epoch < 0
            else f"epoch {r.epoch}"
        )
        when = f", {_ago(now - r.updated)} ago" if r.updated else ""
        note = "" if r.counts else " (not counted)"
        if r.counts and r.stale(now):
            note = f" (stale: if {r.run} is gone for good, `pgprefetch forget {r.run}`)"
        out.append(f"  {name:<24} {epoch}{when}{note}")
    return out


def _ago(delta: timedelta) -> str:
    """``3 days``, ``5 h``, ``12 min``, ``40 s``: how long ago, at the coarsest unit that is at least 1."""
    seconds = max(0, int(delta.total_seconds()))
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"
