"""A scan's table that fits ``[source] memory``: read whole, kept for the run's next epochs, cut in memory.

The estimate said it fits, but an estimate can be low (no ``ANALYZE`` yet, a SELECT, arrays of unknown
length): the read measures itself against the budget as it goes
(:meth:`~pgprefetch.write.memory.policy.Policy.fits_in_memory`), and once it outgrows it the rows decoded so
far and the rest of each COPY go to the fallback's files (:class:`~pgprefetch.write.scan.table.Overflow`):
the table is read once either way. Only a read coded against the store's category lists (which may lack a
value the data holds) is given up and read again by the fallback, with whole lists: rows kept on disk
must be coded for good. A check's fallback reads the keys alone again.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from pgprefetch.write.memory import heap
from pgprefetch.write.scan.partition import Partition
from pgprefetch.write.scan.strategy.job import BeyondMemory, ScanJob
from pgprefetch.write.scan.table import Overflow, TableTooLarge
from pgprefetch.write.scan.whole import ScanRead, read_whole

T = TypeVar("T")


class InMemory(Generic[T]):
    """The table read whole and ``cut`` (its read handed to ``fallback`` if it outgrows the budget).

    ``cut`` makes what the caller reads from the table in memory: a scan epoch's batch source (its read kept
    for the run's next epochs), or the read itself (a mixed epoch's scan source).
    """

    name = "the table in memory"

    def __init__(self, fallback: BeyondMemory[T], cut: Callable[[ScanJob, ScanRead], T]) -> None:
        self.fallback = fallback
        self.cut = cut

    @contextlib.asynccontextmanager
    async def open(self, job: ScanJob) -> AsyncIterator[T]:
        """Read the table whole and cut the epoch from it; or go on beyond memory, from where the read got to."""
        overflow = (
            Overflow(lambda rows, row_bytes: self._handover(job, rows, row_bytes)) if self.fallback.takes_over else None
        )
        try:
            read = await read_whole(job.cfg, job.snap, job.coding, job.shape, job.on_rows, overflow)
        except TableTooLarge as e:  # no hand-over (a check, or lists still to complete): read again beyond
            heap.release()
            job.coding.rows_read += e.rows  # the server read those rows all the same
            async with self.fallback.open(job.measured(e.rows, e.bytes_per_row)) as source:
                yield source
            return
        if read is None:
            assert overflow is not None, "a read is handed over only where there is a fallback to take it"
            assert isinstance(overflow.partition, Partition), "the read was handed over to a partition"
            heap.release()
            rows_read = overflow.rows + job.coding.rows_read
            async with self.fallback.open_from(job.coded(), overflow.partition, rows_read) as source:
                yield source
            return
        yield self.cut(job, read)

    def _handover(self, job: ScanJob, rows: int, row_bytes: float) -> Partition:
        partition = self.fallback.partition(job.measured(rows, row_bytes))
        assert partition is not None, "a fallback that takes reads over"
        return partition
