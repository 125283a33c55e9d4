"""Scan mode's batch source for windows of a table larger than ``[source] memory``: its data passes.

The keys pass (:func:`~pgprefetch.write.scan.mode.read_scan`) read the table once and split its rows into the
passes' files by series (:mod:`.partition`), and ordered the windows (:mod:`.keyspill`); here each pass is
loaded and cut, its sorted rows appended to the rows file and the start row of each window the epoch uses
spooled by batch group (:mod:`.passes`), for ``produce`` to gather in order. (Rows beyond memory take a
shorter way: :mod:`.stretches`.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.errors import SourceError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.session import Snapshot
from pgprefetch.write import heap
from pgprefetch.write.batches import BatchSource, local_unit_batches
from pgprefetch.write.budget import Account, smallest_budget
from pgprefetch.write.plan import EpochPlan
from pgprefetch.write.scan.keyspill import locate
from pgprefetch.write.scan.mode import SpilledScan, array_lengths, scan_layout
from pgprefetch.write.scan.partition import Partition, pass_table
from pgprefetch.write.scan.passes import Spool
from pgprefetch.write.scan.rowsfile import RowsFile
from pgprefetch.write.scan.shape import ScanShape
from pgprefetch.write.scan.sweep import Groups
from pgprefetch.write.scan.table import Table, cut, longest_series


@contextlib.asynccontextmanager
async def spilled_source(
    cfg: Config, snap: Snapshot, read: SpilledScan, epoch: int, spool_dir: Path
) -> AsyncIterator[BatchSource]:
    """The windows of a table beyond memory: each data pass cut, its rows kept, its used windows' starts spooled.

    The rows file is closed and deleted when the batches are written (or the dump fails).
    """
    plan = read.plan(cfg, epoch)
    assert read.keys.partition is not None, "a table read in passes has its rows split into them"
    width = plan.key_columns.width
    passes = await _passes(cfg, read.shape, plan, read.keys.partition, lambda p: read.keys.wanted(p, width), spool_dir)
    try:
        if passes.cut != read.keys.samples:
            raise SourceError(
                "a data pass cut other samples than the keys pass (the table changed under the snapshot?)"
            )
        yield _gathered(cfg, plan, passes, snap, read.keys.rows_read)
    finally:
        passes.rows.close()
        passes.spool.remove()


@dataclass
class _Passes:
    """The data passes done: the windows' sorted rows on disk, and each used window's start row spooled."""

    layout: BatchLayout
    rows: RowsFile  # the passes' sorted rows, gathered from when the batches are written
    spool: Spool  # each used window's start row in ``rows``
    cut: int


async def _passes(
    cfg: Config,
    shape: ScanShape,
    plan: EpochPlan,
    partition: Partition,
    wanted: Callable[[int], tuple[np.ndarray, np.ndarray]],
    spool_dir: Path,
) -> _Passes:
    """Load and cut each data pass; keep its rows if it has windows the epoch uses (``wanted(p)``: places, keys).

    A pass holds its rows a few times over (loaded, joined, sorted); what stays is on disk: its sorted rows,
    appended to the rows file, and the start row of each of its used windows, spooled by batch group.
    Windows overlap: their epoch is up to ``window`` times the rows, too much to spool (a 2.8 GB epoch of
    48-row windows under 32 MiB: 22x the time in memory), so they are gathered from the rows when written.
    """
    rows = RowsFile(spool_dir / "sorted", shape.columns)
    spool: Spool | None = None
    layout: BatchLayout | None = None
    cut_count = 0
    try:
        for p in range(partition.passes):
            table = await asyncio.to_thread(pass_table, shape, partition, p)
            _check_pass_fits(cfg, shape, table, partition.room)
            pass_keys, pass_starts = await asyncio.to_thread(cut, table, shape, cfg.scan_samples)
            cut_count += pass_keys.shape[1]
            positions, keys = wanted(p)
            if not positions.size:
                continue
            if layout is None:
                layout = scan_layout(cfg, shape, array_lengths(table), plan)
                group = Account.for_scan(cfg.source.memory_bytes).start_group_bytes()
                start: list[tuple[str, np.dtype, tuple[int, ...]]] = [("start", np.dtype(np.int64), ())]
                spool = Spool(spool_dir / "batches", start, cfg.batches.size, plan.n_batches, group)
            assert spool is not None
            at = locate(pass_keys, keys)
            spool.add(positions, {"start": rows.rows + pass_starts[at]})
            await asyncio.to_thread(rows.append, table)
            del table, pass_keys, pass_starts, positions, keys, at
            heap.release()
    except BaseException:
        rows.close()
        raise
    finally:
        partition.remove()
    assert layout is not None, "an epoch has samples"
    assert spool is not None
    return _Passes(layout, rows, spool, cut_count)


def _check_pass_fits(cfg: Config, shape: ScanShape, table: Table, room: int) -> None:
    """Refuse a pass that is one series larger than a pass may be: no budget split could make it fit.

    A pass of several series larger than its share (an unlucky hash) is read as it is; one series is the
    least a pass can hold, since its windows cannot be split from its rows.
    """
    rows = table.keys.shape[1]
    if cfg.scan_samples.window is None or table.nbytes <= 2 * room or longest_series(table.keys) < rows:
        return
    need = smallest_budget(table.nbytes)
    raise SourceError(
        f"[samples] table: series ({KeyColumns(shape.key_names[:-1]).show(table.keys[:-1, 0])}) has {rows:,} rows "
        f"({table.nbytes / 2**20:,.1f} MiB decoded), more than a data pass holds under [source] memory "
        f"{cfg.source.memory_bytes / 2**20:,.0f} MiB; the least budget that reads it is --memory {need >> 20}MiB"
    )


def _gathered(cfg: Config, plan: EpochPlan, passes: _Passes, snap: Snapshot, rows_read: int) -> BatchSource:
    """The batch source of windows read in passes: gathered a group of batches at a time from the rows file."""
    size, layout = cfg.batches.size, passes.layout
    # Two threads, as for a table in memory: one takes its batches while the other's pwrite writes (zarr: one).
    threads = 2 if cfg.store.compression == "none" else 1
    account = Account.for_scan(cfg.source.memory_bytes)
    groups = Groups(passes.rows, layout, plan, passes.spool, account, threads)

    async def fetch(batch: int, count: int) -> object:
        return None

    def produce(batch: int, count: int, _: object, buffers: dict[str, np.ndarray]) -> None:
        groups.fill(batch, count, buffers)

    unit = min(local_unit_batches(size, layout.sample_bytes, cfg.source.memory_bytes), plan.n_batches)
    return BatchSource(plan, layout, snap.id, snap.server_version, rows_read, fetch, produce, threads, threads, unit)
