"""Scan mode's exchange, in numpy: read blocks cut into the pieces each part of a spread epoch writes from.

When an epoch is spread over a cluster (:mod:`pgprefetch.write.ray.scan`) no process holds the table. Each
reader holds one page range of it, a *block* (a :class:`~pgprefetch.write.scan.table.Table` sorted within
itself), and each part writes a range of batches whose samples' rows lie in every block. The driver holds
only the keys:

1. :func:`merge_keys` sorts the blocks' keys into the whole table's order (the single process's sort), and
   keeps where each sorted row lies: its block and its row there. The samples are cut from these keys as
   from the single process's table, so they and the epoch's order are the same.
2. :func:`rows_of` gives the rows a part's samples span, and :func:`route` says which block holds each.
3. :func:`cut_block` runs beside a block and cuts it into one :class:`Piece` per part.
4. :func:`join_pieces` joins a part's pieces into a table of just its rows, in the whole table's order, so a
   window's rows are consecutive there as in the whole table, and the single process's
   :func:`~pgprefetch.write.scan.table.gather` cuts, casts and checks the same samples from it.

A part's table holds every row its samples span: a shuffled window epoch spreads each part's samples over
the whole table, so a part of ``s`` windows of ``w`` rows holds up to ``s * w`` rows (:func:`part_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pgprefetch.pg.columns import Column
from pgprefetch.write.scan.table import Table, sort_keys


@dataclass(frozen=True)
class Piece:
    """The rows of one block that one part needs, with their places in the whole sorted table."""

    rows: np.ndarray  # int64, ascending: each row's place in the whole table's (key, order) order
    values: dict[Column, np.ndarray] = field(default_factory=dict)
    masks: dict[Column, np.ndarray] = field(default_factory=dict)
    lengths: dict[Column, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class Merged:
    """The blocks' keys as one sorted table, and where each of its rows lies."""

    keys: np.ndarray  # (n_key_columns [+ 1 for the order], n_rows), sorted
    order: np.ndarray  # sorted row -> row of the blocks' keys concatenated
    offsets: np.ndarray  # each block's first row in that concatenation


def merge_keys(blocks: list[np.ndarray]) -> Merged:
    """The keys of the blocks (each ``(n_key_columns, n_i)``) sorted together, as the single process sorts them."""
    sizes = np.array([k.shape[1] for k in blocks], dtype=np.int64)
    keys = np.concatenate(blocks, axis=1) if blocks else np.empty((0, 0), np.int64)
    merged, order = sort_keys(keys)
    if order is None:
        order = np.arange(keys.shape[1], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    return Merged(merged, order, offsets)


def rows_of(starts: np.ndarray, window: int) -> np.ndarray:
    """The sorted rows that samples starting at ``starts`` span (``window`` rows each), each row once.

    The union of the windows' row ranges, merged in order of their starts: work in the part's samples and
    rows, never the whole table's (a mask over the table per part was ``parts x rows``: 128 parts of a
    1e8-row table made 128 passes over it on the driver), and no ``np.unique`` (numpy 2 hashes: a second
    for 500k rows).
    """
    s = np.sort(np.asarray(starts, dtype=np.int64))
    ends = s + window
    lo = s.copy()
    lo[1:] = np.maximum(s[1:], np.maximum.accumulate(ends)[:-1])  # past the rows earlier windows took
    counts = np.maximum(ends - lo, 0)
    # Row k of window i's new rows is lo[i] + k: a running index minus where window i's rows begin.
    return np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()), dtype=np.int64)


def part_rows(samples: int, window: int, table_rows: int) -> int:
    """The most rows a part of ``samples`` samples can hold: its windows' rows, at most the whole table."""
    return min(table_rows, samples * window)


def route(rows: np.ndarray, merged: Merged) -> list[tuple[np.ndarray, np.ndarray]]:
    """For each block: which of its rows ``rows`` (sorted places) are, and those places, both ascending."""
    source = merged.order[rows]
    block = np.searchsorted(merged.offsets, source, side="right") - 1
    by_block = np.argsort(block, kind="stable")  # stable: within a block the places stay ascending
    counts = np.bincount(block, minlength=merged.offsets.size)
    out = []
    for b, taken in enumerate(np.split(by_block, np.cumsum(counts)[:-1])):
        out.append((source[taken] - merged.offsets[b], rows[taken]))
    return out


def cut_block(block: Table, wanted: list[tuple[np.ndarray, np.ndarray]]) -> list[Piece]:
    """``block``'s rows for each part: ``wanted`` holds, per part, the block's rows and their sorted places."""
    pieces = []
    for local, rows in wanted:
        pieces.append(Piece(
            rows,
            {c: v[local] for c, v in block.values.items()},
            {c: m[local] for c, m in block.masks.items()},
            {c: n[local] for c, n in block.lengths.items()},
        ))  # fmt: skip
    return pieces


def join_pieces(pieces: list[Piece]) -> tuple[Table, np.ndarray]:
    """A part's pieces as one table in the whole table's order, and each of its rows' place there.

    A block without a NULL in a column sends no mask for it (as the single process keeps none for a table
    without one); joined with a block that has one, its rows are not NULL.
    """
    pieces = [p for p in pieces if p.rows.size]
    rows = np.concatenate([p.rows for p in pieces]) if pieces else np.empty(0, np.int64)
    order = np.argsort(rows, kind="stable")
    table = Table(keys=np.empty((0, rows.size), dtype=np.int64), rows_read=0)
    if not pieces:
        return table, rows
    for c in pieces[0].values:
        table.values[c] = np.concatenate([p.values[c] for p in pieces])[order]
        if c in pieces[0].lengths:
            table.lengths[c] = np.concatenate([p.lengths[c] for p in pieces])[order]
        if any(c in p.masks for p in pieces):
            masks = [p.masks.get(c, np.zeros(p.rows.size, dtype=bool)) for p in pieces]
            table.masks[c] = np.concatenate(masks)[order]
    return table, rows[order]
