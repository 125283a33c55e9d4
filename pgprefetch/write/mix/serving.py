"""How a mixed epoch's units are filled: each source's run of samples decoded, then scattered into its slots.

The plan (:mod:`.source`) gives every slot its source and its place in that source's run (:class:`Slots`). A
unit of batches draws on each source for one contiguous run of its samples (the quota method keeps each
source's samples in batch order), so ``fetch`` runs one statement per query-mode source with samples in it,
concurrently, each on its own connections, and ``produce`` decodes each source's run into buffers of its own
and scatters them into the unit's slots with one fancy index per array, then fills the ``source`` array.

Each source is a :class:`Served`, decoded in the way it was read: by its batch statement (query mode), gathered
from its table (scan mode, in memory), read from its run file (scan mode, beyond its share) or, in a part of
an epoch spread over a cluster (:mod:`.parts`), from the samples the driver decoded for that part. The same
:func:`batch_source` serves the whole epoch and a part of it: a part's slots start at its first batch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from pgprefetch.config.model import SOURCE_ARRAY, Config
from pgprefetch.decode import collate
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.session import BatchReader
from pgprefetch.pg.statement import BatchStatement, Fetched
from pgprefetch.write.batches import BatchSource, SourcePart, local_unit_batches, unit_batches
from pgprefetch.write.plan import EpochPlan
from pgprefetch.write.scan.table import Table, gather
from pgprefetch.write.spill.columns import ColumnFile


@dataclass
class Served:
    """One source as the epoch's units draw on it: its run of samples and the one way they are decoded."""

    name: str
    code: int  # its position in [samples]: its samples' value in the ``source`` array
    layout: BatchLayout
    keys: np.ndarray  # (its key columns, its samples): the keys it gives the epoch, in the order it gives them
    key_columns: KeyColumns
    reader: BatchReader | None = None  # query mode: the workers running its batch statement
    statement: BatchStatement | None = None  # query mode: that statement
    table: Table | None = None  # scan mode, in memory: the table read ...
    starts: np.ndarray | None = None  # ... and the row each of its samples starts at
    run: ColumnFile | None = None  # scan mode, beyond its share: its run's samples, in order
    decoded: dict[str, np.ndarray] | None = None  # a part's scan source: its samples, decoded by the driver

    @property
    def fetches(self) -> bool:
        """Whether its samples come from the database at each unit (query mode)."""
        return self.statement is not None

    def decode(self, lo: int, hi: int, fetched: Fetched | None, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Its samples ``lo ... hi - 1`` of its run: decoded into ``out`` (or views of what was decoded already)."""
        keys = self.keys[:, lo:hi]
        if self.decoded is not None:
            return {name: array[lo:hi] for name, array in self.decoded.items()}
        if self.reader is not None:
            assert fetched is not None, "a query source's samples are fetched first"
            collate.decode(self.layout, fetched, keys, out)
        elif self.run is not None:
            self.run.read(lo, hi, out=out)
        else:
            assert self.table is not None, "a scan source in memory"
            assert self.starts is not None
            gather(self.table, self.layout, self.starts[lo:hi], keys, out)
        return out


@dataclass(frozen=True)
class Slots:
    """Where each of the epoch's samples (or a part's) comes from, in epoch order.

    ``codes``: each slot's source; ``index``: its place in that source's run; ``per_batch``: (batches,
    sources), each source's samples in each batch; ``first``: the batch they begin at (0, or a part's first).
    """

    codes: np.ndarray
    index: np.ndarray
    per_batch: np.ndarray
    first: int = 0

    @property
    def before(self) -> np.ndarray:
        """(batches + 1, sources): each source's samples before each batch of these slots."""
        zero = np.zeros((1, self.per_batch.shape[1]), dtype=np.int64)
        return np.vstack([zero, np.cumsum(self.per_batch, axis=0)])

    def runs(self, batch: int, count: int) -> list[tuple[int, int, int]]:
        """(source, lo, hi) for every source: its run ``lo ... hi - 1`` fills batches ``batch ... + count - 1``."""
        before, at = self.before, batch - self.first
        last = min(at + count, self.per_batch.shape[0])
        return [(c, int(before[at, c]), int(before[last, c])) for c in range(self.per_batch.shape[1])]

    def cut(self, batches: range, size: int) -> Slots:
        """The slots of ``batches`` alone, each one's place counted from its source's first sample there."""
        at = batches.start - self.first
        a, b = at * size, min((batches.stop - self.first) * size, self.codes.size)
        codes = self.codes[a:b]
        index = self.index[a:b] - self.before[at][codes]
        return Slots(codes, index, self.per_batch[at : batches.stop - self.first], batches.start)


