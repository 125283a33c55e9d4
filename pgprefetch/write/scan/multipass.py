"""Scan mode's batch source for windows of a table larger than ``[source] memory``: its data passes.

The keys pass (:func:`~pgprefetch.write.scan.mode.read_scan`) read the table once, split its rows into the
passes' files by series (:mod:`.partition`), loaded and cut each pass once, keeping its sorted rows in the
rows file and its windows' keys and start rows beside it (:mod:`.cutpasses`), and ordered the windows
(:mod:`.keyspill`). Here the start row of each window the epoch uses is found by its key and spooled by batch
group (:mod:`.passes`), for ``produce`` to gather in order (:mod:`.sweep`). (Rows beyond memory take a
shorter way: :mod:`.stretches`.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.pg.session import Snapshot
from pgprefetch.write import heap
from pgprefetch.write.batches import BatchSource, local_unit_batches
from pgprefetch.write.budget import Account
from pgprefetch.write.plan import EpochPlan
from pgprefetch.write.scan.cutpasses import PassWindows
from pgprefetch.write.scan.mode import SpilledScan, scan_layout
from pgprefetch.write.scan.passes import Spool
from pgprefetch.write.scan.ranks import locate
from pgprefetch.write.scan.rowsfile import RowsFile
from pgprefetch.write.scan.sweep import Groups


@contextlib.asynccontextmanager
async def spilled_source(
    cfg: Config, snap: Snapshot, read: SpilledScan, epoch: int, spool_dir: Path
) -> AsyncIterator[BatchSource]:
    """The windows of a table beyond memory: each used window's start row spooled, the batches gathered.

    The rows file is closed and deleted when the batches are written (or the dump fails).
    """
    windows = read.keys.windows
    assert read.keys.partition is not None, "a table read in passes has its rows split into them"
    assert windows is not None, "a dump's keys pass cut the data passes"
    try:
        plan = read.plan(cfg, epoch)
        spool = await asyncio.to_thread(_spool, cfg, plan, read.keys.passes, windows, spool_dir, read.keys.wanted)
        try:
            layout = scan_layout(cfg, read.shape, windows.lengths, plan)
            yield _gathered(cfg, plan, layout, windows.rows, spool, snap, read.keys.rows_read)
        finally:
            spool.remove()
    finally:
        windows.rows.close()
        read.keys.partition.remove()


def _spool(
    cfg: Config,
    plan: EpochPlan,
    passes: int,
    windows: PassWindows,
    spool_dir: Path,
    wanted: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
) -> Spool:
    """Each used window's start row in the rows file, spooled in the epoch's order by batch group.

    A pass's used windows (``wanted(p, width)``: their places in the epoch and keys) are found among the
    windows it cut by their keys. Windows overlap: their epoch is up to ``window`` times the rows, too much
    to spool (a 2.8 GB epoch of 48-row windows under 32 MiB: 22x the time in memory), so only their start
    rows are, and they are gathered from the rows when written (:mod:`.sweep`).
    """
    group = Account.for_scan(cfg.source.memory_bytes).start_group_bytes()
    start: list[tuple[str, np.dtype, tuple[int, ...]]] = [("start", np.dtype(np.int64), ())]
    spool = Spool(spool_dir / "batches", start, cfg.batches.size, plan.n_batches, group)
    width = plan.key_columns.width
    for p in range(passes):
        positions, keys = wanted(p, width)
        pass_keys, pass_starts = windows.load(p)
        if positions.size:
            spool.add(positions, {"start": pass_starts[locate(pass_keys, keys)]})
        del positions, keys, pass_keys, pass_starts
        heap.release()
    return spool


def _gathered(
    cfg: Config, plan: EpochPlan, layout: BatchLayout, rows: RowsFile, spool: Spool, snap: Snapshot, rows_read: int
) -> BatchSource:
    """The batch source of windows read in passes: gathered a group of batches at a time from the rows file."""
    size = cfg.batches.size
    # Two threads, as for a table in memory: one takes its batches while the other's pwrite writes (zarr: one).
    threads = 2 if cfg.store.compression == "none" else 1
    groups = Groups(rows, layout, plan, spool, Account.for_scan(cfg.source.memory_bytes), threads)

    async def fetch(batch: int, count: int) -> object:
        return None

    def produce(batch: int, count: int, _: object, buffers: dict[str, np.ndarray]) -> None:
        groups.fill(batch, count, buffers)

    unit = min(local_unit_batches(size, layout.sample_bytes, cfg.source.memory_bytes), plan.n_batches)
    return BatchSource(plan, layout, snap.id, snap.server_version, rows_read, fetch, produce, threads, threads, unit)
