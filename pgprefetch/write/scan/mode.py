"""Scan mode's batch sources: the table read once on a snapshot, each epoch cut from it.

``fetch`` has nothing to do; ``produce`` gathers the batch's rows from memory. A table larger than
``[source] memory`` is split as it is read (:func:`read_scan`): rows into stretches of the epoch's order
(:mod:`.stretches`), windows into passes of whole series (:mod:`.multipass`). One read held in memory serves
every epoch of a ``--epochs A-B`` run (:class:`ScanRead`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pgprefetch.config.model import Config, ScanConfig
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.pg.columns import Column
from pgprefetch.pg.session import Snapshot
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource, local_unit_batches
from pgprefetch.write.memory import heap
from pgprefetch.write.memory.policy import Policy, plan_bytes
from pgprefetch.write.plan import EpochPlan, Vocabulary, known_vocabulary, order_keys, resolve_categories
from pgprefetch.write.scan.keyspill import SpilledKeys, keys_pass, stream
from pgprefetch.write.scan.partition import EpochRanges, Partition, bucket_count
from pgprefetch.write.scan.shape import ScanShape, describe_scan, distinct_values, keys_only
from pgprefetch.write.scan.table import (
    Table,
    TableTooLarge,
    array_lengths,
    cut_whole,
    gather,
    read_table,
)
from pgprefetch.write.spill.folder import SpillFolder


def scan_layout(cfg: Config, shape: ScanShape, lengths: dict[Column, int], plan: EpochPlan) -> BatchLayout:
    """The batch layout of a scanned table's epoch; ``lengths``: each array column's element count.

    Built here for every way a scan reads (whole, in passes, spread over a cluster), so that their batches
    cannot drift apart.
    """
    return BatchLayout.build(cfg.fields, shape.columns, shape.by_field, lengths, cfg.samples.rows, plan.key_columns)


def plan_scan(cfg: Config, shape: ScanShape, sample_keys: np.ndarray, epoch: int) -> EpochPlan:
    """The epoch of a scanned table: its samples (cut by :func:`~pgprefetch.write.scan.table.cut`) in epoch order."""
    order = order_keys(cfg, sample_keys, shape.key_columns, epoch)
    index = order.pop("index")
    return scan_plan(shape, epoch, order, samples=index)


def scan_plan(shape: ScanShape, epoch: int, order: dict[str, Any], samples: np.ndarray | None = None) -> EpochPlan:
    """A scanned table's epoch from its order's fields (:func:`~pgprefetch.write.plan.order_keys`'s but ``index``).

    ``samples``: the order as indices into the cut samples, where they are held (None: the keys are on disk).
    """
    return EpochPlan(
        epoch=epoch,
        key_columns=shape.key_columns,
        **order,
        columns=shape.columns,
        by_field=shape.by_field,
        categories=shape.categories,
        sql="",
        params=(),
        samples=samples,
    )


@dataclass
class ScanRead:
    """A table read once on one snapshot, cut into samples: what every epoch of a ``--epochs`` run uses."""

    shape: ScanShape
    table: Table
    sample_keys: np.ndarray  # (n_key_columns, n_samples), in key order
    starts: np.ndarray  # the row each sample starts at
    snapshot: str
    server_version: str
    epochs_cut: int = 0
    fits: bool = True  # False: ``table`` holds only the keys (a check of a table beyond memory)
    bytes_per_row: float = 0.0


@dataclass
class SpilledScan:
    """A table larger than ``[source] memory`` whose keys outgrew it too: its epoch's order is on disk."""

    shape: ScanShape
    keys: SpilledKeys
    snapshot: str
    server_version: str
    epoch: int  # the epoch the keys were ordered for

    def plan(self, cfg: Config, epoch: int) -> EpochPlan:
        """The epoch the keys pass ordered, as a plan: no per-sample index (``samples`` None)."""
        assert epoch == self.epoch, "keys ordered on disk serve the epoch they were ordered for"
        return scan_plan(self.shape, epoch, self.keys.order)


@dataclass
class Stretches:
    """Rows larger than ``[source] memory``, read once into ranges of their epoch's order (a stretch each)."""

    shape: ScanShape
    ranges: EpochRanges
    snapshot: str
    server_version: str
    epoch: int  # the epoch whose order the ranges follow
    rows_read: int


async def read_scan(
    cfg: Config,
    snap: Snapshot,
    on_rows: Callable[[int], None] | None = None,
    vocabulary: Vocabulary | None = None,
    *,
    epoch: int = 0,
    spill: SpillFolder | None = None,
    write: bool = True,
) -> ScanRead | SpilledScan | Stretches:
    """Describe, read and cut the table of a scan config on ``snap``; only its keys if it does not fit.

    ``on_rows`` hears of the rows as they arrive (the progress bar). The category lists are fixed first,
    against ``vocabulary``'s store, since the COPY codes the values: every epoch cut from the read has them.
    Keys that do not fit ``[source] memory`` either are ordered on disk for ``epoch`` in ``spill``
    (:mod:`pgprefetch.write.scan.keyspill`; the caller removes it); without ``spill`` they are held.
    A table that does not fit has its rows split into its data passes' files in ``spill`` as its keys are
    read (:mod:`pgprefetch.write.scan.partition`; without ``write``, only its keys are read: a check). Rows (no
    window) that do not fit are split by ranges of ``epoch``'s order instead, and need no keys pass at all
    (:class:`Stretches`).
    """
    assert isinstance(cfg.samples, ScanConfig)
    shape = await describe_scan(cfg, snap)
    counted = [0]  # rows the distinct values' read read

    async def distinct(columns: list[str]) -> dict[str, set[str]]:
        values, rows = await distinct_values(cfg, snap, shape, columns)
        counted[0] += rows
        return values

    # The store's vocabulary has every "auto" field: code against it while reading, and read for the
    # distinct values only if the data holds one it lacks. Otherwise, one read for them all first.
    optimistic = known_vocabulary(cfg, vocabulary) is not None
    categories = await resolve_categories(cfg, None if optimistic else distinct, vocabulary)
    shape = dataclasses.replace(shape, categories=categories)
    try:
        too_large = await _clearly_too_large(cfg, snap, shape)
        if too_large is not None:
            raise too_large
        table = await read_table(cfg, snap, shape, on_rows=on_rows)
        if optimistic and _has_new_values(cfg, shape, table):  # a new value: its code is known only now
            optimistic = False
            counted[0] += table.rows_read  # the read given up: the server read those rows all the same
            del table
            heap.release()
            categories = await resolve_categories(cfg, distinct, vocabulary)
            shape = dataclasses.replace(shape, categories=categories)
            table = await read_table(cfg, snap, shape, on_rows=on_rows)
        fits, per_row = True, 0.0
        table.rows_read += counted[0]
    except TableTooLarge as e:  # what was read so far is dropped: the keys pass reads the table again, once
        fits, per_row = False, e.bytes_per_row
        heap.release()
        if optimistic:  # the data passes code what they read: the lists must be whole before them
            categories = await resolve_categories(cfg, distinct, vocabulary)
            shape = dataclasses.replace(shape, categories=categories)
        already = e.rows + counted[0]
        if spill is None:
            table = await read_table(cfg, snap, keys_only(shape), budget=0, on_rows=on_rows)
        elif write and cfg.scan_samples.window is None:
            ranges = await _epoch_ranges(cfg, snap, shape, e, spill.sub("ranges"), epoch)
            n_rows = await stream(cfg, snap, shape, lambda chunk: None, on_rows, ranges, keep=())
            await asyncio.to_thread(ranges.settle)
            return Stretches(shape, ranges, snap.id, snap.server_version, epoch, n_rows + already)
        else:
            partition = await _partition(cfg, snap, shape, e, spill.sub("partition")) if write else None
            got = await keys_pass(cfg, snap, shape, epoch, spill, partition, on_rows)
            if isinstance(got, SpilledKeys):
                got.rows_read += already
                return SpilledScan(shape, got, snap.id, snap.server_version, epoch)
            table = got
        table.rows_read += already
    sample_keys, starts = await asyncio.to_thread(cut_whole, table, shape, cfg.samples)
    return ScanRead(shape, table, sample_keys, starts, snap.id, snap.server_version, fits=fits, bytes_per_row=per_row)


async def _partition(cfg: Config, snap: Snapshot, shape: ScanShape, e: TableTooLarge, folder: SpillFolder) -> Partition:
    """The data passes' files for a table too large: buckets for the planner's row count (or what was read, twice)."""
    account = Policy.for_scan(cfg.source.memory_bytes)
    room = account.pass_bytes()
    rows = await _rows_estimate(snap, shape, e)
    buckets = bucket_count(rows, e.bytes_per_row, room)
    return Partition(folder, buckets, shape.n_key, room, hold=account.partition_hold_bytes())


async def _epoch_ranges(
    cfg: Config, snap: Snapshot, shape: ScanShape, e: TableTooLarge, folder: SpillFolder, epoch: int
) -> EpochRanges:
    """:func:`_partition` for rows: ranges of ``epoch``'s order, each a stretch's share of the budget."""
    account = Policy.for_scan(cfg.source.memory_bytes)
    room = account.stretch_bytes(e.bytes_per_row)
    buckets = bucket_count(await _rows_estimate(snap, shape, e), e.bytes_per_row, room)
    hold = account.partition_hold_bytes()
    return EpochRanges(folder, buckets, shape.n_key, room, hold, seed=cfg.batches.seed, epoch=epoch)


async def _rows_estimate(snap: Snapshot, shape: ScanShape, e: TableTooLarge) -> float:
    """The table's rows as the planner counts them, or twice what the given-up read had read."""
    rows = 2.0 * e.rows
    if shape.plain_table:
        sql = "SELECT reltuples::float8 FROM pg_class WHERE oid = $1::text::regclass"
        rows = max(rows, float((await snap.fetch(sql, f"row estimate of {shape.relation}", shape.relation))[0][0]))
    return rows


def _has_new_values(cfg: Config, shape: ScanShape, table: Table) -> bool:
    """Whether a table read coded against the store's vocabulary holds a value of an ``"auto"`` field it lacks.

    Such a value was sent as code -1, as a NULL is (which its mask tells apart).
    """
    for f in cfg.fields:
        if f.categories != "auto":
            continue
        for c in shape.by_field[f.name]:
            unknown = table.values[c] == -1
            if c in table.masks:
                unknown &= ~table.masks[c]
            if unknown.any():
                return True
    return False


# Skip the first read when the planner's row count puts the decoded table this far past memory. The read
# gives up at the budget anyway, so an estimate a little high costs only a slower (multi-pass) dump of the
# same bytes; one too low is caught by the read's own check.
ESTIMATE_MARGIN = 1.1


async def _clearly_too_large(cfg: Config, snap: Snapshot, shape: ScanShape) -> TableTooLarge | None:
    """A table the planner's statistics put well past ``[source] memory``: go straight to the keys pass.

    Otherwise the first read runs until it outgrows the budget and is given up: on 10M rows under 512 MiB,
    about two thirds of the table read for nothing. Only for a plain table of fixed-width scalar columns,
    whose decoded row size is known before reading (an array's length is not), with ``reltuples`` known
    (-1 before the first ``ANALYZE``); anything else, or a wrong estimate, is caught by the read's own check.
    """
    budget = cfg.source.memory_bytes
    if not budget or not shape.plain_table or any(c.is_array or c.padded is not None for c in shape.columns):
        return None
    per_row = sum(w.itemsize for w in shape.key_wire) + (shape.order_wire.itemsize if shape.order_wire else 0)
    per_row += sum(c.wire.itemsize + (1 if c.nullable else 0) for c in shape.columns)
    sql = "SELECT reltuples::float8 FROM pg_class WHERE oid = $1::text::regclass"
    rows = float((await snap.fetch(sql, f"row estimate of {shape.relation}", shape.relation))[0][0])
    if rows <= 0:
        return None
    n = int(rows / ESTIMATE_MARGIN)
    stride = cfg.scan_samples.stride if cfg.scan_samples.window is not None else 1
    if Policy.for_scan(budget).fits_in_memory(n, per_row, -(-n // stride), len(shape.key_names)):
        return None
    return TableTooLarge(float(per_row), 0)


def scan_source(cfg: Config, read: ScanRead, epoch: int) -> BatchSource:
    """The scan mode: epoch ``epoch`` cut from a table already in memory."""
    plan = plan_scan(cfg, read.shape, read.sample_keys, epoch)
    layout = scan_layout(cfg, read.shape, array_lengths(read.table), plan)
    assert plan.samples is not None
    rows_read = read.table.rows_read if read.epochs_cut == 0 else 0  # the first epoch of a read pays for it
    read.epochs_cut += 1
    starts = read.starts[plan.samples]
    held = read.table.nbytes + plan_bytes(int(plan.samples.size), plan.key_columns.width)
    memory.current().reserve("table", held)  # the table and the epoch's plan, held while its batches are written
    return cut_source(cfg, plan, layout, read.table, starts, read.snapshot, read.server_version, rows_read)


def cut_source(
    cfg: Config,
    plan: EpochPlan,
    layout: BatchLayout,
    table: Table,
    starts: np.ndarray,
    snapshot: str,
    server_version: str,
    rows_read: int | None,
    first: int = 0,
) -> BatchSource:
    """Batches cut from ``table``: the sample at epoch place ``first + i`` starts at its row ``starts[i]``.

    The whole epoch from the whole table (``first`` 0), or a spread epoch's part from the rows its samples
    span (:mod:`pgprefetch.write.scan.exchange`).
    """
    size = cfg.batches.size

    async def fetch(batch: int, count: int) -> object:
        return None

    def produce(batch: int, count: int, _: object, buffers: dict[str, np.ndarray]) -> None:
        keys = plan.batch_keys(batch, size, count)
        at = batch * size - first
        gather(table, layout, starts[at : at + keys.shape[1]], keys, buffers)

    # Two threads: one gathers a batch while the other's pwrite (which releases the GIL) writes the last.
    # Compressed chunks go through zarr, which is left to one thread.
    threads = 2 if cfg.store.compression == "none" else 1
    unit = min(local_unit_batches(size, layout.sample_bytes, cfg.source.memory_bytes), plan.n_batches)
    return BatchSource(plan, layout, snapshot, server_version, rows_read, fetch, produce, threads, threads, unit)
