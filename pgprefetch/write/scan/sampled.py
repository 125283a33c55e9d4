"""Scan mode for ``pgprefetch check``: the epoch planned from a keys pass, then only the checked batches' rows read.

A dump reads the whole table; a check of a few batches need not. The keys pass (the key and order
columns only, as a dump of a table larger than ``[source] memory`` does) gives the epoch's samples and
order exactly as the dump's read would (the same cut, the same shuffle); then one COPY reads the series
the checked batches' samples come from (``WHERE (key) IN (VALUES ...)``, the keys as numbers: integers
pgprefetch read, never text), and those batches are gathered from it with the dump's code
(:func:`~pgprefetch.write.scan.whole.cut_source`). What the check reads is the keys of every row and the
data of the checked batches' series, plus, for ``categories = "auto"``, the one read of the values.

The checked series are read within half the budget's data share, whether the keys are held or ordered on
disk: windows of a few long series can span the whole table, which neither the check nor the dump holds
beyond the budget. Where the chosen batches' series outgrow it, one batch is checked; where even one
batch's do, none: the check states the epoch from its keys, and a row's size from the rows read so far.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import Config, ScanConfig
from pgprefetch.errors import SourceError
from pgprefetch.pg.session import Snapshot
from pgprefetch.sqltext import quote_ident
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.memory.policy import READ_COPIES, SORT_BYTES_PER_ROW, STARTS_ROW_BYTES, Policy
from pgprefetch.write.plan import EpochPlan, Vocabulary, resolve_categories
from pgprefetch.write.scan.shape import ScanShape, describe_scan, distinct_values, keys_only
from pgprefetch.write.scan.starts import place, starts_bytes
from pgprefetch.write.scan.table import TableTooLarge, array_lengths, cut, cut_whole, read_ranges, read_table
from pgprefetch.write.scan.whole import cut_source, plan_scan, scan_layout


@dataclass(frozen=True)
class Sampled:
    """A check's scan source, and what the check predicts the dump from (:mod:`pgprefetch.write.check`).

    The dump holds the table in memory or not by its rows and their decoded size
    (:meth:`~pgprefetch.write.memory.policy.Policy.fits_in_memory`); the keys pass read every row of it, the checked
    series' rows give a whole row's size. The keys pass's time is the least a dump's read of the table takes.
    """

    plan: EpochPlan
    source: BatchSource | None  # None: even one checked batch's series outgrew half the data share
    chosen: list[int]  # the batches checked (fewer than asked where theirs outgrew it; none without a source)
    rows: int  # the table's rows
    samples: int  # the samples cut from them (before fraction)
    row_bytes: float  # a whole row, decoded: the checked series' rows (or those read before the read gave up)
    key_bytes: float  # a row's key and order columns, decoded
    keys_seconds: float  # the keys pass: the table's key columns read, sorted and cut, and the epoch ordered
    planned_at: float  # when the epoch was planned (``time.perf_counter()``), before the checked rows are read
    kept_rows: int | None = None  # windows stored as starts: the rows the epoch's windows cover

    def epoch_bytes(self, size: int) -> int | None:
        """The bytes the dump writes, where they are not the checked batches' times the epoch's (starts)."""
        if self.kept_rows is None or self.source is None:
            return None
        return starts_bytes(self.plan, self.source.layout, size, self.kept_rows)


async def sampled_source(
    cfg: Config,
    snap: Snapshot,
    epoch: int,
    vocabulary: Vocabulary | None,
    choose: Callable[[int], list[int]],
) -> Sampled:
    """The epoch's source for the batches ``choose(n_batches)`` only, those batches, and the table's figures.

    Any other batch is not to be produced. The source's ``rows_read`` counts every row the server read
    for it (the keys pass, the values of ``"auto"`` fields, the checked series).

    Raises:
        TableTooLarge: the keys alone outgrow ``[source] memory``: they are held here, so the caller checks
            the epoch from keys ordered on disk instead.
    """
    assert isinstance(cfg.samples, ScanConfig)
    shape = await describe_scan(cfg, snap)
    counted = [0]

    async def distinct(columns: list[str]) -> dict[str, set[str]]:
        values, rows = await distinct_values(cfg, snap, shape, columns)
        counted[0] += rows
        return values

    shape = dataclasses.replace(shape, categories=await resolve_categories(cfg, distinct, vocabulary))
    started = time.perf_counter()
    keys = await read_table(cfg, snap, keys_only(shape))  # TableTooLarge: keys beyond memory (the caller's)
    sample_keys, starts = await asyncio.to_thread(cut_whole, keys, shape, cfg.samples)
    plan = plan_scan(cfg, shape, sample_keys, epoch)
    planned_at = time.perf_counter()
    n_rows, n_samples, rows_read = keys.keys.shape[1], sample_keys.shape[1], keys.rows_read + counted[0]
    kept = None
    if cfg.store.windows == "starts":  # the rows the dump will store: those the epoch's windows cover
        assert plan.samples is not None
        with memory.current().reserve("window places", STARTS_ROW_BYTES * (n_rows + 1)):
            kept = int(place(starts[plan.samples[: plan.used]], cfg.samples.rows, n_rows).rows.size)
    key_bytes = keys.nbytes / n_rows if n_rows else 0.0
    del keys, sample_keys, starts  # the plan holds what the batches need: the rows' keys go before their series come
    source, chosen, row_bytes = await _checked_batches(cfg, snap, shape, plan, choose(plan.n_batches), rows_read)
    keys_seconds = planned_at - started
    return Sampled(plan, source, chosen, n_rows, n_samples, row_bytes, key_bytes, keys_seconds, planned_at, kept)


async def sampled_from_plan(
    cfg: Config, snap: Snapshot, plan: EpochPlan, choose: Callable[[int], list[int]]
) -> tuple[BatchSource | None, list[int], float]:
    """The batches ``choose(n_batches)`` of an epoch whose keys are beyond memory, those batches, a row's size.

    What :func:`sampled_source` does once its keys are held, from keys ordered on disk: the checked
    batches' series read, the batches cut from them, within the same half of the data share (the keys'
    order on disk has the other), or none (no source). A row's decoded size is the rows' read.
    """
    shape = dataclasses.replace(await describe_scan(cfg, snap), categories=plan.categories)
    return await _checked_batches(cfg, snap, shape, plan, choose(plan.n_batches), 0)


def series_share(budget: int) -> int:
    """What the checked batches' series may hold as a read is counted: half the budget's data share (0: no limit).

    The other half is the keys': held, or ordered on disk beyond it.
    """
    return Policy.for_scan(budget).keys_bytes(beside_rows=True) if budget else 0


async def _checked_batches(
    cfg: Config, snap: Snapshot, shape: ScanShape, plan: EpochPlan, chosen: list[int], rows_read: int
) -> tuple[BatchSource | None, list[int], float]:
    """A source of the batches ``chosen`` (or of one of them, or None), the batches, and a row's size.

    The batches' series are read here, held within :func:`series_share` as the account counts a read
    (its rows twice while joined, and their sort), or else one batch's, or else none: no source, no
    batch, and a row's size from the rows decoded before the read was given up. Each batch's start rows
    are held, not the epoch's: a plan whose keys are on disk has more samples than memory. ``rows_read``:
    the rows read before, which the source's ``rows_read`` counts as well.
    """
    size = cfg.batches.size
    limit = series_share(cfg.source.memory_bytes)

    def over(rows: int, held: int) -> bool:
        return READ_COPIES * held + SORT_BYTES_PER_ROW * rows > limit

    while True:
        wanted = {b: plan.batch_keys(b, size) for b in chosen}  # (key columns [+ order], m): each batch's keys
        every = np.concatenate(list(wanted.values()), axis=1)
        try:
            where = [series_in(shape, every[: shape.n_key])]
            table = await read_ranges(cfg, snap.id, shape, where, budget=1 if limit else 0, over=over)
            break
        except TableTooLarge as e:
            if len(chosen) == 1:
                return None, [], e.bytes_per_row
            chosen = chosen[len(chosen) // 2 :][:1]  # each try reads the table again: one more, of one batch
    rows_read += table.rows_read
    got_keys, got_starts = await asyncio.to_thread(cut, table, shape, cfg.scan_samples)
    start_of = {tuple(k): int(s) for k, s in zip(got_keys.T.tolist(), got_starts.tolist(), strict=True)}
    layout = scan_layout(cfg, shape, array_lengths(table), plan)
    sources = {}
    for b, keys in wanted.items():
        found = [start_of.get(tuple(key)) for key in keys.T.tolist()]
        if any(start is None for start in found):
            raise SourceError("the checked samples' rows are not those the keys pass cut (the table changed?)")
        starts = np.asarray(found, dtype=np.int64)
        sources[b] = cut_source(cfg, plan, layout, table, starts, snap.id, snap.server_version, rows_read, b * size)

    def produce(batch: int, count: int, fetched: object, buffers: dict[str, np.ndarray]) -> None:
        sources[batch].produce(batch, count, fetched, buffers)

    checked_rows = table.keys.shape[1]
    row_bytes = table.nbytes / checked_rows if checked_rows else 0.0
    return dataclasses.replace(sources[chosen[0]], produce=produce), chosen, row_bytes


def series_in(shape: ScanShape, series: np.ndarray) -> str:
    """``WHERE (k1, k2) IN (VALUES (1, 2), ...)``: the rows of the given series (key columns, one per row).

    The keys are integers read from the table (int64 as Python ints): numbers in SQL text, never text.
    A list of ``VALUES`` is a hashed semi-join for the planner, however many keys it holds.
    """
    unique = np.unique(series, axis=1) if series.size else series
    cols = ", ".join(quote_ident(k) for k in shape.key_names[: shape.n_key])
    rows = ", ".join("(" + ", ".join(str(int(v)) for v in column) + ")" for column in unique.T.tolist())
    return f" WHERE ({cols}) IN (VALUES {rows})"
