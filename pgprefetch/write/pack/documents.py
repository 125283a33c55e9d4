"""Where a packed epoch's documents' tokens come from: a column of the per-document query, or a transform.

Either way a unit asks for its documents by key once (:meth:`Tokens.fetch`, on the event loop) and gets their
tokens back to back with each one's count (:meth:`Tokens.decode`, on a writer thread):

- :class:`ColumnTokens`: an integer array column, or a ``bytea`` of little-endian tokens, fetched by the
  per-document statement and decoded flat (:mod:`pgprefetch.decode.flat`). What a cluster's part needs to
  open its own reader travels as :class:`ColumnSpec`.
- :class:`TransformTokens`: a deterministic transform's output (a tokenizer), computed once and cached
  (:mod:`pgprefetch.write.transform`); a unit's outputs are the cache's, or computed then.

The lengths the epoch is planned from come from the same place (:func:`transform_lengths`, or the server's
count of a column: :mod:`.lengths`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from pgprefetch.config.model import SourceConfig
from pgprefetch.decode.flat import flat_column
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.session import BatchReader
from pgprefetch.pg.statement import BatchStatement, Fetched
from pgprefetch.write.pack.place import Documents
from pgprefetch.write.plan import EpochPlan
from pgprefetch.write.transform.outputs import Packed
from pgprefetch.write.transform.stage import Stage

CHUNK = 4096  # documents a transform's planning pass asks the stage for at once


class Tokens(Protocol):
    """A unit's documents' tokens: fetched by key, then decoded flat."""

    @property
    def size(self) -> int:
        """Fetches in flight at once."""

    async def fetch(self, batch: int, docs: Documents, count: int) -> object:
        """Ask for ``docs`` (a unit's, from ``batch``, ``count`` batches)."""

    def decode(self, fetched: object, docs: Documents) -> tuple[np.ndarray, np.ndarray]:
        """Their tokens back to back, in their order, in the field's dtype; and each one's count."""


@dataclass(frozen=True)
class ColumnSpec:
    """A column's documents as a cluster's part opens them: the statement, its layout, a token's bytes."""

    statement: BatchStatement
    layout: BatchLayout  # the statement's: the packed field's one column, row-wise
    dtype: np.dtype
    width: int = 0  # a token's bytes in a bytea column (little-endian); 0: an array's elements are the tokens

    @asynccontextmanager
    async def opened(self, source: SourceConfig, snapshot: str) -> AsyncIterator[ColumnTokens]:
        """Its reader's connections on the exported ``snapshot``."""
        st = self.statement
        async with BatchReader.open(source, snapshot, st.sql, st.params, row_wise=st.row_wise) as reader:
            yield ColumnTokens(self, reader)


class ColumnTokens:
    """Documents fetched by the per-document statement, a unit's in one round trip, decoded flat."""

    def __init__(self, spec: ColumnSpec, reader: BatchReader) -> None:
        self.spec, self.reader = spec, reader

    @property
    def size(self) -> int:
        """The reader's connections."""
        return self.reader.size

    async def fetch(self, batch: int, docs: Documents, count: int) -> object:
        """The statement's rows for ``docs``."""
        return await self.reader.fetch(batch, docs.keys, count)

    def decode(self, fetched: object, docs: Documents) -> tuple[np.ndarray, np.ndarray]:
        """The rows' tokens, flat; a bytea's viewed as its little-endian tokens."""
        spec = self.spec
        wire = np.dtype(np.uint8) if spec.width else spec.dtype
        tokens, counts = flat_column(spec.layout, cast("Fetched", fetched), docs.keys, wire)
        if spec.width:  # (each length was checked to be whole tokens when the epoch was planned)
            return tokens.view(spec.dtype.newbyteorder("<")).astype(spec.dtype, copy=False), counts // spec.width
        return tokens, counts


class TransformTokens:
    """Documents tokenized by a transform: each unit's outputs found in the cache (or computed) by the stage."""

    def __init__(self, stage: Stage, field: str, dtype: np.dtype) -> None:
        self.stage, self.field, self.dtype = stage, field, dtype

    @property
    def size(self) -> int:
        """Units in flight: the stage's statement's connections."""
        return self.stage.connections

    async def fetch(self, batch: int, docs: Documents, count: int) -> object:
        """The transform's outputs for ``docs``."""
        return (await self.stage.unit(batch, docs.keys))[self.field]

    def decode(self, fetched: object, docs: Documents) -> tuple[np.ndarray, np.ndarray]:
        """The outputs, already flat (checked against the field when they were made)."""
        packed = cast("Packed", fetched)
        return packed.values.astype(self.dtype, copy=False), packed.lengths


@dataclass(frozen=True)
class MixedSpec:
    """A packed mix's documents as a cluster's part opens them: each source's spec and key columns."""

    specs: dict[int, ColumnSpec]
    keys: dict[int, KeyColumns]

    @asynccontextmanager
    async def opened(self, source: SourceConfig, snapshot: str) -> AsyncIterator[MixedTokens]:
        """Every source's reader on the exported ``snapshot``, each with its share of the connections."""
        share = dataclasses.replace(source, connections=max(1, -(-source.connections // len(self.specs))))
        async with contextlib.AsyncExitStack() as stack:
            opened = {c: await stack.enter_async_context(s.opened(share, snapshot)) for c, s in self.specs.items()}
            yield MixedTokens(opened, self.keys)


class MixedTokens:
    """A packed mix's documents: each unit's asked of their sources, a statement each, at once."""

    def __init__(self, by_source: dict[int, ColumnTokens], keys: dict[int, KeyColumns]) -> None:
        self.by_source, self.keys = by_source, keys  # keys: each source's own key columns

    @property
    def size(self) -> int:
        """Units in flight: the fewest connections of a source."""
        return min(t.size for t in self.by_source.values())

    async def fetch(self, batch: int, docs: Documents, count: int) -> object:
        """Each source's documents among ``docs``, fetched concurrently."""
        assert docs.sources is not None, "a packed mix's documents say their source"
        codes = [int(c) for c in np.unique(docs.sources)]
        subsets = {c: self._of(docs, c) for c in codes}
        got = await asyncio.gather(*(self.by_source[c].fetch(batch, subsets[c], count) for c in codes))
        return dict(zip(codes, got, strict=True))

    def decode(self, fetched: object, docs: Documents) -> tuple[np.ndarray, np.ndarray]:
        """Each source's tokens, in the order of ``docs`` (a source's documents lie together, sources in order)."""
        assert docs.sources is not None
        by_code = cast("dict[int, object]", fetched)
        assert (np.diff(docs.sources) >= 0).all(), "a unit's documents come source after source"
        parts = [self.by_source[c].decode(by_code[c], self._of(docs, c)) for c in sorted(by_code)]
        return np.concatenate([t for t, _ in parts]), np.concatenate([n for _, n in parts])

    def _of(self, docs: Documents, code: int) -> Documents:
        """Source ``code``'s documents among ``docs``, with its own key columns (a narrower key's slots only)."""
        assert docs.sources is not None
        at, own = np.flatnonzero(docs.sources == code), self.keys[code]
        return Documents(own, np.ascontiguousarray(docs.keys[: own.width, at]), docs.lengths[at])


async def transform_lengths(stage: Stage, field: str, plan: EpochPlan) -> np.ndarray:
    """Each document's token count, from the transform's outputs: computed now (and cached) or found.

    ``plan``: the documents', one a batch. A pass over every document before the epoch is planned: the
    outputs are cached, so the epoch's units find them there and nothing runs twice.
    """
    lengths = np.empty(plan.used, dtype=np.int64)
    in_flight = asyncio.Semaphore(max(1, stage.connections))  # (each chunk's inputs on its own connection)

    async def chunk(start: int) -> None:
        async with in_flight:
            keys = np.ascontiguousarray(plan.batch_keys(start, 1, min(CHUNK, plan.used - start)))
            lengths[start : start + keys.shape[1]] = (await stage.unit(start, keys))[field].lengths

    await asyncio.gather(*(chunk(start) for start in range(0, plan.used, CHUNK)))
    return lengths


__all__ = ["ColumnSpec", "ColumnTokens", "MixedSpec", "MixedTokens", "Tokens", "TransformTokens", "transform_lengths"]
