"""Windows beyond ``[source] memory``: the table split by series as it is read, each data pass cut once.

A window needs every row of its series, so the rows are split into passes of whole series by a hash of
the series key (:class:`~pgprefetch.write.scan.partition.Partition`). Each pass is loaded, sorted by (key,
order) and cut once, its sorted rows appended to the rows file (:mod:`..cutpasses`), and the windows are
ordered (on disk beyond the budget) with each one's start row there carried beside its key
(:mod:`..keyspill`). The batches are then gathered in that order from the rows file, a group of batches at a
time, reading it forward (:mod:`..sweep`). (Rows take a shorter way: :mod:`.stretches`.)
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
from pgprefetch.write.scan.keyspill import SpilledKeys, cut_passes_and_order
from pgprefetch.write.scan.partition import Partition, bucket_count
from pgprefetch.write.scan.shape import ScanShape
from pgprefetch.write.scan.strategy.job import ScanJob, SplitRead
from pgprefetch.write.scan.sweep import Groups
from pgprefetch.write.scan.whole import scan_layout, scan_plan


@contextlib.asynccontextmanager
async def spilled_source(
    cfg: Config, snap: Snapshot, shape: ScanShape, keys: SpilledKeys, epoch: int
) -> AsyncIterator[BatchSource]:
    """The windows of a table beyond memory, gathered in the epoch's order from the passes' rows.

    The rows file is closed and deleted when the batches are written (or the dump fails).
    """
    rows = keys.rows
    assert keys.partition is not None, "a table read in passes has its rows split into them"
    assert rows is not None, "a dump's keys pass cut the data passes"
    try:
        plan = scan_plan(shape, epoch, keys.order)
        layout = scan_layout(cfg, shape, rows.lengths, plan)
        yield _gathered(cfg, plan, layout, keys, snap)
    finally:
        keys.close()
        rows.close()
        keys.partition.remove()


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


def series_partition(job: ScanJob) -> Partition:
    """Files of whole series for ``job``'s estimated rows, each a data pass's share of the budget."""
    policy = Policy.for_scan(job.cfg.source.memory_bytes)
    room = policy.pass_bytes()
    buckets = bucket_count(job.guess.rows, max(1.0, job.guess.row_bytes), room)
    return Partition(job.spill.sub("partition"), buckets, job.shape.n_key, room, hold=policy.partition_hold_bytes())


class InPasses(SplitRead[BatchSource]):
    """Windows beyond memory: the table split by series as it is read, each pass cut once, then gathered."""

    name = "windows in passes of whole series"

    def partition(self, job: ScanJob) -> Partition:
        """The data passes' files for the estimated rows, each pass a share of the budget."""
        return series_partition(job)

    @contextlib.asynccontextmanager
    async def open_from(self, job: ScanJob, partition: Partition, rows_read: int) -> AsyncIterator[BatchSource]:
        """The batch source of windows whose table's rows are all in ``partition``."""
        try:
            keys = await cut_passes_and_order(job.cfg, job.shape, job.epoch, job.spill, partition, rows_read)
        except BaseException:
            partition.remove()
            raise
        async with spilled_source(job.cfg, job.snap, job.shape, keys, job.epoch) as source:
            yield source
