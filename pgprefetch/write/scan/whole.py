"""A scan's table read whole on a snapshot, and every epoch of a run cut from it in memory.

The read fixes the category lists first (the COPY codes the values): against the store's vocabulary when it
has every ``"auto"`` field (optimistic: a value it lacks arrives as code -1, and the lists are then read and
the table read again), otherwise from one read of the distinct values. The table is sorted by (key, order)
and cut into samples (:func:`~.table.cut_whole`); ``fetch`` has nothing to do and ``produce`` gathers a
batch's rows from memory (:func:`cut_source`), the gather the beyond-memory strategies use as well.
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
from pgprefetch.write.memory.policy import plan_bytes
from pgprefetch.write.plan import EpochPlan, Vocabulary, known_vocabulary, order_keys, resolve_categories
from pgprefetch.write.scan.shape import ScanShape, describe_scan, distinct_values
from pgprefetch.write.scan.starts import starts_source
from pgprefetch.write.scan.table import Overflow, Table, array_lengths, cut_whole, gather, read_table


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


class Coding:
    """The category lists a scan's COPY codes values against, and the reads spent finding them."""

    def __init__(self, cfg: Config, snap: Snapshot, vocabulary: Vocabulary | None) -> None:
        self.cfg, self.snap, self.vocabulary = cfg, snap, vocabulary
        self.rows_read = 0  # rows the distinct values' reads (and a given-up read) made the server read
        # The store's vocabulary has every "auto" field: code against it while reading, and read for the
        # distinct values only if the data holds one it lacks. Otherwise, one read for them all first.
        self.optimistic = known_vocabulary(cfg, vocabulary) is not None
        self._current: ScanShape | None = None

    @property
    def current(self) -> ScanShape:
        """The described table with the lists the COPY codes against now (the whole ones once completed)."""
        assert self._current is not None, "shape() describes the table first"
        return self._current

    async def shape(self) -> ScanShape:
        """The described table with its category lists (the store's, or read whole unless optimistic)."""
        shape = await describe_scan(self.cfg, self.snap)
        self._current = await self._coded(shape, whole=not self.optimistic)
        return self._current

    async def complete(self) -> ScanShape:
        """The table with whole category lists (a read of the distinct values, if the lists were the store's)."""
        if self.optimistic:
            self.optimistic = False
            self._current = await self._coded(self.current, whole=True)
        return self.current

    async def _coded(self, shape: ScanShape, *, whole: bool) -> ScanShape:
        async def distinct(columns: list[str]) -> dict[str, set[str]]:
            values, rows = await distinct_values(self.cfg, self.snap, shape, columns)
            self.rows_read += rows
            return values

        categories = await resolve_categories(self.cfg, distinct if whole else None, self.vocabulary)
        return dataclasses.replace(shape, categories=categories)


async def read_whole(
    cfg: Config,
    snap: Snapshot,
    coding: Coding,
    shape: ScanShape,
    on_rows: Callable[[int], None] | None = None,
    overflow: Overflow | None = None,
) -> ScanRead | None:
    """The table of ``shape`` read whole and cut; None when it outgrew the budget into ``overflow``.

    Raises :class:`~.table.TableTooLarge` when it outgrows the budget and there is no ``overflow``. A value
    of an ``"auto"`` field the store's lists lack (optimistic coding) makes it read the lists and the table
    again; so does outgrowing the budget with such lists (the rows handed on must be coded whole). The
    lists the rows were coded against, handed over or not, are ``coding.current``'s.
    """
    assert isinstance(cfg.samples, ScanConfig)
    handover = overflow if not coding.optimistic else None
    table = await read_table(cfg, snap, shape, on_rows=on_rows, overflow=handover)
    if handover is not None and handover.partition is not None:
        return None
    if coding.optimistic and _has_new_values(cfg, shape, table):  # a new value: its code is known only now
        coding.rows_read += table.rows_read  # the read given up: the server read those rows all the same
        del table
        heap.release()
        shape = await coding.complete()
        table = await read_table(cfg, snap, shape, on_rows=on_rows, overflow=overflow)
        if overflow is not None and overflow.partition is not None:
            return None
    table.rows_read += coding.rows_read
    sample_keys, starts = await asyncio.to_thread(cut_whole, table, shape, cfg.samples)
    return ScanRead(shape, table, sample_keys, starts, snap.id, snap.server_version)


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
    if cfg.store.windows == "starts":
        row_layout = BatchLayout.build(
            cfg.fields, read.shape.columns, read.shape.by_field, array_lengths(read.table), 1, plan.key_columns
        )
        starts = starts[: plan.used]
        return starts_source(
            cfg, plan, layout, row_layout, read.table, starts, read.snapshot, read.server_version, rows_read
        )
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
