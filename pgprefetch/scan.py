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
   :meth:`pgprefetch.collate.BatchLayout.fill`, the code the query mode's decoded blobs go through.

The table stays in memory for as long as the dump runs, so several epochs (``--epochs A-B``) are cut from
one read. ``[source] memory`` bounds it: a read that outgrows the budget is given up and the table is read
in passes instead (:mod:`pgprefetch.passes`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .collate import BatchLayout
from .columns import Column, plan_columns
from .config import Config, ScanConfig
from .copystream import Columns, CopyDecoder
from .errors import ConfigError, PgprefetchError, SampleError, SourceError
from .keys import KeyColumns
from .source import BatchReader, Snapshot
from .sqltext import quote_ident
from .units import first_error

KEY_TYPES = {"int2": ">i2", "int4": ">i4", "int8": ">i8"}
# order column type -> (wire dtype, offset to the Unix epoch in its unit)
ORDER_TYPES = {
    "int2": (">i2", 0),
    "int4": (">i4", 0),
    "int8": (">i8", 0),
    "date": (">i4", 10_957),
    "timestamp": (">i8", 946_684_800_000_000),
    "timestamptz": (">i8", 946_684_800_000_000),
}
_SIMPLE_NAME = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_$]*\.)?[A-Za-z_][A-Za-z0-9_$]*$")
_T = "_pgpf_t"
_ONCE = "_pgpf_once"  # the per-row values of text and bytea columns scan mode cuts


@dataclass(frozen=True)
class ScanShape:
    """What the scan reads: the relation, key and order columns, and the field columns as they travel."""

    relation: str  # SQL for FROM
    plain_table: bool  # a table name: split into page ranges
    key_names: tuple[str, ...]  # the key columns, then the order column's name (windows)
    key_wire: tuple[np.dtype, ...]
    order_wire: np.dtype | None
    order_offset: int
    columns: tuple[Column, ...]
    by_field: dict[str, tuple[Column, ...]]
    categories: dict[str, list[str]] = field(default_factory=dict)  # set by modes.read_scan (plan.resolve_categories)

    @property
    def n_key(self) -> int:
        """Key columns of a series (or a row), without the order column."""
        return len(self.key_wire)


async def describe_scan(cfg: Config, snap: Snapshot) -> ScanShape:
    """Check ``[samples] table`` and the fields against the server's description of the relation.

    The category lists are fixed afterwards, as in the query mode (:func:`pgprefetch.plan.resolve_categories`).
    """
    samples = cfg.samples
    assert isinstance(samples, ScanConfig)
    where = f"{cfg.file}: " if cfg.file else ""
    plain = bool(_SIMPLE_NAME.match(samples.table))
    relation = samples.table if plain else f"({samples.table}) AS {_T}"
    returned = await snap.describe_sql(f"SELECT * FROM {relation} LIMIT 0", f"{where}[samples] table")
    for name in (*samples.key, *([samples.order] if samples.order else [])):
        if name not in returned:
            raise ConfigError(
                f'{where}[samples] table: no column "{name}" (it has {", ".join(returned) or "no columns"})'
            )
    for name in samples.key:
        if returned[name][0] not in KEY_TYPES:
            raise ConfigError(
                f'{where}[samples] key: column "{name}" is {returned[name][0]}; '
                "scan mode keys must be integer columns (smallint, integer, bigint)"
                + ("; uuid keys work in query mode ([samples] keys and query)" if returned[name][0] == "uuid" else "")
            )
    order_wire, offset = None, 0
    if samples.order:
        kind = returned[samples.order][0]
        if kind not in ORDER_TYPES:
            raise ConfigError(
                f'{where}[samples] order: column "{samples.order}" is {kind}; '
                "expected an integer, date, timestamp or timestamptz column"
            )
        order_wire, offset = np.dtype(ORDER_TYPES[kind][0]), ORDER_TYPES[kind][1]
    not_null: frozenset[str] = frozenset()
    if plain:  # columns the table declares NOT NULL need no mask
        sql = f"SELECT attname FROM pg_attribute WHERE attrelid = '{relation}'::regclass AND attnotnull AND attnum > 0"
        not_null = frozenset(r[0] for r in await snap.fetch(sql, f"{where}[samples] table"))
    columns, by_field = plan_columns(
        cfg.fields, returned, 0, where, all_nullable=True, not_null=not_null, pad_arrays=True
    )
    return ScanShape(
        relation=relation,
        plain_table=plain,
        key_names=(*samples.key, *([samples.order] if samples.order else [])),
        key_wire=tuple(np.dtype(KEY_TYPES[returned[k][0]]) for k in samples.key),
        order_wire=order_wire,
        order_offset=offset,
        columns=columns,
        by_field=by_field,
    )


async def distinct_text(cfg: Config, snap: Snapshot, shape: ScanShape, column: str) -> list[str]:
    """The distinct non-NULL values of ``column`` in the relation, as text (``categories = "auto"``)."""
    where = f"{cfg.file}: " if cfg.file else ""
    ref = quote_ident(column)
    sql = f"SELECT DISTINCT {ref}::text FROM {shape.relation} WHERE {ref} IS NOT NULL"
    return [r[0] for r in await snap.fetch(sql, f"{where}categories of column {column}")]


