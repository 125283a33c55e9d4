"""Where a packed epoch's tokens come from: pieces of a column of the per-document query, or of a transform's output.

A unit asks once (:meth:`Tokens.fetch`, on the event loop) for the tokens of the pieces its sequences hold
(:class:`Wanted`: which document, from which token, how many) and gets them back to back (:meth:`Tokens.decode`,
on a writer thread). Asking for pieces, not documents, matters for long documents: a document cut into many
sequences lands in as many units once the sequences are shuffled, and each unit gets only its piece.

- :class:`ColumnTokens`: an integer array column, a ``bytea`` of little-endian tokens or text's bytes, each
  piece sliced by the server (:func:`~pgprefetch.pg.statement.pieces_statement`) and decoded flat
  (:mod:`pgprefetch.decode.flat`). What a cluster's part needs to open its own reader travels as
  :class:`ColumnSpec`.
- :class:`TransformTokens`: a deterministic transform's output (a tokenizer), computed once and cached
  (:mod:`pgprefetch.write.transform`); a unit takes its documents' outputs from the cache and slices them.
- :class:`MixedTokens`: a packed mix's, each source's pieces asked of that source, at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from pgprefetch.config.model import Config, FieldConfig, SourceConfig
from pgprefetch.decode import wire
from pgprefetch.decode.flat import flat_values
from pgprefetch.errors import SampleError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.columns import Column
from pgprefetch.pg.session import BatchReader
from pgprefetch.pg.statement import pieces_statement
from pgprefetch.write.transform.outputs import Packed
from pgprefetch.write.transform.stage import Stage

CHUNK = 4096  # documents a transform's planning pass asks the stage for at once


@dataclass(frozen=True)
class Documents:
    """A packed epoch's documents (or a part's, or a unit's), by their place: keys, token counts and more."""

    key_columns: KeyColumns
    keys: np.ndarray  # (key slots, documents)
    lengths: np.ndarray  # tokens each, as the field keeps them (no eos)
    sources: np.ndarray | None = None  # a packed mix: each document's source code
    skip: np.ndarray | None = None  # ``truncate = "left"``: where each one's kept tokens begin in its column

    def take(self, rows: np.ndarray) -> Documents:
        """The documents ``rows`` alone, in that order (a row may repeat)."""
        sources = None if self.sources is None else self.sources[rows]
        skip = None if self.skip is None else self.skip[rows]
        return Documents(self.key_columns, self.keys[:, rows], self.lengths[rows], sources, skip)


@dataclass(frozen=True)
class Wanted:
    """The tokens a unit asks for: per piece that holds any, its document, its first token there and its count."""

    docs: Documents  # a row a piece (a document twice where two of its pieces are in the unit)
    first: np.ndarray  # int64: the piece's first token, counted in the document's kept tokens
    count: np.ndarray  # int64: its tokens, 1 or more (a document's eos is the placer's, never asked for)

    def where(self, at: np.ndarray) -> Wanted:
        """The pieces ``at`` alone."""
        return Wanted(self.docs.take(at), self.first[at], self.count[at])

    def error(self, row: int, message: str) -> SampleError:
        """The error for piece ``row``'s document, naming its key."""
        return SampleError(f"sample ({self.docs.key_columns.show(self.docs.keys[:, row])}): {message}")


class Tokens(Protocol):
    """A unit's pieces' tokens: asked for once, then decoded flat."""

    @property
    def size(self) -> int:
        """Fetches in flight at once."""

    async def fetch(self, batch: int, wanted: Wanted, count: int) -> object:
        """Ask for ``wanted`` (a unit's, from ``batch``, ``count`` batches)."""

    def decode(self, fetched: object, wanted: Wanted) -> np.ndarray:
        """Their tokens back to back, piece after piece, in the field's dtype (each count checked)."""


