"""What ``pgprefetch check`` predicts of the dump: the way it will read, its peak memory and its duration.

The peak is not a model of its own: it is the floor (:data:`~pgprefetch.write.memory.policy.FLOOR`) plus what the
way the dump takes holds, sized as the dump sizes it, from the same account (:mod:`pgprefetch.write.memory.policy`)
and the same batch source the check built:

- **query mode**: the keys while they are ordered (in memory while they fit the budget, else runs of the
  budget's size on disk), then the keys in epoch order beside the writer: each unit in flight, its fetched
  rows and its buffers, each writing thread's temporaries (:func:`~pgprefetch.write.memory.policy.writer_bytes`).
- **a scan that fits** (:meth:`~pgprefetch.write.memory.policy.Policy.fits_in_memory`, the dump's own test, on the
  table's rows from the check's keys pass and a row's size from its checked rows): the table read whole and
  the epoch's plan (:meth:`~pgprefetch.write.memory.policy.Policy.in_memory_bytes`), beside the writer.
- **a scan beyond the budget** (rows in stretches, windows in passes) and a mixed epoch: the whole budget,
  which those ways are sized to fill.

The time is extrapolated from what the check timed of the same work: the epoch's plan (query mode: the
dump's own keys read and order; scan mode: the keys pass, the least a read of the table takes, and at
most that times a whole row's bytes over a key's), and the checked batches, fetched and produced with the
dump's units in flight and threads (with a few more waves of fetches in query mode), times the epoch's
batches; a scan beyond the budget up to :data:`BEYOND_MEMORY_TIME` times that. It is a range around its
figure: the waves' fastest and slowest, each with its batches overlapped as well as the dump's concurrency
allows, or not at all. Writing the store is not timed (an S3 upload adds its own).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass

import numpy as np

from pgprefetch.write.batches import BatchSource
from pgprefetch.write.memory.policy import FLOOR, Policy, key_bytes, writer_bytes
from pgprefetch.write.order.spill import bytes_per_key

# A scan beyond the budget (stretches, passes) takes up to this many times its time in memory: the target
# bench.memory measures it against (docs/memory.md).
BEYOND_MEMORY_TIME = 1.5
IN_MEMORY = "table in memory"  # the way of a scan whose table the dump holds whole


@dataclass(frozen=True)
class Timed:
    """The checked batches, fetched and produced as the dump has them in flight: what each step took.

    ``waves``: a batch's time in each further wave of fetches alone (query mode), taken where the checked
    wave was short: one wave of a few batches on a shared machine is as long as its slowest hiccup.
    """

    wall: float  # from the first fetch to the last batch produced
    fetches: tuple[float, ...]
    produces: tuple[float, ...]
    concurrency: int  # units in flight while they were timed
    threads: int
    waves: tuple[float, ...] = ()

    def per_batch(self) -> tuple[float, float, float]:
        """A batch's share of the dump's time: the least, the expected and the most, from the waves timed.

        The checked wave's least: its fetches spread over the units in flight, or its produces over the
        threads, whichever takes longer; its most: its wall time, which also waited for the first fetch
        before any batch could be produced (its figure, between). A fetch wave's: its wall time, or the
        produces' share where that is longer (the dump produces while it fetches). The expected time is the
        median of the waves', the range theirs.
        """
        n = max(1, len(self.fetches))
        produce = sum(self.produces) / max(1, self.threads) / n
        least = max(sum(self.fetches) / max(1, self.concurrency) / n, produce)
        most = max(least, self.wall / n)
        figures = sorted([math.sqrt(least * most), *(max(wave, produce) for wave in self.waves)])
        return min(least, figures[0]), statistics.median(figures), max(most, figures[-1])


@dataclass(frozen=True)
class TableRead:
    """A scan's table as the check's keys pass found it: what decides whether the dump holds it."""

    rows: int | None  # None: the keys alone outgrew the budget (ordered on disk): the table is beyond it too
    samples: int  # cut from the rows (before fraction)
    windows: bool  # samples are windows of series (read beyond the budget in passes), not rows (in stretches)
    row_bytes: float  # a whole row, decoded
    key_bytes: float  # a row's key and order columns, decoded
    keys_seconds: float  # the keys pass: the key columns of every row read, cut and put in the epoch's order
    plan_seconds: float  # from the check's start to the epoch planned: the snapshot, the table described, the pass


@dataclass(frozen=True)
class Forecast:
    """The dump the check expects: the way it reads, its peak RSS (bytes) and its seconds (a range)."""

    way: str
    working: int  # the peak less the floor
    seconds: float | None = None
    low: float | None = None
    high: float | None = None

    @property
    def peak(self) -> int:
        """The expected peak RSS: the floor and what the way holds."""
        return FLOOR + self.working


def writer_held(source: BatchSource, size: int, fetched: bool) -> int:
    """The writer's memory for ``source``: its units in flight (with their fetched rows) and its threads."""
    samples = source.unit * size
    unit = samples * source.layout.sample_bytes
    keys = samples * 8 * source.plan.key_columns.width
    rows = source.concurrency * unit if fetched else 0  # a unit's rows as fetched: about its decoded size
    return writer_bytes(unit, keys, source.concurrency, source.threads) + rows


