"""How scan mode reads a table: one strategy, chosen before the table is read, each reading as its algorithm.

========================  ===========================  ========================  ===============================
strategy                  when                         holds                     spills (the dump's spill folder)
========================  ===========================  ========================  ===============================
:mod:`.inmemory`          the table and epoch fit      the table, the plan       nothing
:mod:`.stretches`         rows beyond memory           a stretch of the epoch    rows by order range, samples
:mod:`.passes`            windows beyond memory        a pass of whole series    rows by series, sorted rows, keys
:mod:`.keysonly`          a check beyond memory        the keys (or a run)       keys beyond memory
:mod:`.startsheld`        windows as starts, beyond    (refused: --memory named) nothing
========================  ===========================  ========================  ===============================

:func:`open_scan` describes the table and fixes its category lists (:class:`~..whole.Coding`), asks the
planner for an estimate and makes the choice (:mod:`.choice`); a read in memory that outgrows the budget
hands itself to the beyond-memory strategy of its kind midway, so the table is read once. Every strategy
reads with the one COPY stream (:mod:`..copyread`), spills through the one spill folder
(:mod:`pgprefetch.write.spill`) and reserves what it holds from the dump's memory pool
(:mod:`pgprefetch.write.memory`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from pgprefetch.config.model import Config
from pgprefetch.pg.session import Snapshot
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.plan import EpochPlan, Vocabulary
from pgprefetch.write.scan.strategy.choice import Estimate, beyond_memory, estimate
from pgprefetch.write.scan.strategy.inmemory import InMemory
from pgprefetch.write.scan.strategy.job import BeyondMemory, Epoch, ScanJob, Strategy
from pgprefetch.write.scan.strategy.keysonly import KeysOnly
from pgprefetch.write.scan.strategy.passes import InPasses
from pgprefetch.write.scan.strategy.startsheld import StartsHeld
from pgprefetch.write.scan.strategy.stretches import InStretches
from pgprefetch.write.scan.whole import Coding, ScanRead, scan_source
from pgprefetch.write.spill.folder import SpillFolder

log = logging.getLogger("pgprefetch")

T = TypeVar("T")


def choose(cfg: Config, job: ScanJob, *, write: bool, keep: list[ScanRead]) -> Strategy[Epoch]:
    """The strategy for ``job``'s table: see :mod:`.choice` for the rule. A table read whole goes to ``keep``."""
    beyond: BeyondMemory[Epoch]
    if not write:
        beyond = KeysOnly()
    elif cfg.store.windows == "starts":
        beyond = StartsHeld()
    elif cfg.scan_samples.window is not None:
        beyond = InPasses()
    else:
        beyond = InStretches()

    def cut(job: ScanJob, read: ScanRead) -> Epoch:
        keep.append(read)  # for the next epochs of the run
        return scan_source(job.cfg, read, job.epoch)

    return either(job, beyond, cut)


def either(job: ScanJob, beyond: BeyondMemory[T], cut: Callable[[ScanJob, ScanRead], T]) -> Strategy[T]:
    """``beyond`` where the estimate puts the table past the budget (:mod:`.choice`), else in memory, ``cut``."""
    return beyond if beyond_memory(job.cfg, job.shape, job.guess) else InMemory(beyond, cut)


@contextlib.asynccontextmanager
async def open_scan(
    cfg: Config,
    snap: Snapshot,
    epoch: int,
    spill: SpillFolder,
    *,
    write: bool = True,
    keep: list[ScanRead] | None = None,
    vocabulary: Vocabulary | None = None,
    on_rows: Callable[[int], None] | None = None,
) -> AsyncIterator[BatchSource | EpochPlan]:
    """The batch source of a scan epoch (a check, ``write`` False: its plan where the table is beyond memory).

    A table read whole is appended to ``keep``, for the next epochs of the run.
    """
    coding = Coding(cfg, snap, vocabulary)
    shape = await coding.shape()
    job = ScanJob(cfg, snap, epoch, shape, coding, await estimate(snap, shape), spill, on_rows)
    strategy = choose(cfg, job, write=write, keep=[] if keep is None else keep)
    log.debug("epoch %d: %s read as %s", epoch, shape.relation, strategy.name)
    async with strategy.open(job) as source:
        yield source


__all__ = ["Estimate", "ScanJob", "Strategy", "choose", "either", "estimate", "open_scan"]
