"""The one spill format: rows of named columns, appended a block at a time, any range of rows read back.

A block is one write: each column's rows of the block back to back, column after column (the pieces of
several chunks of a column one after another), at the end of the file. The blocks' first rows and offsets
are kept in memory, so rows ``a`` to ``b`` of a column are one ``pread`` per block they span, into the
caller's array (or buffer). Every spill of a dump is this format: a table split by series or by the
epoch's order (one file a bucket), a pass's sorted rows, an epoch's gathered samples, and keys (int64
columns: a run of keys sorted by hash is a block, the epoch's ordered keys a block a bucket).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np

from pgprefetch.write.spill.folder import SpillFile

# Each column's dtype and the shape of one row of it.
Schema = dict[str, tuple[np.dtype, tuple[int, ...]]]


def schema_of(columns: Mapping[str, np.ndarray]) -> Schema:
    """The schema of a chunk of columns (each ``(rows, ...)``), in its order."""
    return {name: (v.dtype, v.shape[1:]) for name, v in columns.items()}


class ColumnFile:
    """Rows of the columns of ``schema`` in ``file`` (the schema may be fixed by the first block instead)."""

    def __init__(self, file: SpillFile, schema: Schema | None = None) -> None:
        self.file = file
        self.schema: Schema = dict(schema or {})
        self.rows = 0
        self._firsts: list[int] = []  # each block's first row
        self._offsets: list[int] = []  # and its byte offset
        self._end = 0

    @property
    def blocks(self) -> int:
        """The blocks written."""
        return len(self._firsts)

    @property
    def nbytes(self) -> int:
        """The file's bytes."""
        return self._end

    def column_bytes(self, name: str) -> int:
        """One row's bytes of column ``name``."""
        dtype, shape = self.schema[name]
        return dtype.itemsize * math.prod(shape)

    @property
    def row_bytes(self) -> int:
        """One row's bytes over every column."""
        return sum(self.column_bytes(name) for name in self.schema)

    def append(self, columns: Mapping[str, np.ndarray]) -> None:
        """Write one block: ``columns`` (every column of the schema, the same rows each)."""
        self.append_pieces([columns])

    def append_pieces(self, pieces: Sequence[Mapping[str, np.ndarray]]) -> None:
        """Write one block of the pieces' rows, in order (each piece a chunk of every column)."""
        if not self.schema and pieces:
            self.schema = schema_of(pieces[0])
        rows = sum(_rows(p) for p in pieces)
        if not rows:
            return
        views = [np.ascontiguousarray(p[name]).reshape(-1).view(np.uint8).data for name in self.schema for p in pieces]
        written = self.file.writev(views, self._end)
        assert written == rows * self.row_bytes, "every column of every piece"
        self._firsts.append(self.rows)
        self._offsets.append(self._end)
        self.rows += rows
        self._end += written

    def append_lazily(self, rows: int, columns: Iterable[np.ndarray]) -> None:
        """Write one block of ``rows`` rows whose columns come one at a time, in the schema's order.

        Each column is written and let go before the next is made: a permuted copy of one key slot at a time
        in memory, not of every slot.
        """
        assert self.schema, "a block written column by column needs the schema first"
        offset = self._end
        for name, column in zip(self.schema, columns, strict=True):
            assert column.shape[0] == rows, f"column {name}: {rows} rows"
            self.file.write(np.ascontiguousarray(column), offset)
            offset += rows * self.column_bytes(name)
            del column
        if rows:
            self._firsts.append(self.rows)
            self._offsets.append(self._end)
            self.rows += rows
            self._end = offset

    def _block(self, b: int) -> tuple[int, int, int]:
        """Block ``b``'s first row, rows and offset."""
        last = self._firsts[b + 1] if b + 1 < len(self._firsts) else self.rows
        return self._firsts[b], last - self._firsts[b], self._offsets[b]

    def read(
        self,
        first: int,
        stop: int,
        names: Iterable[str] | None = None,
        out: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Rows ``first`` to ``stop`` of the columns ``names`` (default: all), into ``out``'s arrays if given.

        ``out[name]`` must hold at least ``stop - first`` rows and be contiguous; its first rows are filled
        and returned (views of it).
        """
        wanted = list(self.schema) if names is None else list(names)
        n = max(0, stop - first)
        got: dict[str, np.ndarray] = {}
        for name in wanted:
            dtype, shape = self.schema[name]
            if out is not None and name in out:
                got[name] = out[name].reshape(-1).view(np.uint8)[: n * self.column_bytes(name)].view(dtype)
                got[name] = got[name].reshape(n, *shape)
            else:
                got[name] = np.empty((n, *shape), dtype)
        b = bisect.bisect_right(self._firsts, first) - 1 if n else 0
        at = first
        while at < stop:
            block_first, block_rows, offset = self._block(b)
            lo, hi = at - block_first, min(stop, block_first + block_rows) - block_first
            for name in self.schema:
                size = self.column_bytes(name)
                if name in got:
                    self.file.read_into(got[name][at - first : at - first + hi - lo], offset + lo * size)
                offset += block_rows * size
            at += hi - lo
            b += 1
        return got

    def read_blocks(self) -> Iterator[dict[str, np.ndarray]]:
        """Every block in turn, its columns views of one read of the block."""
        for b in range(self.blocks):
            _, rows, offset = self._block(b)
            data = np.empty(rows * self.row_bytes, np.uint8)
            self.file.read_into(data, offset)
            chunk, at = {}, 0
            for name, (dtype, shape) in self.schema.items():
                size = rows * self.column_bytes(name)
                chunk[name] = data[at : at + size].view(dtype).reshape(rows, *shape)
                at += size
            yield chunk

    def close(self) -> None:
        """Close the file (it stays, for its folder's owner to remove)."""
        self.file.close()

    def remove(self) -> None:
        """Delete the file."""
        self.file.remove()
        self._firsts, self._offsets, self.rows, self._end = [], [], 0, 0


def _rows(piece: Mapping[str, np.ndarray]) -> int:
    return next(iter(piece.values())).shape[0] if piece else 0