@dataclass(frozen=True)
class ColumnSpec:
    """A column's pieces as a cluster's part opens them: the statement, the column, the dtype, a token's bytes."""

    sql: str  # :func:`~pgprefetch.pg.statement.pieces_statement`
    column: Column
    field: str
    dtype: np.dtype
    width: int = 0  # a token's bytes in a bytea column (little-endian); 0: an array's elements, or text's bytes

    @asynccontextmanager
    async def opened(self, source: SourceConfig, snapshot: str) -> AsyncIterator[ColumnTokens]:
        """Its reader's connections on the exported ``snapshot``."""
        async with BatchReader.open(source, snapshot, self.sql, row_wise=True) as reader:
            yield ColumnTokens(self, reader)


def column_spec(cfg: Config, keys: KeyColumns, column: Column, field: FieldConfig, width: int) -> ColumnSpec:
    """How a unit's pieces are fetched by ``cfg``'s per-document query (the documents' config, query mode).

    ``field``: the packed field as configured (its dtype); ``width``: a token's bytes in a ``bytea``.
    """
    kind = "array" if column.is_array else ("text" if column.pg_type == "text" else "bytea")
    sql = pieces_statement(keys, cfg.query_samples.query, column.name, kind=kind, width=width)
    return ColumnSpec(sql, column, field.name, np.dtype(field.dtype), width)


class ColumnTokens:
    """Pieces sliced by the server, a unit's in one round trip, decoded flat."""

    def __init__(self, spec: ColumnSpec, reader: BatchReader) -> None:
        self.spec, self.reader = spec, reader

    @property
    def size(self) -> int:
        """The reader's connections."""
        return self.reader.size

    async def fetch(self, batch: int, wanted: Wanted, count: int) -> object:
        """The statement's rows for ``wanted``: keys, then each piece's first token in its column, and count."""
        docs = wanted.docs
        first = wanted.first + (docs.skip if docs.skip is not None else 0)
        return await self.reader.fetch(batch, np.vstack([docs.keys, first[None], wanted.count[None]]), count)

    def decode(self, fetched: object, wanted: Wanted) -> np.ndarray:
        """The rows' tokens, flat and in the pieces' order; each piece's count checked against the one asked."""
        spec, n = self.spec, wanted.count.size
        rows = cast("Sequence[Sequence[object]]", fetched) or ((), ())
        ordinals = np.asarray(rows[0], dtype=np.int64) - 1
        if ordinals.size != n or not np.array_equal(np.sort(ordinals), np.arange(n)):
            counts = np.bincount(ordinals, minlength=n)[:n]
            bad = int(np.flatnonzero(counts != 1)[0])
            raise wanted.error(bad, f"[samples] query returned {counts[bad]} rows, expected 1")
        sent = cast("list[bytes | None]", list(rows[1]))
        ordered = [sent[i] for i in np.argsort(ordinals)]
        try:
            tokens, counts = flat_values(spec.column, ordered, spec.dtype, spec.width)
        except wire.BadSample as e:
            raise wanted.error(e.sample, f"field {spec.field}, column {spec.column.name} {e}") from None
        _check_counts(wanted, counts, spec.field)
        return tokens


class TransformTokens:
    """Pieces of a transform's outputs: each unit's documents' outputs found in the cache (or computed), sliced."""

    def __init__(self, stage: Stage, field: str, dtype: np.dtype) -> None:
        self.stage, self.field, self.dtype = stage, field, dtype

    @property
    def size(self) -> int:
        """Units in flight: the stage's statement's connections."""
        return self.stage.connections

    async def fetch(self, batch: int, wanted: Wanted, count: int) -> object:
        """The transform's outputs for the documents of ``wanted``, each once."""
        keys, back = np.unique(wanted.docs.keys, axis=1, return_inverse=True)
        return (await self.stage.unit(batch, np.ascontiguousarray(keys)))[self.field], back.reshape(-1)

    def decode(self, fetched: object, wanted: Wanted) -> np.ndarray:
        """Each piece's tokens, sliced from its document's output (checked against the field when it was made)."""
        packed, back = cast("tuple[Packed, np.ndarray]", fetched)
        _check_counts(wanted, np.minimum(packed.lengths[back] - wanted.first, wanted.count), self.field)
        begins = packed.starts[back] + wanted.first
        at = np.repeat(begins - np.cumsum(wanted.count) + wanted.count, wanted.count) + np.arange(wanted.count.sum())
        tokens: np.ndarray = packed.values[at].astype(self.dtype, copy=False)
        return tokens


