"""A mixed epoch spread over a cluster: what the driver sends a part, and how the part serves its batches.

The driver plans the mixed epoch as the single process does (:mod:`.source`: every source read on the
epoch's snapshot, the slots apportioned); a part of it is a range of batches. For its range the part needs
each slot's source and place (:meth:`~.serving.Slots.cut`), and from each source the run of samples those
batches draw:

- a **query-mode** source sends its keys and its batch statement: the part opens its own connections on the
  exported snapshot and fetches them, as the driver would;
- a **scan-mode** source's table is held by the driver (in memory or in buckets on its disk, which another
  node cannot read), so the driver decodes the part's samples of it and sends them. That is the bytes of
  those samples once, in the cluster's object store, which Ray spills to disk when it fills; the driver
  holds one part's at a time, reserved in the ``--memory`` pool while it is sent.

The part then serves its batches with the single process's own code (:func:`~.serving.batch_source`), so its
bytes are the single process's.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.session import BatchReader
from pgprefetch.pg.statement import BatchStatement
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.mix.reading import source_config
from pgprefetch.write.mix.serving import Served, Slots, batch_source
from pgprefetch.write.plan import EpochPlan


@dataclass(frozen=True)
class SourceRun:
    """One source's samples in a part: their keys, and their statement (query mode) or their decoded arrays."""

    name: str
    code: int
    layout: BatchLayout
    key_columns: KeyColumns
    keys: np.ndarray  # (its key columns, its samples in the part), in its run's order
    statement: BatchStatement | None  # query mode: fetched by the part
    decoded: dict[str, np.ndarray] | None  # scan mode: decoded by the driver


@dataclass(frozen=True)
class MixedPart:
    """What a part of a mixed epoch is sent (see the module's docstring)."""

    slots: Slots
    sources: tuple[SourceRun, ...]

    def served(
        self, cfg: Config, plan: EpochPlan, snapshot: str, server_version: str
    ) -> AbstractAsyncContextManager[BatchSource]:
        """The part's batches (:func:`part_source`)."""
        return part_source(cfg, self, plan, snapshot, server_version)

    @property
    def key_columns(self) -> dict[int, KeyColumns]:
        """Each source's key columns, by source code (a part's transforms read their inputs by them)."""
        return {s.code: s.key_columns for s in self.sources}


@contextmanager
def cut(size: int, served: dict[int, Served], slots: Slots, batches: range) -> Iterator[MixedPart]:
    """The part of the epoch that writes ``batches``; its scan sources' samples are reserved while it is held."""
    part_slots = slots.cut(batches, size)
    before = slots.before
    last = min(batches.stop - slots.first, slots.per_batch.shape[0])
    with memory.current().reserve("a part's samples of scan sources") as held:
        sources = []
        for code, s in served.items():
            lo, hi = int(before[batches.start - slots.first, code]), int(before[last, code])
            decoded = None
            if not s.fetches:
                held.grow((hi - lo) * s.layout.sample_bytes)
                decoded = s.decode(lo, hi, None, s.layout.allocate(hi - lo))
            keys = np.ascontiguousarray(s.keys[:, lo:hi])
            sources.append(SourceRun(s.name, code, s.layout, s.key_columns, keys, s.statement, decoded))
        yield MixedPart(part_slots, tuple(sources))


@asynccontextmanager
async def part_source(
    cfg: Config, part: MixedPart, plan: EpochPlan, snapshot: str, server_version: str
) -> AsyncIterator[BatchSource]:
    """The batches of ``part`` on the exported ``snapshot``: its query sources fetched on connections of its own.

    ``cfg``: the mixed config with its password (each query source takes its share of the connections, as in
    the single process); ``plan``: the epoch's, with the part's keys.
    """
    queries = sum(s.statement is not None for s in part.sources)
    async with contextlib.AsyncExitStack() as stack:
        served = {}
        for s in part.sources:
            reader = None
            if s.statement is not None:
                own = source_config(cfg, s.name, cfg.source.memory_bytes, queries)
                st = s.statement
                opened = BatchReader.open(own.source, snapshot, st.sql, st.params, row_wise=st.row_wise)
                reader = await stack.enter_async_context(opened)
            served[s.code] = Served(
                s.name, s.code, s.layout, s.keys, s.key_columns, reader, s.statement, decoded=s.decoded
            )
        yield batch_source(cfg, plan, served, part.slots, (snapshot, server_version), None, {})


__all__ = ["MixedPart", "SourceRun", "cut", "part_source"]
