"""A ``check`` of a table beyond ``[source] memory``: the epoch planned from its keys alone, nothing written.

The key and order columns are read (:func:`~pgprefetch.write.scan.keyspill.keys_pass`): held and cut as the
dump's read would cut them while they fit, ordered on disk by the external sort beyond that. The check then
states the epoch from the plan and samples a few batches' rows (:mod:`pgprefetch.write.check`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from pgprefetch.write.plan import EpochPlan
from pgprefetch.write.scan.keyspill import SpilledKeys, keys_pass
from pgprefetch.write.scan.partition import Partition
from pgprefetch.write.scan.strategy.job import ScanJob
from pgprefetch.write.scan.table import cut_whole
from pgprefetch.write.scan.whole import plan_scan, scan_plan


class KeysOnly:
    """The keys of every row, for the epoch's plan: what a check reads of a table beyond memory."""

    name = "keys only (a check)"
    takes_over = False

    def partition(self, job: ScanJob) -> Partition | None:
        """A check takes no read over: it reads the keys alone, again."""
        return None

    @contextlib.asynccontextmanager
    async def open(self, job: ScanJob) -> AsyncIterator[EpochPlan]:
        """The epoch's plan from a keys pass."""
        keys = await keys_pass(job.cfg, job.snap, job.shape, job.epoch, job.spill, job.on_rows)
        if isinstance(keys, SpilledKeys):
            try:
                yield scan_plan(job.shape, job.epoch, keys.order)
            finally:
                keys.close()
            return
        sample_keys, _ = await asyncio.to_thread(cut_whole, keys, job.shape, job.cfg.scan_samples)
        yield plan_scan(job.cfg, job.shape, sample_keys, job.epoch)

    def open_from(
        self, job: ScanJob, partition: Partition, rows_read: int
    ) -> contextlib.AbstractAsyncContextManager[EpochPlan]:
        """Never called: :meth:`partition` takes no read over."""
        raise AssertionError("a check takes no read over")
