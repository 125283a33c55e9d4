"""What every scan strategy is handed: the epoch, the described table, where it may spill, and what it must yield."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from pgprefetch.config.model import Config
from pgprefetch.pg.session import Snapshot
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.plan import EpochPlan
from pgprefetch.write.scan.keyspill import stream
from pgprefetch.write.scan.partition import Partition
from pgprefetch.write.scan.shape import ScanShape
from pgprefetch.write.scan.strategy.choice import Estimate
from pgprefetch.write.scan.whole import Coding
from pgprefetch.write.spill.folder import SpillFolder


@dataclass(frozen=True)
class ScanJob:
    """One epoch's scan: its table as described and coded, the planner's estimate, and the dump's spill folder."""

    cfg: Config
    snap: Snapshot
    epoch: int
    shape: ScanShape
    coding: Coding
    guess: Estimate
    spill: SpillFolder
    on_rows: Callable[[int], None] | None = None

    def measured(self, rows: int, row_bytes: float) -> ScanJob:
        """The job with a read's measure of the table: ``rows`` read so far of ``row_bytes`` each."""
        guess = Estimate(max(self.guess.rows, 2.0 * rows), row_bytes or self.guess.row_bytes)
        return dataclasses.replace(self, guess=guess)

    async def coded_whole(self) -> ScanJob:
        """The job with whole category lists: a strategy that codes rows it keeps on disk needs them."""
        return dataclasses.replace(self, shape=await self.coding.complete())

    def coded(self) -> ScanJob:
        """The job with the lists its read coded the rows against (the whole ones, after a second read)."""
        return dataclasses.replace(self, shape=self.coding.current)


class Strategy(Protocol):
    """A way of reading a scan's table: its name (logged, and ``check``'s way) and its batch source."""

    name: str

    def open(self, job: ScanJob) -> AbstractAsyncContextManager[BatchSource | EpochPlan]:
        """Read the table and yield the epoch's batch source (a check: its plan)."""
        ...


class BeyondMemory(Strategy, Protocol):
    """A strategy for a table beyond the budget, which may take over a read in memory that outgrew it."""

    takes_over: bool  # whether :meth:`partition` gives files for an outgrown read to go on into

    def partition(self, job: ScanJob) -> Partition | None:
        """The files the rest of an outgrown read streams into (None: it cannot take a read over)."""
        ...

    def open_from(
        self, job: ScanJob, partition: Partition, rows_read: int
    ) -> AbstractAsyncContextManager[BatchSource | EpochPlan]:
        """The batch source of a table whose ``rows_read`` rows are all in ``partition``."""
        ...


class SplitRead:
    """A beyond-memory strategy whose one read of the table is split into files (:meth:`partition`) as it streams.

    The table is read once into them, straight away (the estimate said the table is beyond memory) or from
    where a read in memory outgrew the budget (:meth:`open_from`, which both ways end in).
    """

    takes_over = True

    def partition(self, job: ScanJob) -> Partition:
        """The files the table's rows are split into."""
        raise NotImplementedError

    def open_from(self, job: ScanJob, partition: Partition, rows_read: int) -> AbstractAsyncContextManager[BatchSource]:
        """The batch source of a table whose ``rows_read`` rows are all in ``partition``."""
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def open(self, job: ScanJob) -> AsyncIterator[BatchSource]:
        """Read the table once into :meth:`partition`'s files, with whole category lists, then go on from them."""
        job = await job.coded_whole()
        partition = self.partition(job)
        n_rows = await stream(job.cfg, job.snap, job.shape, lambda chunk: None, job.on_rows, partition, keep=())
        async with self.open_from(job, partition, n_rows + job.coding.rows_read) as source:
            yield source
