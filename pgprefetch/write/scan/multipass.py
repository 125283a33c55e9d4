"""Scan mode's batch source for windows of a table larger than ``[source] memory``: its data passes.

The keys pass (:func:`~pgprefetch.write.scan.mode.read_scan`) read the table once, split its rows into the
passes' files by series (:mod:`.partition`), loaded and cut each pass once, keeping its sorted rows in the
rows file (:mod:`.cutpasses`), and ordered the windows with each one's start row there carried beside its
key (:mod:`.keyspill`). Here the batches are gathered in that order from the rows file, a group of batches
at a time (:mod:`.sweep`). (Rows beyond memory take a shorter way: :mod:`.stretches`.)
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.pg.session import Snapshot
from pgprefetch.write.batches import BatchSource, local_unit_batches
from pgprefetch.write.memory.policy import Policy
from pgprefetch.write.plan import EpochPlan
from pgprefetch.write.scan.keyspill import SpilledKeys
from pgprefetch.write.scan.mode import SpilledScan, scan_layout
from pgprefetch.write.scan.sweep import Groups


@contextlib.asynccontextmanager
async def spilled_source(cfg: Config, snap: Snapshot, read: SpilledScan, epoch: int) -> AsyncIterator[BatchSource]:
    """The windows of a table beyond memory, gathered in the epoch's order from the passes' rows.

    The rows file is closed and deleted when the batches are written (or the dump fails).
    """
    rows = read.keys.rows
    assert read.keys.partition is not None, "a table read in passes has its rows split into them"
    assert rows is not None, "a dump's keys pass cut the data passes"
    try:
        plan = read.plan(cfg, epoch)
        layout = scan_layout(cfg, read.shape, rows.lengths, plan)
        yield _gathered(cfg, plan, layout, read.keys, snap)
    finally:
        rows.close()
        read.keys.partition.remove()


def _gathered(cfg: Config, plan: EpochPlan, layout: BatchLayout, keys: SpilledKeys, snap: Snapshot) -> BatchSource:
    """The batch source of windows read in passes: gathered a group of batches at a time from the rows file."""
    size = cfg.batches.size
    # Two threads, as for a table in memory: one takes its batches while the other's pwrite writes (zarr: one).
    threads = 2 if cfg.store.compression == "none" else 1
    assert keys.rows is not None, "a dump's keys pass cut the data passes"
    account = Policy.for_scan(cfg.source.memory_bytes)
    groups = Groups(keys.rows, layout, plan, size, keys.start_rows, keys.held, account, threads)

    async def fetch(batch: int, count: int) -> object:
        return None

    def produce(batch: int, count: int, _: object, buffers: dict[str, np.ndarray]) -> None:
        groups.fill(batch, count, buffers)

    unit = min(local_unit_batches(size, layout.sample_bytes, cfg.source.memory_bytes), plan.n_batches)
    rows_read = keys.rows_read
    return BatchSource(plan, layout, snap.id, snap.server_version, rows_read, fetch, produce, threads, threads, unit)