def copy_select(shape: ScanShape, where: str = "") -> str:
    """The SELECT a range's COPY runs: key columns, order, then each column's value and NULL mask."""
    exprs = [quote_ident(k) for k in shape.key_names]
    vocabularies = {
        c: _text_array(shape.categories[f]) for f, cols in shape.by_field.items() for c in cols if f in shape.categories
    }
    once = []  # text and bytea to cut: each row's bytes, computed once (the cut refers to them ten times)
    for j, c in enumerate(shape.columns):
        ref = quote_ident(c.name)
        if c.is_bytes and c.padded is not None:
            once.append(f"{c.bytes_sql(ref)} AS b{j}")
            exprs += c.padded_bytes_sql(f"{_ONCE}.b{j}")
        else:
            exprs.append(c.value_sql(ref, vocabularies.get(c)))
        if c.is_array and c.padded is not None:
            exprs.append(c.length_sql(ref))
        if c.nullable:
            exprs.append(f"({ref} IS NULL)")
    relation = shape.relation
    if once:  # OFFSET 0: a subquery the planner keeps, so its values are not pasted into each reference
        relation += f" CROSS JOIN LATERAL (SELECT {', '.join(once)} OFFSET 0) AS {_ONCE}"
    return f"SELECT {', '.join(exprs)} FROM {relation}{where}"


def _text_array(values: Sequence[str]) -> str:
    """A text[] literal (COPY takes no bind parameters); quotes doubled, as standard_conforming_strings reads them."""
    return "ARRAY[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]::text[]"


@dataclass
class Table:
    """The rows of one read, sorted by (key, order): key columns, order values and each column's values."""

    keys: np.ndarray  # (n_key_columns [+ 1 for the order], n_rows) int64, sorted
    values: dict[Column, np.ndarray] = field(default_factory=dict)  # wire dtypes, (n_rows, ...)
    masks: dict[Column, np.ndarray] = field(default_factory=dict)
    lengths: dict[Column, np.ndarray] = field(default_factory=dict)  # arrays of any length: each row's, uncut
    rows_read: int = 0
    nbytes: int = 0


class TableTooLarge(PgprefetchError):
    """The relation does not fit ``[source] memory``: read it in passes (:mod:`pgprefetch.passes`)."""

    def __init__(self, bytes_per_row: float, rows: int) -> None:
        super().__init__("the table does not fit [source] memory")
        self.bytes_per_row = bytes_per_row
        self.rows = rows  # decoded before the read was given up (the server read them)


async def read_table(
    cfg: Config,
    snap: Snapshot,
    shape: ScanShape,
    wheres: list[str] | None = None,
    *,
    budget: int | None = None,
    on_rows: Callable[[int], None] | None = None,
) -> Table:
    """Read the relation (or the ranges ``wheres``, one COPY each) on the snapshot into a sorted Table.

    Without ``wheres`` the relation is split into ``connections`` page ranges. ``on_rows`` hears of the
    rows decoded, a piece at a time.

    Raises:
        TableTooLarge: more than ``budget`` bytes arrived (default ``[source] memory``; 0: no limit).
        SourceError: the database failed (transient when a connection was lost).
    """
    ranges = wheres if wheres is not None else await _page_ranges(snap, shape, cfg.source.connections)
    decoders = [CopyDecoder(shape, on_rows) for _ in ranges]
    limit = cfg.source.memory_bytes if budget is None else budget

    def sink(decoder: CopyDecoder) -> Callable[[bytes], Awaitable[None]]:
        async def take(data: bytes) -> None:
            if decoder.feed(data):  # decoded on a thread: the event loop keeps the other COPYs streaming
                await asyncio.to_thread(decoder.drain)
            held = sum(d.held_bytes for d in decoders)
            if limit and held > limit:
                for d in decoders:
                    d.drain()  # decode what is held, to measure the rows' size
                rows = sum(d.rows for d in decoders)
                decoded = sum(d.decoded_bytes for d in decoders)
                per_row = decoded / rows if rows else float(decoder.row.itemsize if decoder.row else 64)
                raise TableTooLarge(per_row, rows)

        return take

    async with BatchReader.open(cfg.source, snap.id, None) as workers:
        copies = [
            workers.copy(f"reading {shape.relation}", f"{copy_select(shape, where)}", sink(d))
            for d, where in zip(decoders, ranges, strict=True)
        ]
        await first_error(copies)
    return await asyncio.to_thread(lambda: _assemble(shape, [p for d in decoders for p in d.finish()]))


