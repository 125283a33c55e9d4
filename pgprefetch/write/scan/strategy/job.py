"""What every scan strategy is handed: the epoch, the described table, where it may spill, and what it must yield.

A strategy yields what its caller reads the epoch from: a scan epoch's batch source (a check's: its plan),
or, for a mixed epoch's scan source (:mod:`pgprefetch.write.mix.spilled`), the table read whole or its
buckets on disk. So the protocols are generic in it (``T``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

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


T = TypeVar("T", covariant=True)
# What a scan epoch's strategies yield: its batch source, or a check's plan.
Epoch = BatchSource | EpochPlan


class Strategy(Protocol[T]):
    """A way of reading a scan's table: its name (logged, and ``check``'s way) and what it yields."""

    name: str

    def open(self, job: ScanJob) -> AbstractAsyncContextManager[T]:
        """Read the table and yield the epoch's batch source (a check: its plan; a mixed source: its read)."""
        ...


class BeyondMemory(Strategy[T], Protocol[T]):
    """A strategy for a table beyond the budget, which may take over a read in memory that outgrew it."""

    takes_over: bool  # whether :meth:`partition` gives files for an outgrown read to go on into

    def partition(self, job: ScanJob) -> Partition | None:
        """The files the rest of an outgrown read streams into (None: it cannot take a read over)."""
        ...

    def open_from(self, job: ScanJob, partition: Partition, rows_read: int) -> AbstractAsyncContextManager[T]:
        """What a table whose ``rows_read`` rows are all in ``partition`` yields."""
        ...


S = TypeVar("S")


class SplitRead(Generic[S]):
    """A beyond-memory strategy whose one read of the table is split into files (:meth:`partition`) as it streams.

    The table is read once into them, straight away (the estimate said the table is beyond memory) or from
    where a read in memory outgrew the budget (:meth:`open_from`, which both ways end in).
    """

    takes_over = True

    def partition(self, job: ScanJob) -> Partition:
        """The files the table's rows are split into."""
        raise NotImplementedError

    def open_from(self, job: ScanJob, partition: Partition, rows_read: int) -> AbstractAsyncContextManager[S]:
        """What a table whose ``rows_read`` rows are all in ``partition`` yields."""
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def open(self, job: ScanJob) -> AsyncIterator[S]:
        """Read the table once into :meth:`partition`'s files, with whole category lists, then go on from them."""
        job = await job.coded_whole()
        partition = self.partition(job)
        n_rows = await stream(job.cfg, job.snap, job.shape, lambda chunk: None, job.on_rows, partition, keep=())
        async with self.open_from(job, partition, n_rows + job.coding.rows_read) as source:
            yield source
