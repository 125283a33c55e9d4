"""Scan mode: the database reads each table row once per epoch; the client cuts the samples.

Query mode runs the per-sample query for every sample, so a 64-row window with stride 1 reads each row 64
times. Scan mode reads the table once with binary ``COPY`` and does the rest in numpy:

1. **Parallel page ranges on one snapshot.** ``connections`` workers import the epoch's snapshot and each
   COPYs a disjoint range of the table's pages (``ctid >= '(a,0)' AND ctid < '(b,0)'``, a TID range scan
   on PostgreSQL 14+): ranges balanced by size, no index needed, and no server-side sort. A ``table``
   given as a SELECT cannot be split by pages and is read by one COPY.
2. **Decoding straight into numpy.** Every value is sent fixed-width and NOT NULL (NULLs arrive as a
   placeholder plus a boolean mask column), so every row of the stream has the same byte length and a
   chunk of rows is one big-endian structured array.
3. **Cutting.** The rows are sorted by (key, order) on the client (``lexsort``), series found where the
   key changes, and window starts computed per series; a sample's key is its series' key plus the order
   value of its first row. The shuffle is the query mode's, on these keys, so a scan config and its
   query-mode twin give byte-identical epochs.
4. **Gathering.** A batch's rows are a fancy index into the table's columns, cast and checked by
   :func:`pgprefetch.decode.collate.fill`, the code the query mode's decoded blobs go through.

The table stays in memory for as long as the dump runs, so several epochs (``--epochs A-B``) are cut from
one read. ``[source] memory`` bounds it: a read that outgrows the budget is given up and the table is read
in stretches or passes instead (:mod:`pgprefetch.write.scan.strategy`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from pgprefetch.config.model import Config, ScanConfig
from pgprefetch.decode import collate
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.errors import PgprefetchError, SampleError, SourceError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.columns import Column
from pgprefetch.pg.session import Snapshot
from pgprefetch.write import memory
from pgprefetch.write.memory.policy import STARTS_ROW_BYTES, Policy
from pgprefetch.write.scan.copyread import copy_ranges
from pgprefetch.write.scan.copystream import Columns, CopyDecoder
from pgprefetch.write.scan.shape import ScanShape


@dataclass
class Table:
    """The rows of one read, sorted by (key, order): key columns, order values and each column's values."""

    keys: np.ndarray  # (n_key_columns [+ 1 for the order], n_rows) int64, sorted
    values: dict[Column, np.ndarray] = field(default_factory=dict)  # wire dtypes, (n_rows, ...)
    masks: dict[Column, np.ndarray] = field(default_factory=dict)
    lengths: dict[Column, np.ndarray] = field(default_factory=dict)  # arrays of any length: each row's, uncut
    rows_read: int = 0
    nbytes: int = 0
    _blocks: list[tuple[np.ndarray, list[tuple[Column, int]]]] | None = field(default=None, repr=False, compare=False)

    def blocks(self) -> list[tuple[np.ndarray, list[tuple[Column, int]]]]:
        """The 2-D row-major blocks some columns are views of (runs decoded together), each with (column, index).

        Found from the arrays themselves, once: a table that lost its blocks (pickled by Ray) simply has none.
        """
        if self._blocks is None:
            found: dict[int, tuple[np.ndarray, list[tuple[Column, int]]]] = {}
            for c, v in self.values.items():
                base = v.base
                if (
                    v.ndim == 1
                    and isinstance(base, np.ndarray)
                    and base.ndim == 2
                    and base.flags.c_contiguous
                    and base.dtype == v.dtype
                    and base.shape[0] == v.shape[0]
                    and v.strides[0] == base.strides[0]
                ):
                    i = (v.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // v.itemsize
                    found.setdefault(id(base), (base, []))[1].append((c, i))
            self._blocks = list(found.values())
        return self._blocks

    def __getstate__(self) -> dict[str, object]:
        """Pickled (Ray) without the blocks found: each column travels on its own."""
        return {**self.__dict__, "_blocks": None}


def array_lengths(table: Table) -> dict[Column, int]:
    """The element count of each array column of a read table (every row has one length: the read checks it)."""
    return {c: v.shape[1] for c, v in table.values.items() if c.is_array}


class TableTooLarge(PgprefetchError):
    """The relation does not fit ``[source] memory``: read it in passes (:mod:`pgprefetch.write.scan.passes`)."""

    def __init__(self, bytes_per_row: float, rows: int) -> None:
        super().__init__("the table does not fit [source] memory")
        self.bytes_per_row = bytes_per_row
        self.rows = rows  # decoded before the read was given up (the server read them)


class Takes(Protocol):
    """Files that take decoded rows (a partition)."""

    def add(self, columns: Columns) -> None:
        """Take a decoded chunk of rows."""
        ...


@dataclass
class Overflow:
    """Where a read that outgrows its budget goes on, instead of being given up: a partition's files.

    ``make(rows, bytes_per_row)`` is called once, with what was read so far; every row decoded so far is
    handed to the partition it returns, and the rest of each COPY streams into it. The read then returns
    an empty table of the rows it read, and :attr:`partition` holds them all.
    """

    make: Callable[[int, float], Takes]
    partition: Takes | None = None
    rows: int = 0  # the rows the read read, in all (set when it ends)


async def read_table(
    cfg: Config,
    snap: Snapshot,
    shape: ScanShape,
    wheres: list[str] | None = None,
    *,
    budget: int | None = None,
    on_rows: Callable[[int], None] | None = None,
    overflow: Overflow | None = None,
) -> Table:
    """Read the relation (or the ranges ``wheres``, one COPY each) on the snapshot into a sorted Table.

    Without ``wheres`` the relation is split into ``connections`` page ranges. ``on_rows`` hears of the
    rows decoded, a piece at a time.

    Raises:
        TableTooLarge: more than ``budget`` bytes arrived (default ``[source] memory``; 0: no limit), and
            no ``overflow`` takes the rest.
        SourceError: the database failed (transient when a connection was lost).
    """
    ranges = wheres if wheres is not None else await page_ranges(snap, shape, cfg.source.connections)
    if budget is None:  # the whole read and the epoch cut from it, within the scan's account
        account = Policy.for_scan(cfg.source.memory_bytes)
        stride = cfg.scan_samples.stride if cfg.scan_samples.window is not None else 1
        width = len(shape.key_names)
        placing = STARTS_ROW_BYTES if cfg.store.windows == "starts" else 0  # (the windows placed beside the table)

        def over(rows: int, held: int) -> bool:
            per_row = (held / rows if rows else float(held)) + placing
            return not account.fits_in_memory(rows, per_row, -(-rows // stride), width)

        return await read_ranges(cfg, snap.id, shape, ranges, budget=1, over=over, on_rows=on_rows, overflow=overflow)
    return await read_ranges(cfg, snap.id, shape, ranges, budget=budget, on_rows=on_rows, overflow=overflow)


async def read_ranges(
    cfg: Config,
    snapshot: str,
    shape: ScanShape,
    ranges: list[str],
    *,
    budget: int,
    on_rows: Callable[[int], None] | None = None,
    empty_ok: bool = False,
    over: Callable[[int, int], bool] | None = None,
    overflow: Overflow | None = None,
) -> Table:
    """:func:`read_table` of the ranges ``ranges`` (one COPY each), on the exported snapshot ``snapshot``.

    A Ray reader (:mod:`pgprefetch.write.ray.exchange`) reads its one page range this way, with
    ``empty_ok``: a range of the table may hold no rows, where the whole table may not. ``over(rows,
    held bytes)`` says when the read outgrew its budget (default: more than ``budget`` bytes held; 0: never).
    """
    drain = Policy.for_scan(cfg.source.memory_bytes).copy_drain_bytes(len(ranges), into_partition=False)
    decoders = [CopyDecoder(shape, on_rows, drain) for _ in ranges]
    limit = budget
    outgrown = over if over is not None else (lambda rows, held: held > limit)

    def measure() -> tuple[int, float]:
        for d in decoders:
            d.drain()  # decode what is held, to measure the rows' size
        rows = sum(d.rows for d in decoders)
        first = decoders[0].row
        decoded = sum(d.decoded_bytes for d in decoders)
        return rows, decoded / rows if rows else float(first.itemsize if first else 64)

    def hand_over() -> None:  # on a thread: the rows decoded so far go to disk
        assert overflow is not None
        overflow.partition = partition = overflow.make(*measure())
        for d in decoders:
            d.overflow_into(partition.add)

    def check() -> Callable[[], None] | None:
        nonlocal limit
        if not (limit and outgrown(sum(d.rows for d in decoders), sum(d.held_bytes for d in decoders))):
            return None
        if overflow is None:
            rows, per_row = measure()
            raise TableTooLarge(per_row, rows)
        limit = 0  # once: the rest streams into the partition
        return hand_over

    with memory.current().reserve("copy", drain * len(ranges)):
        await copy_ranges(cfg.source, snapshot, shape, ranges, decoders, check=check)
    if overflow is not None and overflow.partition is not None:
        overflow.rows = sum(d.rows for d in decoders)
        return Table(keys=np.empty((len(shape.key_names), 0), np.int64), rows_read=overflow.rows)
    return await asyncio.to_thread(lambda: assemble(shape, [p for d in decoders for p in d.parts], empty_ok))


async def page_ranges(snap: Snapshot, shape: ScanShape, n: int) -> list[str]:
    """``WHERE`` clauses splitting a plain table into ``n`` page ranges of about equal size (one for a SELECT).

    The last range is open-ended, so pages the table grew by after the size was read are still covered;
    the snapshot decides which rows are seen either way.
    """
    if not shape.plain_table or n == 1 or int(snap.server_version.split(".")[0].split()[0]) < 14:
        return [""]  # before PostgreSQL 14 a ctid range is a filter on a full scan: one COPY reads less
    sql = "SELECT pg_relation_size($1::text::regclass) / current_setting('block_size')::int8"
    pages = int((await snap.fetch(sql, f"size of {shape.relation}", shape.relation))[0][0])
    n = max(1, min(n, pages))
    bounds = [round(i * pages / n) for i in range(1, n)]
    clauses = []
    for i in range(n):
        parts = []
        if i > 0:
            parts.append(f"{shape.relation}.ctid >= '({bounds[i - 1]},0)'::tid")  # qualified: the scan may join
        if i < n - 1:
            parts.append(f"{shape.relation}.ctid < '({bounds[i]},0)'::tid")
        clauses.append(" WHERE " + " AND ".join(parts) if parts else "")
    return clauses


def assemble(shape: ScanShape, parts: list[Columns], empty_ok: bool = False, *, by_key: bool = True) -> Table:
    """The table's columns from the ranges' chunks, sorted by (key, order) (a ``lexsort``: no server sort).

    ``by_key`` False: left as they came, for rows put in the epoch's order next (:mod:`.strategy.stretches`),
    where a sort by key would be a copy of every column for nothing.
    """
    rows = [p for p in parts if p["k0"].size]
    n = sum(p["k0"].size for p in rows)
    if not n and not empty_ok:
        raise SourceError(f"{shape.relation} has no rows: there is nothing to dump")
    if not n:
        return Table(keys=np.empty((len(shape.key_names), 0), dtype=np.int64))
    keys = _joined_keys(shape, rows, n)
    sorted_keys, order = sort_keys(keys) if by_key else (keys, None)
    table = Table(keys=sorted_keys, rows_read=n)

    def joined(name: str) -> np.ndarray:  # one column's chunks, in the keys' order
        column = np.concatenate([p[name] for p in rows])
        return column if order is None else column[order]

    for j, c in enumerate(shape.columns):
        if f"b{j}" in rows[0]:  # a run of columns decoded as one row-major block: each column a view of it
            block = joined(f"b{j}")
            for i in range(block.shape[1]):
                table.values[shape.columns[j + i]] = block[:, i]
        if c not in table.values:
            table.values[c] = joined(f"c{j}")
        if c.padded is not None:
            table.lengths[c] = joined(f"n{j}")
        if c.nullable and any(p[f"m{j}"].any() for p in rows):  # a column without a NULL needs no mask, no check
            table.masks[c] = joined(f"m{j}")
    table.nbytes = (
        keys.nbytes + sum(v.nbytes for v in table.values.values()) + sum(m.nbytes for m in table.masks.values())
    )
    return table


def _joined_keys(shape: ScanShape, rows: list[Columns], n: int) -> np.ndarray:
    """The key and order columns of the chunks ``rows`` (``n`` rows) as one ``(width, n)`` int64 array."""
    n_keys = len(shape.key_names)
    keys = np.empty((n_keys, n), dtype=np.int64)
    for i in range(n_keys):
        np.concatenate([p[f"k{i}"] for p in rows] or [np.empty(0)], out=keys[i], casting="unsafe")
    if shape.order_wire is not None and shape.order_offset:
        keys[-1] += shape.order_offset
    return keys


def sort_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """``keys`` (key columns, then the order) sorted, and the order that sorts them (None: they were sorted).

    A table loaded in key order comes back sorted: no ``lexsort``, no copy.
    """
    if _is_sorted(keys):
        return keys, None
    order = np.lexsort(keys[::-1])
    return np.ascontiguousarray(keys[:, order]), order


def _is_sorted(keys: np.ndarray) -> bool:
    """Whether the columns of ``keys`` (one row per key column) are in lexicographic order already."""
    if keys.shape[1] < 2:
        return True
    ok = keys[-1, 1:] >= keys[-1, :-1]
    for column in keys[-2::-1]:
        ok = (column[1:] > column[:-1]) | ((column[1:] == column[:-1]) & ok)
    return bool(ok.all())


def longest_series(keys: np.ndarray) -> int:
    """The rows of the longest series of sorted sample keys (``keys``: the series key slots, then the order)."""
    n = keys.shape[1]
    if not n:
        return 0
    change = np.flatnonzero(np.any(keys[:-1, 1:] != keys[:-1, :-1], axis=0)) + 1
    return int(np.diff(np.concatenate([[0], change, [n]])).max())


def no_windows(samples: ScanConfig, longest: int, shape: ScanShape | None = None) -> SourceError:
    """The error for a table no window fits in: the window, the longest series, the fix.

    Scan mode has no keys query: "the keys query returned no rows" would send the user looking for one.
    Under a time cut (``shape.span``) the windows may fit and lie across the split's range: said so.
    """
    if shape is not None and shape.span is not None and longest >= (samples.window or 1):
        return SourceError(
            f"[splits]: no window of {samples.window} rows lies wholly inside this split's range of "
            f"{shape.key_names[-1]}; check its from, and the next split's"
        )
    if not longest:
        return SourceError(f"[samples] table {samples.table}: returned no rows; there is nothing to dump")
    return SourceError(
        f"[samples] window = {samples.window} is longer than every series (the longest has {longest} rows): "
        f"no sample fits; set window to at most {longest}, or check the table's key column"
    )


def cut(table: Table, shape: ScanShape, samples: ScanConfig) -> tuple[np.ndarray, np.ndarray]:
    """The samples of a sorted table: their keys ``(n_key_columns, n)`` and the row each starts at.

    Rows: every row is a sample, keyed by its key columns. Windows: a series is the rows sharing the key;
    its samples start at rows ``0, stride, 2 * stride, ...`` while a whole window fits, and a sample's key
    is the series' key plus the order value of its first row. Under a time cut (``shape.span``) only the
    windows wholly inside the split's range are its (:func:`within_span`).

    Raises:
        SampleError: two rows of one series have the same order value (windows).
    """
    keys = table.keys
    n = keys.shape[1]
    if samples.window is None:
        return keys, np.arange(n, dtype=np.int64)
    series, order = keys[:-1], keys[-1]
    change = np.any(series[:, 1:] != series[:, :-1], axis=0)
    same_order = np.flatnonzero(~change & (order[1:] == order[:-1]))
    if same_order.size:
        i = int(same_order[0])
        shown = shape.key_columns.values(keys[:, i])[-1]  # a date or timestamp as one, not its days or µs
        raise SampleError(
            f"series ({KeyColumns(shape.key_names[:-1]).show(series[:, i])}) has two rows with "
            f"{shape.key_names[-1]} = {shown}: a series' rows need distinct order values"
        )
    first = np.concatenate([[0], np.flatnonzero(change) + 1]) if n else np.empty(0, np.int64)
    lengths = np.diff(np.concatenate([first, [n]]))
    window, stride = samples.window, samples.stride
    per_series = np.where(lengths >= window, (lengths - window) // stride + 1, 0)
    total = int(per_series.sum())
    ends = np.cumsum(per_series)
    within = np.arange(total, dtype=np.int64) - np.repeat(ends - per_series, per_series)
    starts = np.repeat(first, per_series) + within * stride
    if shape.span is not None:
        starts = within_span(order, starts, window, shape.span)
    return keys[:, starts], starts


def within_span(order: np.ndarray, starts: np.ndarray, window: int, span: tuple[int | None, int | None]) -> np.ndarray:
    """The window starts whose every row lies in a time cut's split, ``[from, next from)`` of the order values.

    A window across a cut is in no split: its first rows are one split's past, its last the next one's.
    """
    lo, hi = span
    keep = np.ones(starts.size, dtype=bool)
    if lo is not None:
        keep &= order[starts] >= lo
    if hi is not None:
        keep &= order[starts + window - 1] < hi
    kept: np.ndarray = starts[keep]
    return kept


def cut_whole(table: Table, shape: ScanShape, samples: ScanConfig) -> tuple[np.ndarray, np.ndarray]:
    """:func:`cut` of a whole table, which must give a sample: a window longer than every series is refused.

    A part of a table (a pass, a bucket of series) may hold no window; the whole table holding none is the
    config's mistake, said the same way for every reader of a whole table (in memory, a check's keys pass,
    a cluster's readers): the window, the longest series and the fix (:func:`no_windows`).
    """
    sample_keys, starts = cut(table, shape, samples)
    if not sample_keys.shape[1] and samples.window is not None:
        raise no_windows(samples, longest_series(table.keys), shape)
    return sample_keys, starts


def gather(table: Table, layout: BatchLayout, starts: np.ndarray, keys: np.ndarray, out: dict[str, np.ndarray]) -> None:
    """Fill ``out`` with the samples starting at rows ``starts`` (keys ``keys``), cast and checked.

    The columns of a row-major block (a run decoded together, :mod:`.copystream`) are gathered together:
    one fancy index of the block's rows, each column then a view of the result.
    """
    values: dict[Column, np.ndarray] = {}
    for block, columns in table.blocks():
        rows = _block_rows(block, starts, layout.rows)
        values.update({c: rows[:, i] for c, i in columns})
    values = {c: values[c] if c in values else _rows(v, starts, layout.rows) for c, v in table.values.items()}
    masks = {c: _rows(m, starts, layout.rows) for c, m in table.masks.items()}
    lengths = {c: _rows(n, starts, layout.rows) for c, n in table.lengths.items()}
    collate.fill(layout, values, masks, keys, out, lengths=lengths)


def _block_rows(block: np.ndarray, starts: np.ndarray, window: int) -> np.ndarray:
    """The ``window`` rows of ``block`` from each start, back to back: ``(len(starts) * window, k)``.

    Each sample's rows are one contiguous run of the block, so they are gathered as a single opaque item
    (a ``void`` of the run's bytes): a plain ``take`` of rows, a fancy index of overlapping windows. Row
    by row (``block[starts]``) was twice as slow, and the windows column by column ten times.
    """
    n, k = block.shape
    run = np.dtype((np.void, block.strides[0] * window))
    if window == 1:
        rows = np.take(block.view(run).reshape(n), starts)
    elif n >= window:
        rows = np.ndarray((n - window + 1,), run, block, 0, (block.strides[0],))[starts]
    else:  # no window fits (no sample either): the general path
        return block[(starts[:, None] + np.arange(window)).reshape(-1)]
    return rows.view(block.dtype).reshape(-1, k)


def _rows(column: np.ndarray, starts: np.ndarray, window: int) -> np.ndarray:
    """The ``window`` rows from each start, back to back: ``(len(starts) * window, ...)``.

    A scalar column's windows are rows of a strided view (a copy of contiguous runs, about three times
    faster than an index per row); array columns take an index per row.
    """
    windows: np.ndarray
    if window == 1:
        windows = column[starts]
    elif column.ndim == 1:
        windows = np.lib.stride_tricks.sliding_window_view(column, window)[starts].reshape(-1)
    else:
        windows = column[(starts[:, None] + np.arange(window)).reshape(-1)]
    return windows
