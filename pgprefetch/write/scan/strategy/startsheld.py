"""Windows stored as starts beyond memory: refused in one line naming the ``--memory`` that holds the table.

A starts epoch is cut from the table in memory (:mod:`pgprefetch.write.scan.starts`): its rows are stored in
(key, order) order and each window found among them. Beyond memory, the windows' passes
(:mod:`.passes`) would need the rows of every pass written in one order and the starts mapped into it, which
is not built; until it is, such a table is refused before it is read (the estimate says so), or where a read
in memory outgrows the budget, with the least budget that holds it. ``windows = "batches"`` reads any table.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from pgprefetch.config.model import Config
from pgprefetch.config.values import show_size
from pgprefetch.errors import ConfigError
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.memory.policy import ESTIMATE_MARGIN, STARTS_ROW_BYTES, least_budget
from pgprefetch.write.scan.partition import Partition
from pgprefetch.write.scan.strategy.job import ScanJob


class StartsHeld:
    """The "beyond memory" of windows stored as starts: a refusal, with the budget that would hold the table."""

    name = "windows stored as starts, beyond memory (refused)"
    takes_over = False  # an outgrown read is given up (TableTooLarge), and measured, before open

    def partition(self, job: ScanJob) -> Partition | None:
        """None: nothing takes a read over."""
        return None

    def open_from(
        self, job: ScanJob, partition: Partition, rows_read: int
    ) -> contextlib.AbstractAsyncContextManager[BatchSource]:
        """Never called: :attr:`takes_over` is False."""
        raise AssertionError("windows stored as starts take no read over")

    @contextlib.asynccontextmanager
    async def open(self, job: ScanJob) -> AsyncIterator[BatchSource]:
        """Refuse, naming the least ``--memory`` that holds the table as estimated (or measured so far)."""
        raise ConfigError(
            refusal(job.cfg, job.shape.relation, job.guess.rows, job.guess.row_bytes, len(job.shape.key_names))
        )
        yield  # (unreachable: an async context manager must yield)


def refusal(cfg: Config, relation: str, rows: float, row_bytes: float, width: int) -> str:
    """The one line that refuses a starts epoch of a table past the budget: ``rows`` of ``row_bytes``, estimated."""
    n = int(rows * ESTIMATE_MARGIN)
    stride = cfg.scan_samples.stride
    placed = row_bytes + STARTS_ROW_BYTES  # (the windows placed beside the table)
    need = least_budget(lambda p: p.fits_in_memory(n, placed, -(-n // stride), width))
    return (
        f'[store] windows = "starts" cuts an epoch from the table held in memory, and {relation} (about {n:,} rows) '
        f"does not fit [source] memory = {show_size(cfg.source.memory_bytes)}: give --memory {show_size(need)} or "
        'more, or windows = "batches", which reads any table'
    )