def _check_counts(wanted: Wanted, counts: np.ndarray, field: str) -> None:
    """Each piece came back with the tokens asked: the epoch was planned from the same lengths."""
    if np.array_equal(counts, wanted.count):
        return
    i = int(np.flatnonzero(counts != wanted.count)[0])
    raise wanted.error(
        i,
        f"field {field}: {wanted.count[i]} tokens from token {wanted.first[i]} were asked and {counts[i]} came (its "
        "length changed since the epoch was planned: the per-document query must return the same row each time)",
    )


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
    """A packed mix's pieces: each unit's asked of their sources, a statement each, at once."""

    def __init__(self, by_source: dict[int, ColumnTokens], keys: dict[int, KeyColumns]) -> None:
        self.by_source, self.keys = by_source, keys  # keys: each source's own key columns

    @property
    def size(self) -> int:
        """Units in flight: the fewest connections of a source."""
        return min(t.size for t in self.by_source.values())

    async def fetch(self, batch: int, wanted: Wanted, count: int) -> object:
        """Each source's pieces among ``wanted``, fetched concurrently."""
        parts = self._by_source(wanted)
        got = await asyncio.gather(*(self.by_source[c].fetch(batch, w, count) for c, (_, w) in parts.items()))
        return dict(zip(parts, got, strict=True))

    def decode(self, fetched: object, wanted: Wanted) -> np.ndarray:
        """Each source's tokens, put back in the order of the pieces."""
        by_code = cast("dict[int, object]", fetched)
        parts = self._by_source(wanted)
        starts = np.cumsum(wanted.count) - wanted.count
        out = np.empty(int(wanted.count.sum()), dtype=next(iter(self.by_source.values())).spec.dtype)
        for c, (at, w) in parts.items():
            tokens = self.by_source[c].decode(by_code[c], w)
            out[np.repeat(starts[at] - np.cumsum(w.count) + w.count, w.count) + np.arange(tokens.size)] = tokens
        return out

    def _by_source(self, wanted: Wanted) -> dict[int, tuple[np.ndarray, Wanted]]:
        """Each source's pieces: where they are among ``wanted``, and them with the source's own key slots."""
        docs = wanted.docs
        assert docs.sources is not None, "a packed mix's documents say their source"
        out = {}
        for c in (int(c) for c in np.unique(docs.sources)):
            at, own = np.flatnonzero(docs.sources == c), self.keys[c]
            mine = docs.take(at)
            mine = dataclasses.replace(mine, key_columns=own, keys=np.ascontiguousarray(mine.keys[: own.width]))
            out[c] = (at, Wanted(mine, wanted.first[at], wanted.count[at]))
        return out


async def transform_lengths(stage: Stage, field: str, keys: np.ndarray, first: int) -> np.ndarray:
    """The token counts of the documents ``keys`` (from document ``first`` on), from the transform's outputs.

    Computed now (and cached) or found: a pass over the documents before the epoch is planned, so the
    epoch's units find the outputs in the cache and nothing runs twice.
    """
    lengths = np.empty(keys.shape[1], dtype=np.int64)
    in_flight = asyncio.Semaphore(max(1, stage.connections))  # (each chunk's inputs on its own connection)

    async def chunk(start: int) -> None:
        async with in_flight:
            some = np.ascontiguousarray(keys[:, start : start + CHUNK])
            lengths[start : start + some.shape[1]] = (await stage.unit(first + start, some))[field].lengths

    await asyncio.gather(*(chunk(start) for start in range(0, keys.shape[1], CHUNK)))
    return lengths


__all__ = [
    "ColumnSpec",
    "ColumnTokens",
    "Documents",
    "MixedSpec",
    "MixedTokens",
    "Tokens",
    "TransformTokens",
    "Wanted",
    "column_spec",
    "transform_lengths",
]
