"""The dump's contracts: what a batch source hands the writer, what progress hears, how units are sized.

The writer (:mod:`pgprefetch.write.pipeline`, :mod:`pgprefetch.write.schedule`) knows nothing of where the
batches come from. It gets a :class:`BatchSource`: the epoch's plan (keys in order, counts), the decoding
layout, and per *unit* (a run of consecutive batches) two steps: ``fetch``, the database side, awaited on
the event loop, and ``produce``, the CPU side, run on the writer's thread, which fills the unit's buffers.
The query mode (:mod:`pgprefetch.write.query`) and the scan mode (:mod:`pgprefetch.write.scan.strategy`) each
build one; :mod:`pgprefetch.write.sources` chooses which.

A unit is one batch, unless batches are small: every step has a fixed cost (a round trip, a statement, a
thread hand-off, a write and a journal line), so batches of 10 are handled up to ~100 at a time, and the
database and the client see units of up to about a thousand samples whatever the batch size.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.store.base import STARTS_ARRAY, ArraySpec
from pgprefetch.write.files.stats import EpochStats
from pgprefetch.write.memory.policy import UNIT_BYTES, unit_bytes
from pgprefetch.write.plan import EpochPlan

UNIT_SAMPLES = 1024  # the most samples a unit of small batches holds
UNIT_SECONDS = 0.05  # the fetch time units aim at: a statement's round trip


def unit_batches(size: int, sample_bytes: int = 1, statements: int = 1) -> int:
    """The most consecutive batches in one fetched unit: about ``UNIT_SAMPLES`` samples of ``size`` a batch.

    Large samples cap it at ``UNIT_BYTES`` of buffers (each worker holds a unit's); a unit is one batch at
    least, whatever its size. A unit fetched with several ``statements`` (a mixed epoch: one per query
    source) may hold that many times the samples, so that each statement still carries about as many.
    """
    return max(1, min(UNIT_SAMPLES * statements // size, UNIT_BYTES // max(1, size * sample_bytes)))


def local_unit_batches(size: int, sample_bytes: int, budget: int | None = None) -> int:
    """The most batches in one unit of a source with nothing to fetch (scan mode): about ``UNIT_BYTES``.

    Under a ``budget`` (``[source] memory``) the unit's bytes are its share (:func:`~.budget.unit_bytes`).

    Each unit is handed from the event loop to a writer thread and back, and the loop waits for the GIL
    to take it back. With nothing to fetch that hand-off was the write's limit: at 1,000 samples of 92
    bytes a unit the writer threads were busy 40% of the time.
    """
    most = UNIT_BYTES if budget is None else unit_bytes(budget)
    return max(1, most // max(1, size * sample_bytes))


Arrays = list[tuple[str, np.dtype, tuple[int, ...]]]  # (name, dtype, shape of one item)


@dataclass(frozen=True)
class RowArrays:
    """The rows a windows epoch stored as starts keeps once: ``per_batch`` rows a chunk, beside ``_starts``.

    Every array keeps a chunk per batch (the rows' ``n_rows`` spread evenly over the epoch's batches), so the
    writer journals, checksums and resumes them as it does the samples' (:mod:`pgprefetch.write.scan.starts`).
    """

    arrays: tuple[tuple[str, np.dtype, tuple[int, ...]], ...]  # the layout's arrays, one row of each
    per_batch: int
    n_rows: int
    window: int

    @property
    def row_bytes(self) -> int:
        """One row's bytes over the arrays."""
        return sum(d.itemsize * int(np.prod(s)) for _, d, s in self.arrays)


@dataclass(frozen=True)
class BatchSource:
    """One epoch's batches, ready to be written."""

    plan: EpochPlan
    layout: BatchLayout
    snapshot: str
    server_version: str
    rows_read: int | None  # table rows read for this epoch (scan mode); None when not counted
    fetch: Callable[[int, int], Awaitable[object]]  # (first batch, count) -> what produce needs
    produce: Callable[[int, int, object, dict[str, np.ndarray]], None]  # fills count * size samples
    concurrency: int  # units in flight
    threads: int = 1  # threads producing and writing them
    unit: int = 1  # the most consecutive batches fetched and produced together (buffers hold that many)
    warnings: tuple[str, ...] = ()  # what planning found that will cost the dump dearly (a missing index)
    spread: object | None = None  # an executor's read, on its cluster, that the batches are cut from there
    extra_arrays: tuple[tuple[str, np.dtype, tuple[int, ...]], ...] = ()  # filled by produce beside the layout's
    records: dict[str, Any] | None = None  # what the manifest records beyond the plan (a mixed epoch's sources)
    unit_seconds: float = UNIT_SECONDS  # the fetch time units aim at (:class:`~pgprefetch.write.schedule.Units`)
    slot_sources: np.ndarray | None = None  # a mixed epoch: each sample's source code, in epoch order ...
    slots_from: int = 0  # ... from this sample on (a part of the epoch holds its own batches' alone)
    cut: Callable[[range], AbstractContextManager[SourcePart]] | None = None  # what a cluster's part is sent
    rows: RowArrays | None = None  # windows stored as starts: produce fills these and ``_starts``, not the layout's
    stats: EpochStats | None = None  # the statistics, where they are not the layout's batches' (windows as starts)
    identity: dict[str, str] = field(default_factory=dict)  # what a partial epoch must match beyond its keys

    @property
    def arrays(self) -> Arrays:
        """Every array of samples ``produce`` fills: the layout's (or ``_starts``), then the extra ones."""
        own = [(STARTS_ARRAY, np.dtype(np.int64), ())] if self.rows is not None else self.layout.arrays()
        return [*own, *self.extra_arrays]

    @property
    def sample_bytes(self) -> int:
        """One sample's bytes over :attr:`arrays`."""
        return sum(d.itemsize * int(np.prod(s)) for _, d, s in self.arrays)

    def specs(self) -> list[ArraySpec]:
        """The epoch's arrays as the writer creates them: the samples', then the rows' (the keys are the writer's)."""
        specs = [ArraySpec(name, dtype, shape) for name, dtype, shape in self.arrays]
        if self.rows is not None:
            specs += [ArraySpec(name, dtype, shape, self.rows.per_batch) for name, dtype, shape in self.rows.arrays]
        return specs

    def allocate(self, n: int, batches: int) -> dict[str, np.ndarray]:
        """Zeroed buffers of :attr:`arrays` for ``n`` samples (and of the rows for ``batches`` batches)."""
        out = {name: np.zeros((n, *shape), dtype=dtype) for name, dtype, shape in self.arrays}
        if self.rows is not None:
            rows = batches * self.rows.per_batch
            out |= {name: np.zeros((rows, *shape), dtype=dtype) for name, dtype, shape in self.rows.arrays}
        return out

    def buffer_bytes(self, n: int, batches: int) -> int:
        """The bytes of :meth:`allocate`'s buffers."""
        return n * self.sample_bytes + (batches * self.rows.per_batch * self.rows.row_bytes if self.rows else 0)

    def sources_at(self, start: int, n: int) -> np.ndarray | None:
        """Samples ``start ... start + n - 1``'s source codes (a mixed epoch), None for a single source."""
        if self.slot_sources is None:
            return None
        return self.slot_sources[start - self.slots_from : start - self.slots_from + n]

    def epoch_bytes(self, size: int) -> int:
        """The bytes of the epoch's arrays, keys included, uncompressed: what the dump writes, what check says."""
        rows = self.plan.n_batches * self.rows.per_batch * self.rows.row_bytes if self.rows else 0
        return self.plan.n_batches * size * (self.sample_bytes + 8 * self.plan.key_columns.width) + rows


class SourcePart(Protocol):
    """What :attr:`BatchSource.cut` sends a cluster's part of an epoch whose batches it cannot rebuild alone.

    A mixed epoch's (:mod:`pgprefetch.write.mix.parts`) or a packed one's (:mod:`pgprefetch.write.pack.parts`):
    the part serves its batches with it, on the driver's exported snapshot.
    """

    def served(
        self, cfg: Config, plan: EpochPlan, snapshot: str, server_version: str
    ) -> AbstractAsyncContextManager[BatchSource]:
        """The part's batches (``cfg`` with its password: the part's connections are its own)."""


class Advances(Protocol):
    """What writing the batches reports: each unit on disk (a spread epoch's parts send only that)."""

    def advance(self, samples: int, nbytes: int) -> None:
        """A batch of ``samples`` samples, ``nbytes`` bytes, is on disk."""


class Progress(Advances, Protocol):
    """What the dump reports while it runs (the CLI shows it as a progress bar)."""

    def reading(self, epoch: int) -> None:
        """Scan mode: the table read begins (rows are counted by :meth:`rows`)."""

    def rows(self, n: int) -> None:
        """Scan mode: ``n`` more table rows arrived."""

    def start(self, epoch: int, n_samples: int) -> None:
        """The epoch's size is known and fetching begins."""

    def parts(self, done: int, total: int) -> None:
        """A spread epoch (``--executor ray``): ``done`` of its ``total`` parts have finished (0 when it begins).

        Called after the :meth:`advance` that counted the samples written so far, so a line shown for a part
        that finished has the figures of that moment.
        """

    def close(self) -> None:
        """The epoch is done (or failed)."""