def query_forecast(budget: int, source: BatchSource, size: int, plan_seconds: float, timed: Timed | None) -> Forecast:
    """Query mode: the keys ordered (in memory or, beyond ``budget``, in runs of it on disk), then the writer."""
    n, width = source.plan.n_keys, source.plan.key_columns.width
    in_memory = isinstance(source.plan.keys, np.ndarray)  # not keys ordered on disk
    writer = writer_held(source, size, fetched=True)
    if in_memory:
        way, working = "keys in memory", max(n * bytes_per_key(width), n * key_bytes(width) // 2 + writer)
    else:
        way, working = "keys ordered on disk", max(budget, writer)
    return _timed(Forecast(way, working), source.plan.n_batches, (plan_seconds, plan_seconds), timed)


def scan_forecast(budget: int, source: BatchSource, size: int, table: TableRead, timed: Timed | None) -> Forecast:
    """Scan mode: the table held whole where the dump's account says it fits, else the whole budget."""
    width = source.plan.key_columns.width
    low = table.plan_seconds  # a whole row's read is at least the keys', at most that times its bytes
    high = low + table.keys_seconds * (max(1.0, table.row_bytes / table.key_bytes) - 1) if table.key_bytes else low
    forecast = _scan_way(Policy.for_scan(budget), table, width, writer_held(source, size, fetched=False))
    forecast = _timed(forecast, source.plan.n_batches, (low, high), timed)
    return forecast if forecast.way == IN_MEMORY else _slower(forecast, BEYOND_MEMORY_TIME)


def unchecked_scan_forecast(budget: int, width: int, table: TableRead) -> Forecast:
    """Scan mode where no batch was checked (one batch's series outgrew the check's share): the way and peak only.

    No batch source was built, so the writer is counted as the account reserves it; nothing was timed.
    """
    account = Policy.for_scan(budget)
    return _scan_way(account, table, width, account.writer)


def _scan_way(account: Policy, table: TableRead, width: int, writer: int) -> Forecast:
    """The way a scan dump reads ``table`` under ``account`` (the dump's own test) and what it holds, untimed."""
    if table.rows is not None and account.fits_in_memory(table.rows, table.row_bytes, table.samples, width):
        return Forecast(IN_MEMORY, account.in_memory_bytes(table.rows, table.row_bytes, table.samples, width) + writer)
    return Forecast("windows in passes" if table.windows else "rows in stretches", account.budget)


def _timed(forecast: Forecast, n_batches: int, plan: tuple[float, float], timed: Timed | None) -> Forecast:
    """``forecast`` with its seconds: the plan's range, and the timed batches' times the epoch's batches."""
    if timed is None or not timed.fetches:
        return forecast
    low, middle, high = timed.per_batch()
    seconds = math.sqrt(plan[0] * plan[1]) + n_batches * middle
    return Forecast(forecast.way, forecast.working, seconds, plan[0] + n_batches * low, plan[1] + n_batches * high)


def _slower(forecast: Forecast, most: float) -> Forecast:
    """``forecast`` of a way up to ``most`` times slower than the one timed (a scan beyond memory)."""
    if forecast.seconds is None or forecast.low is None or forecast.high is None:
        return forecast
    return dataclasses.replace(forecast, seconds=forecast.seconds * math.sqrt(most), high=forecast.high * most)
