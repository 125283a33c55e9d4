"""The data passes' sorted rows, one after another on local disk, read back a stretch of rows at a time.

A table of windows larger than ``[source] memory`` is cut pass by pass (:mod:`.cutpasses`), and the epoch's
windows lie in no order a pass knows. So each pass's sorted rows are appended here once (the table's size,
not the epoch's, which is the table times the window at stride 1); each window's start row here is carried
with its key through the epoch's order; and the batches are gathered from rows read back here in order
(:mod:`.sweep`) by the code that gathers from a table in memory, so their bytes are the same.

The rows are read with ``pread`` into buffers held for the dump, not mapped: a window's rows are a page or
two of each column, and a gather from a mapping faults them in one at a time (and out again, to hold the
budget).
"""

from __future__ import annotations

import math

import numpy as np

from pgprefetch.pg.columns import Column
from pgprefetch.write.scan.table import Table, array_lengths
from pgprefetch.write.spill.columns import ColumnFile
from pgprefetch.write.spill.folder import SpillFolder

# (kind, column index or block number, dtype, row shape): "b" a block of columns, "v" values, "m" a mask, "n" lengths
_Entry = tuple[str, int, np.dtype, tuple[int, ...]]


class RowsFile:
    """Sorted tables appended one after another (:meth:`append`), then read back by rows (:meth:`read`)."""

    def __init__(self, folder: SpillFolder, columns: tuple[Column, ...]) -> None:
        self.columns = columns
        self.rows = 0  # rows appended: the next table's first row
        self.lengths: dict[Column, int] = {}  # the array columns' element counts (every row has the first one's)
        self._entries: list[_Entry] | None = None
        self._blocks: list[list[tuple[Column, int]]] = []
        self._nulls: set[Column] = set()  # the columns a NULL was seen in: only theirs are masked
        self._file: ColumnFile | None = None  # the entries as columns, a block a pass (made by the first append)
        self.folder = folder

    @property
    def row_bytes(self) -> int:
        """A row's bytes over every file."""
        return sum(_row_bytes(entry) for entry in self._entries or ())

    def append(self, table: Table) -> None:
        """Append ``table``'s rows (sorted by key and order, as cut); every table has the first one's columns."""
        if not self.rows:
            self.lengths = array_lengths(table)
        arrays = self._arrays(table)
        if self._file is None:
            schema = {_name(entry): (entry[2], entry[3]) for entry in self._entries or ()}
            self._file = ColumnFile(self.folder.create("rows"), schema)
        self._file.append({_name(entry): array for entry, array in zip(self._entries or (), arrays, strict=True)})
        self.rows += table.keys.shape[1]

    def _arrays(self, table: Table) -> list[np.ndarray]:
        """The arrays of ``table`` in the file's order: its blocks, the columns outside them, masks, lengths.

        A column without a NULL in this table has no mask here (the read leaves it out): its mask is all False.
        """
        if self._entries is None:
            self._entries = self._entries_of(table)
        blocks = {tuple(c for c, _ in columns): b for b, columns in table.blocks()}
        return [self._array(table, entry, blocks) for entry in self._entries]

    def _entries_of(self, table: Table) -> list[_Entry]:
        """The file's columns, from the first table: its blocks, then each column's values, mask and lengths."""
        self._blocks = [columns for _, columns in table.blocks()]
        entries: list[_Entry] = [("b", k, b.dtype, b.shape[1:]) for k, (b, _) in enumerate(table.blocks())]
        in_blocks = {c for columns in self._blocks for c, _ in columns}
        for j, c in enumerate(self.columns):
            if c in table.values and c not in in_blocks:
                entries.append(("v", j, table.values[c].dtype, table.values[c].shape[1:]))
            if c.nullable:
                entries.append(("m", j, np.dtype(bool), ()))
            if c in table.lengths:
                entries.append(("n", j, table.lengths[c].dtype, table.lengths[c].shape[1:]))
        return entries

    def _array(self, table: Table, entry: _Entry, blocks: dict[tuple[Column, ...], np.ndarray]) -> np.ndarray:
        """``table``'s array for the file's column ``entry``."""
        kind, i, dtype, shape = entry
        if kind == "b":
            found = blocks.get(tuple(c for c, _ in self._blocks[i]))
            if found is None:  # decoded column by column this time: put the block together
                found = np.stack([table.values[c] for c, _ in self._blocks[i]], axis=1)
            return found
        c = self.columns[i]
        if kind == "v":
            return table.values[c]
        if kind == "n":
            return table.lengths[c]
        if c in table.masks:
            self._nulls.add(c)
        return table.masks.get(c, np.zeros((table.keys.shape[1], *shape), dtype))

    def open(self) -> None:
        """Ready the rows for :meth:`read` (nothing to do: the file is read at offsets)."""

    def buffers(self, rows: int) -> list[np.ndarray]:
        """Buffers for :meth:`read` of at most ``rows`` rows (one set a reading thread)."""
        return [np.empty(rows * _row_bytes(entry), np.uint8) for entry in self._entries or ()]

    def read(self, first: int, stop: int, buffers: list[np.ndarray]) -> Table:
        """Rows ``first`` to ``stop`` as a table (no keys: the plan has the samples'), read into ``buffers``.

        The table's arrays are views of the buffers: valid until the next read into them.
        """
        n = stop - first
        table = Table(keys=np.empty((0, n), np.int64))
        blocks: list[tuple[np.ndarray, list[tuple[Column, int]]]] = []
        assert self._file is not None, "rows were appended"
        entries = self._entries or []
        read = self._file.read(first, stop, out={_name(e): b for e, b in zip(entries, buffers, strict=True)})
        for kind, i, _, _ in entries:
            array = read[f"{kind}{i}"]
            if kind == "b":  # the columns as views of the block, which the gather takes whole
                blocks.append((array, self._blocks[i]))
                for c, j in self._blocks[i]:
                    table.values[c] = array[:, j]
            elif kind == "v":
                table.values[self.columns[i]] = array
            elif kind == "m" and self.columns[i] in self._nulls:  # no NULL anywhere: no mask, as a read has
                table.masks[self.columns[i]] = array
            elif kind == "n":
                table.lengths[self.columns[i]] = array
        table._blocks = blocks  # a read block's views do not point back at it: named here, not found
        return table

    def close(self) -> None:
        """Delete the file."""
        if self._file is not None:
            self._file.remove()


def _name(entry: _Entry) -> str:
    """The column an entry is kept in: ``b0``, ``v3``, ``m3``, ``n3``."""
    return f"{entry[0]}{entry[1]}"


def _row_bytes(entry: _Entry) -> int:
    _, _, dtype, shape = entry
    return dtype.itemsize * math.prod(shape)