def batch_source(
    cfg: Config,
    plan: EpochPlan,
    served: dict[int, Served],
    slots: Slots,
    snapshot: tuple[str, str],
    rows_read: int | None,
    records: dict[str, Any],
    cut: Callable[[range], AbstractContextManager[SourcePart]] | None = None,
) -> BatchSource:
    """The writer's view of a mixed epoch (or of a part's batches): units fetched from every source, scattered.

    ``snapshot``: its id and the server's version; ``records``: what the manifest records of the mix;
    ``cut``: what a cluster's part of the epoch is sent (:func:`~.parts.cut`), None in a part.
    """
    size = cfg.batches.size
    local = threading.local()  # each writer thread's buffers of each source
    queries = [s for s in served.values() if s.fetches]
    first = next(iter(served.values()))

    def runs(batch: int, count: int) -> list[tuple[Served, int, int]]:
        """Each source the epoch draws on, and its run of samples in the unit (a source not read has none)."""
        return [(served[c], lo, hi) for c, lo, hi in slots.runs(batch, count) if c in served]

    async def fetch(batch: int, count: int) -> object:
        wanted = [(s, lo, hi) for s, lo, hi in runs(batch, count) if s.fetches and hi > lo]
        got = await asyncio.gather(*(_fetch(s, batch, lo, hi, count) for s, lo, hi in wanted))
        return {s.code: f for (s, _, _), f in zip(wanted, got, strict=True)}

    def produce(batch: int, count: int, fetched: object, buffers: dict[str, np.ndarray]) -> None:
        blobs = cast("dict[int, Fetched]", fetched)
        a = (batch - slots.first) * size
        b = min(a + count * size, slots.codes.size)
        unit_codes, unit_index = slots.codes[a:b], slots.index[a:b]
        for s, lo, hi in runs(batch, count):
            if hi == lo:
                continue
            decoded = s.decode(lo, hi, blobs.get(s.code), _scratch(local, s, count * size))
            at = np.flatnonzero(unit_codes == s.code)
            slot = np.empty(hi - lo, dtype=np.int64)  # the slot of each of its samples, in the order decoded
            slot[unit_index[at] - lo] = at
            for name, array in decoded.items():
                buffers[name][slot] = array[: hi - lo]  # one scatter, straight from the decoded buffer
        buffers[SOURCE_ARRAY][: b - a] = unit_codes

    if queries:
        unit = min(unit_batches(size, first.layout.sample_bytes, len(queries)), plan.n_batches)
        concurrency, threads = min(s.reader.size for s in queries if s.reader), 1
    else:
        unit = min(local_unit_batches(size, first.layout.sample_bytes), plan.n_batches)
        concurrency = threads = 2 if cfg.store.compression == "none" else 1
    layout = dataclasses.replace(first.layout, keys=plan.key_columns)
    return BatchSource(
        plan, layout, snapshot[0], snapshot[1], rows_read, fetch, produce, concurrency, threads, unit,
        extra_arrays=((SOURCE_ARRAY, np.dtype(np.int8), ()),), records=records, slot_sources=slots.codes,
        slots_from=slots.first * size, cut=cut,
    )  # fmt: skip


async def _fetch(s: Served, batch: int, lo: int, hi: int, count: int) -> Fetched:
    """Source ``s``'s samples ``lo ... hi - 1`` of the unit from ``batch``, in one statement."""
    assert s.reader is not None
    return await s.reader.fetch(batch, s.keys[:, lo:hi], count)


def _scratch(local: threading.local, s: Served, n: int) -> dict[str, np.ndarray]:
    """This thread's buffers for ``n`` samples of source ``s`` (grown when a unit is larger)."""
    held: dict[int, dict[str, np.ndarray]] = local.__dict__.setdefault("buffers", {})
    buffers = held.get(s.code)
    if buffers is None or next(iter(buffers.values())).shape[0] < n:
        buffers = held[s.code] = s.layout.allocate(n)
    return buffers


__all__ = ["Served", "Slots", "batch_source"]