async def _page_ranges(snap: Snapshot, shape: ScanShape, n: int) -> list[str]:
    """``WHERE`` clauses splitting a plain table into ``n`` page ranges of about equal size (one for a SELECT).

    The last range is open-ended, so pages the table grew by after the size was read are still covered;
    the snapshot decides which rows are seen either way.
    """
    if not shape.plain_table or n == 1 or int(snap.server_version.split(".")[0].split()[0]) < 14:
        return [""]  # before PostgreSQL 14 a ctid range is a filter on a full scan: one COPY reads less
    sql = f"SELECT pg_relation_size('{shape.relation}'::regclass) / current_setting('block_size')::int8"
    pages = int((await snap.fetch(sql, f"size of {shape.relation}"))[0][0])
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


def _assemble(shape: ScanShape, parts: list[Columns]) -> Table:
    """The table's columns from the ranges' chunks, sorted by (key, order) (a ``lexsort``: no server sort)."""
    rows = [p for p in parts if p["k0"].size]
    n = sum(p["k0"].size for p in rows)
    if not n:
        raise SourceError(f"{shape.relation} has no rows: there is nothing to dump")
    n_keys = len(shape.key_names)
    keys = np.empty((n_keys, n), dtype=np.int64)
    for i in range(n_keys):
        np.concatenate([p[f"k{i}"] for p in rows] or [np.empty(0)], out=keys[i], casting="unsafe")
    if shape.order_wire is not None and shape.order_offset:
        keys[-1] += shape.order_offset
    sorted_order = _is_sorted(keys)  # a table loaded in key order comes back sorted: no lexsort, no copy
    order = None if sorted_order else np.lexsort(keys[::-1])
    table = Table(keys=keys if sorted_order else np.ascontiguousarray(keys[:, order]), rows_read=n)
    for j, c in enumerate(shape.columns):
        values = np.concatenate([p[f"c{j}"] for p in rows])
        table.values[c] = values if sorted_order else values[order]
        if c.padded is not None:
            lengths = np.concatenate([p[f"n{j}"] for p in rows])
            table.lengths[c] = lengths if sorted_order else lengths[order]
        if c.nullable:
            masks = np.concatenate([p[f"m{j}"] for p in rows])
            if masks.any():  # a column without a NULL in the whole table needs no mask, and no check
                table.masks[c] = masks if sorted_order else masks[order]
    table.nbytes = (
        keys.nbytes + sum(v.nbytes for v in table.values.values()) + sum(m.nbytes for m in table.masks.values())
    )
    return table


def _is_sorted(keys: np.ndarray) -> bool:
    """Whether the columns of ``keys`` (one row per key column) are in lexicographic order already."""
    if keys.shape[1] < 2:
        return True
    ok = keys[-1, 1:] >= keys[-1, :-1]
    for column in keys[-2::-1]:
        ok = (column[1:] > column[:-1]) | ((column[1:] == column[:-1]) & ok)
    return bool(ok.all())


def cut(table: Table, shape: ScanShape, samples: ScanConfig) -> tuple[np.ndarray, np.ndarray]:
    """The samples of a sorted table: their keys ``(n_key_columns, n)`` and the row each starts at.

    Rows: every row is a sample, keyed by its key columns. Windows: a series is the rows sharing the key;
    its samples start at rows ``0, stride, 2 * stride, ...`` while a whole window fits, and a sample's key
    is the series' key plus the order value of its first row.

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
        raise SampleError(
            f"series ({KeyColumns(shape.key_names[:-1]).show(series[:, i])}) has two rows with "
            f"{shape.key_names[-1]} = {int(order[i])}: a series' rows need distinct order values"
        )
    first = np.concatenate([[0], np.flatnonzero(change) + 1]) if n else np.empty(0, np.int64)
    lengths = np.diff(np.concatenate([first, [n]]))
    window, stride = samples.window, samples.stride
    per_series = np.where(lengths >= window, (lengths - window) // stride + 1, 0)
    total = int(per_series.sum())
    ends = np.cumsum(per_series)
    within = np.arange(total, dtype=np.int64) - np.repeat(ends - per_series, per_series)
    starts = np.repeat(first, per_series) + within * stride
    return keys[:, starts], starts


def gather(table: Table, layout: BatchLayout, starts: np.ndarray, keys: np.ndarray, out: dict[str, np.ndarray]) -> None:
    """Fill ``out`` with the samples starting at rows ``starts`` (keys ``keys``), cast and checked."""
    values = {c: _rows(v, starts, layout.rows) for c, v in table.values.items()}
    masks = {c: _rows(m, starts, layout.rows) for c, m in table.masks.items()}
    lengths = {c: _rows(n, starts, layout.rows) for c, n in table.lengths.items()}
    layout.fill(values, masks, keys, out, lengths=lengths)


def _rows(column: np.ndarray, starts: np.ndarray, window: int) -> np.ndarray:
    """The ``window`` rows from each start, back to back: ``(len(starts) * window, ...)``.

    A scalar column's windows are rows of a strided view (a copy of contiguous runs, about three times
    faster than an index per row); array columns take an index per row.
    """
    if window == 1:
        return column[starts]
    if column.ndim == 1:
        return np.lib.stride_tricks.sliding_window_view(column, window)[starts].reshape(-1)
    return column[(starts[:, None] + np.arange(window)).reshape(-1)]
