"""Each document's token count, on the epoch's snapshot, before a token is read.

One statement per chunk of keys (:func:`~pgprefetch.pg.statement.lengths_statement`): the per-document query
runs LATERAL for each key as the batches' does, and the server sends each document's length instead of its
tokens. The chunks run concurrently on ``[source] connections``, opened once (:func:`counter`) for every window
of documents counted. What the field would refuse at the write (a
NULL under ``null = "error"``, a document longer than ``max_length`` under ``truncate = "error"``, a query that
returns no row or two for a key) is refused here, naming the document, before anything is written.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import cast

import numpy as np

from pgprefetch.config.model import Config, FieldConfig
from pgprefetch.errors import SampleError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.columns import Column
from pgprefetch.pg.session import BatchReader
from pgprefetch.pg.statement import lengths_statement

CHUNK = 65_536  # documents a statement: 0.8 MB of lengths back, a few MB of keys out


@dataclass(frozen=True)
class Counted:
    """The documents whose tokens are counted: their keys (held in memory), how keys show, the tokens' column."""

    keys: np.ndarray  # (key slots, documents)
    key_columns: KeyColumns
    column: Column

    def error(self, i: int, message: str) -> SampleError:
        """The error for document ``i``, naming its key."""
        return SampleError(f"sample ({self.key_columns.show(self.keys[:, i])}): {message}")


@asynccontextmanager
async def counter(cfg: Config, snapshot: str, key_columns: KeyColumns, column: Column) -> AsyncIterator[BatchReader]:
    """The connections that count documents' tokens: ``cfg``'s (the documents', query mode), opened once."""
    sql = lengths_statement(key_columns, cfg.query_samples.query, column.name, as_bytes=not column.is_array)
    async with BatchReader.open(cfg.source, snapshot, sql, row_wise=True) as reader:
        yield reader


async def document_lengths(
    reader: BatchReader, docs: Counted, field: FieldConfig, width: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The token count of each of ``docs``, as ``field`` keeps them, and where in each its kept tokens begin.

    ``reader``: the :func:`counter`'s. The count is the field's: cut to ``max_length`` under ``truncate =
    "right"`` or ``"left"`` (which keeps the last ones: they begin past the others); a NULL document is
    empty where the field has a NULL policy. ``width``: a token's bytes in a ``bytea`` column (0: an array's
    elements are its tokens).
    """
    n = docs.keys.shape[1]
    lengths = np.empty(n, dtype=np.int64)
    step = max(1, min(CHUNK, -(-n // reader.size)))  # every connection busy, even for a few documents

    async def chunk(start: int) -> None:
        keys = docs.keys[:, start : start + step]
        got_rows = cast("Sequence[Sequence[int | None]]", await reader.fetch(start, keys, keys.shape[1]))
        ords, counts = got_rows if got_rows else ((), ())  # (no row at all: every key is named missing below)
        got = np.asarray(ords, dtype=np.int64) - 1
        _check_rows(docs.key_columns, keys, got)
        lengths[start + got] = [-1 if c is None else c for c in counts]  # -1: NULL

    await asyncio.gather(*(chunk(start) for start in range(0, n, step)))
    kept = _as_tokens(docs, lengths, field, width)
    skip = np.maximum(lengths - kept, 0) if field.truncate == "left" else np.zeros_like(kept)
    return kept, skip


def _as_tokens(docs: Counted, lengths: np.ndarray, field: FieldConfig, width: int) -> np.ndarray:
    """The server's counts (-1: NULL) as the field keeps them, in tokens; what it would refuse, refused here."""
    column = docs.column
    if width > 1:
        ragged = (lengths > 0) & (lengths % width != 0)
        if ragged.any():
            i = int(np.flatnonzero(ragged)[0])
            raise docs.error(
                i,
                f"field {field.name}, column {column.name} has {lengths[i]} bytes, not whole {field.dtype} tokens "
                f"of {width} bytes (a bytea holds its tokens little-endian)",
            )
        lengths[lengths > 0] //= width
    nulls = lengths < 0
    if nulls.any():
        if field.null == "error":
            raise docs.error(int(np.flatnonzero(nulls)[0]), f"field {field.name}, column {column.name} is NULL")
        lengths[nulls] = 0
    limit = field.max_length
    assert limit is not None, "a packed field has a max_length (config.packing)"
    over = lengths > limit
    if over.any() and field.truncate == "error":
        i = int(np.flatnonzero(over)[0])
        unit = "elements" if column.is_array else ("tokens" if width > 1 else "bytes")
        raise docs.error(
            i,
            f"field {field.name}, column {column.name} has {lengths[i]} {unit}, more than max_length {limit}; "
            f'[fields.{field.name}] truncate = "right" or "left" keeps that many',
        )
    kept: np.ndarray = np.minimum(lengths, limit)
    return kept


def _check_rows(key_columns: KeyColumns, keys: np.ndarray, got: np.ndarray) -> None:
    """Every key of the chunk returned exactly one row, or the first that did not is named."""
    counts = np.bincount(got, minlength=keys.shape[1])
    if (counts == 1).all():
        return
    repeated = np.flatnonzero(counts > 1)  # (first: a LIMIT that stopped at a repeat may leave a key unread)
    bad = int(repeated[0] if repeated.size else np.flatnonzero(counts == 0)[0])
    what = "no row" if counts[bad] == 0 else "more than one row"
    raise SampleError(f"sample ({key_columns.show(keys[:, bad])}): [samples] query returned {what}, expected 1")


__all__ = ["CHUNK", "Counted", "counter", "document_lengths"]
