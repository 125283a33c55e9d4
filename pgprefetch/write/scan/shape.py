"""Scan mode's shape of a table: its key, order and field columns as described on the snapshot, and its COPY.

:func:`describe_scan` checks the relation against the config once per read (key and order types, each
field's columns); :func:`copy_select` is the SELECT every range's COPY runs, each
value sent fixed-width and NOT NULL so that the client decodes rows as one structured array.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pgprefetch.config.model import Config, ScanConfig
from pgprefetch.errors import ConfigError
from pgprefetch.keys import INTEGER_TYPES, KeyColumns, order_slot
from pgprefetch.pg.columns import Column, plan_columns
from pgprefetch.pg.session import Snapshot
from pgprefetch.pg.statement import distinct_values_statement, vocabulary_sql
from pgprefetch.sqltext import quote_ident
from pgprefetch.write.plan import MAX_CATEGORY_BYTES, SampleText

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
    categories: dict[str, list[str]] = field(default_factory=dict)  # fixed by mode.read_scan (resolve_categories)
    order_type: str = ""  # the order column's PostgreSQL type (windows): a date or timestamp comes back as one
    span: tuple[int | None, int | None] | None = None  # a time cut's split: its windows' order range, as slots

    @property
    def key_columns(self) -> KeyColumns:
        """A sample's key columns: the key, then (windows) the order column, a date or timestamp as such."""
        types = ["int8"] * len(self.key_wire) + ([self.order_type] if self.order_wire is not None else [])
        return KeyColumns.of_types(self.key_names, types)

    @property
    def n_key(self) -> int:
        """Key columns of a series (or a row), without the order column."""
        return len(self.key_wire)


async def describe_scan(cfg: Config, snap: Snapshot) -> ScanShape:
    """Check ``[samples] table`` and the fields against the server's description of the relation.

    The category lists are fixed afterwards, as in the query mode
    (:func:`pgprefetch.write.plan.resolve_categories`).
    """
    samples = cfg.samples
    assert isinstance(samples, ScanConfig)
    where = f"{cfg.file}: " if cfg.file else ""
    plain = bool(_SIMPLE_NAME.match(samples.table))
    relation = scan_relation(samples)
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
        sql = "SELECT attname FROM pg_attribute WHERE attrelid = $1::text::regclass AND attnotnull AND attnum > 0"
        not_null = frozenset(r[0] for r in await snap.fetch(sql, f"{where}[samples] table", relation))
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
        order_type=returned[samples.order][0] if samples.order else "",
        columns=columns,
        by_field=by_field,
        span=time_span(cfg, returned[samples.order][0]) if samples.order else None,
    )


def time_span(cfg: Config, order_type: str) -> tuple[int | None, int | None] | None:
    """The order range ``[from, next split's from)`` of ``cfg``'s split under a time cut, as the order's slots.

    None: no time cut. A ``from`` the order column cannot hold (a date for an integer column) is refused.

    Raises:
        ConfigError: naming the split and the column's type.
    """
    rule, split = cfg.splits, cfg.split
    if rule is None or rule.by != "order" or split is None:
        return None
    names = rule.names
    i = names.index(split)
    bounds = [rule.starts[i][1], rule.starts[i + 1][1] if i + 1 < len(names) else None]
    slots: list[int | None] = []
    for at, value in zip((i, i + 1), bounds, strict=True):
        if value is None:
            slots.append(None)
            continue
        slot = order_slot(order_type, value)
        if slot is None:
            expected = {"date": "an ISO date", "timestamp": "an ISO date or time without an offset"}
            wanted = "an integer" if order_type in INTEGER_TYPES else expected.get(order_type, "an ISO date or time")
            raise ConfigError(f"[splits] {names[at]} from = {value!r}: the order column is {order_type}; give {wanted}")
        slots.append(slot)
    return slots[0], slots[1]


def scan_relation(samples: ScanConfig) -> str:
    """``[samples] table`` as a FROM item: a table or view name as it is, a SELECT as a subquery."""
    return samples.table if _SIMPLE_NAME.match(samples.table) else f"({samples.table}) AS {_T}"


def sample_text(cfg: Config, snap: Snapshot) -> SampleText:
    """How the dump finds a scan sample's values of a column, as text, to name one outside its category list.

    The COPY sends a category's code, computed by the server: a value outside the list arrives as -1, and
    the value itself is never sent. This reads that sample's rows again, on the epoch's snapshot (the same
    rows): the key's columns (and a window's first order value) bound as parameters, never SQL text; a
    window's rows in order, at most ``window``; each value cut past the longest a category may be (a longer
    one is in no list), so that a lookup reads at most a sample's rows of that many characters.
    """
    samples = cfg.samples
    assert isinstance(samples, ScanConfig)
    where = [f"{quote_ident(k)} = ${i}" for i, k in enumerate(samples.key, 1)]
    order = ""
    if samples.order is not None and samples.window is not None:
        where.append(f"{quote_ident(samples.order)} >= ${len(samples.key) + 1}")
        order = f" ORDER BY {quote_ident(samples.order)}"

    async def lookup(key: Sequence[object], column: str) -> list[str | None]:
        sql = (
            f"SELECT left({quote_ident(column)}::text, {MAX_CATEGORY_BYTES + 1}) FROM {scan_relation(samples)} "
            f"WHERE {' AND '.join(where)}{order} LIMIT {samples.rows}"
        )
        rows = await snap.fetch(sql, f"looking up a value of {column}", *key)
        return [r[0] for r in rows]

    return lookup


async def distinct_values(
    cfg: Config, snap: Snapshot, shape: ScanShape, columns: list[str]
) -> tuple[dict[str, set[str]], int]:
    """The distinct values of ``columns`` in the relation, as text, in one read; and the rows it read.

    For ``categories = "auto"`` where the store's vocabulary does not have them all already
    (:mod:`pgprefetch.write.scan.strategy`).
    """
    where = f"{cfg.file}: " if cfg.file else ""
    sql = distinct_values_statement(shape.relation, [quote_ident(c) for c in columns], MAX_CATEGORY_BYTES + 1)
    values, rows = await snap.distinct_values(sql, f"{where}categories of column(s) {', '.join(columns)}")
    return {c: values.get(i, set()) for i, c in enumerate(columns)}, rows


def copy_select(shape: ScanShape, where: str = "") -> str:
    """The SELECT a range's COPY runs: key columns, order, then each column's value and NULL mask."""
    exprs = [quote_ident(k) for k in shape.key_names]
    vocabularies = {c: vocabulary_sql(i) for i, f in enumerate(coded_fields(shape)) for c in shape.by_field[f]}
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


def coded_fields(shape: ScanShape) -> list[str]:
    """The fields whose columns the COPY codes against a category list, in the order of :func:`vocabularies`."""
    return [f for f in shape.by_field if f in shape.categories]


def vocabularies(shape: ScanShape) -> list[list[str]]:
    """The category lists the COPY's workers bind (``BatchReader.open(vocabularies=...)``), in SQL's order.

    List ``i`` is read by :func:`~pgprefetch.pg.statement.vocabulary_sql` ``(i)``: a COPY takes no bind
    parameters, and a value pasted into its text would be SQL (a backslash in data, read with
    ``standard_conforming_strings = off``, was).
    """
    return [shape.categories[f] for f in coded_fields(shape)]


def keys_only(shape: ScanShape) -> ScanShape:
    """The shape of a read of the keys alone: no field columns."""
    return dataclasses.replace(shape, columns=(), by_field={})
