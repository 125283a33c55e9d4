"""The per-sample query's columns as they travel: their wire types and the SQL that sends them.

A :class:`Column` is what the batch statement (:mod:`pgprefetch.pg.statement`) and the scan's COPY
(:mod:`pgprefetch.write.scan.table`) select for one result column, shaped by the fields that read it: cast by the
server where its type has no fixed width (``numeric``), coded against a category list (``categories``),
or sent with a NULL placeholder and a mask (a NULL policy). :func:`plan_columns` decides that for a
config, once, from the server's description of the query.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import FieldConfig
from pgprefetch.errors import ConfigError

# PostgreSQL type name -> (wire dtype, offset added to reach the Unix epoch, SQL cast applied server-side,
# a placeholder of the type for a NULL under a NULL policy)
WIRE: dict[str, tuple[str, int, str, str]] = {
    "bool": ("?", 0, "", "false"),
    "int2": (">i2", 0, "", "0"),
    "int4": (">i4", 0, "", "0"),
    "int8": (">i8", 0, "", "0"),
    "float4": (">f4", 0, "", "0"),
    "float8": (">f8", 0, "", "0"),
    "numeric": (">f8", 0, "float8", "0"),  # arbitrary precision has no fixed width: PostgreSQL casts it
    "date": (">i4", 10_957, "", "'epoch'"),  # days since 2000-01-01 -> days since 1970-01-01
    "timestamp": (">i8", 946_684_800_000_000, "", "'epoch'"),  # microseconds since 2000-01-01 -> since 1970
    "timestamptz": (">i8", 946_684_800_000_000, "", "'epoch'"),
}
# The binary send function of each wire type: a row-wise statement sends every value as its send bytes.
SEND = {
    "bool": "boolsend",
    "int2": "int2send",
    "int4": "int4send",
    "int8": "int8send",
    "float4": "float4send",
    "float8": "float8send",
    "numeric": "float8send",  # after the cast to float8
    "date": "date_send",
    "timestamp": "timestamp_send",
    "timestamptz": "timestamptz_send",
}
SUPPORTED_TYPES = "bool, smallint, integer, bigint, real, double precision, numeric, date, timestamp, timestamptz"
_TEXT_TYPES = ("text", "varchar", "bpchar", "name", "char", "citext")
BYTES_TYPES = (*_TEXT_TYPES, "bytea")  # sent as bytes (UTF-8 for text) to a uint8 field with max_length


@dataclass(frozen=True)
class Column:
    """One result column of the per-sample query, as it travels and is decoded."""

    name: str
    pg_type: str  # type on the wire, as PostgreSQL names it (int4, float8, ...); int4 for category codes
    is_array: bool
    nullable: bool = False  # sent with NULL replaced and a mask beside it (a field has a NULL policy)
    vocabulary: int | None = None  # categorical: the bind parameter ($n) holding the category list
    padded: int | None = None  # scan mode: an array or bytes of any length, sent cut and padded to this many
    ragged: bool = False  # query mode: an array of any length, its lengths read from its array_send headers
    truncate: str = "error"  # with padded or cut: which elements are kept (see length_sql for the length sent beside)
    cut: int | None = None  # query mode: a field's max_length, the server cuts the value to it (see _cut_sql)

    @classmethod
    def from_type(
        cls,
        name: str,
        type_name: str,
        kind: str,
        where: str,
        *,
        nullable: bool = False,
        vocabulary: int | None = None,
        as_bytes: bool = False,
    ) -> Column:
        """Build a column from asyncpg's type description, or raise a ConfigError naming ``where``.

        ``as_bytes``: the field takes text and bytea as bytes (a uint8 field with ``max_length``).
        """
        is_array = kind == "array"
        base = type_name.removesuffix("[]") if is_array else type_name  # asyncpg names arrays "float4[]"
        base = base[1:] if is_array and base.startswith("_") else base
        shown = f"{base}[]" if is_array else base
        if base in BYTES_TYPES and not is_array and vocabulary is None:
            if not as_bytes:
                raise ConfigError(
                    f'{where}: column "{name}" is {shown}; text and bytea go to a uint8 field with max_length '
                    "(as bytes, UTF-8 for text), or set categories for text labels"
                )
            return cls(name=name, pg_type="bytea" if base == "bytea" else "text", is_array=False)
        if vocabulary is not None:
            if is_array:
                raise ConfigError(f'{where}: column "{name}" is {shown}; categories apply to scalar columns')
            return cls(name=name, pg_type="int4", is_array=False, nullable=nullable, vocabulary=vocabulary)
        if base not in WIRE:
            hint = " (text labels: set categories)" if base in _TEXT_TYPES or kind == "enum" else ""
            raise ConfigError(
                f'{where}: column "{name}" is {shown}; pgprefetch reads {SUPPORTED_TYPES} '
                f"and arrays of these (of any length with max_length){hint}"
            )
        if nullable and is_array:
            raise ConfigError(f'{where}: column "{name}" is {shown}; a null policy applies to scalar columns')
        return cls(name=name, pg_type=base, is_array=is_array, nullable=nullable)

    @property
    def is_bytes(self) -> bool:
        """Text or bytea: each value is a run of bytes (UTF-8 for text), with its length sent beside."""
        return self.pg_type in ("text", "bytea")

    @property
    def wire(self) -> np.dtype:
        """The dtype of one value on the wire (big-endian)."""
        return np.dtype("u1") if self.is_bytes else np.dtype(WIRE[self.pg_type][0])

    def value_sql(self, ref: str, categories: str | None = None) -> str:
        """The SQL expression the statement sends for this column of ``ref`` (a qualified column).

        ``categories`` is the category list as SQL, where it cannot be the bind parameter (a COPY).
        """
        if self.vocabulary is not None:
            vocabulary = categories or f"${self.vocabulary}::text[]"
            return f"coalesce(array_position({vocabulary}, {ref}::text) - 1, -1)::int4"
        if self.is_bytes:  # (scan mode pads the bytes of bytes_sql, computed once a row: see scan.copy_select)
            value = self._cut_sql(ref) if self.cut is not None else ref
            return f"convert_to({value}::text, 'UTF8')" if self.pg_type == "text" else value
        if self.padded is not None:
            return self._padded_sql(ref, self.padded)
        if self.cut is not None:
            ref = self._cut_sql(ref)
        cast = WIRE[self.pg_type][2]
        value = f"{ref}::{cast}[]" if cast and self.is_array else f"{ref}::{cast}" if cast else ref
        # The placeholder carries the type: coalesce(smallint, 0) would be an integer, 4 bytes on the wire.
        placeholder = f"{WIRE[self.pg_type][3]}::{cast or self.pg_type}"
        return f"coalesce({value}, {placeholder})" if self.nullable else value

    def _cut_sql(self, ref: str) -> str:
        """Query mode: the value of ``ref`` cut by the server, so that no more of it travels than is kept.

        A 100 MB array or text cut to 16 elements must not reach the client whole (the memory of a dump is
        then the values' size, not the batch's). What is sent still gives the client's cut
        (:func:`ragged.arrays`, :func:`ragged.byte_runs`) exactly the bytes it keeps from the whole value:
        ``right`` keeps the first ``cut`` elements, ``left`` the last ones. ``error`` sends one element
        more, so that a longer value is still seen (its whole length is not sent: ``cardinality`` would
        decompress a TOASTed array a second time). Text is cut by characters: the first ``cut + 1`` of them
        hold at least the ``cut + 1`` bytes the client's UTF-8 cut looks at, the last ``cut`` at least the
        ``cut`` bytes it keeps; ``substring`` of text or bytea reads only the start of a TOASTed value.
        Arrays are sliced from their own lower bound (see :func:`_first_or_last`), as scan mode's.
        """
        n = self.cut
        assert n is not None
        more = n if self.truncate == "right" and self.pg_type != "text" else n + 1
        if self.is_array:
            return _first_or_last(ref, ref, more if self.truncate != "left" else n, left=self.truncate == "left")
        if self.pg_type == "text":
            return f"right({ref}::text, {n})" if self.truncate == "left" else f"substring({ref}::text for {more})"
        if self.truncate == "left":
            return f"substring({ref} from greatest(octet_length({ref}) - {n}, 0) + 1)"
        return f"substring({ref} for {more})"

    def _padded_sql(self, ref: str, n: int) -> str:
        """An array of any length as exactly ``n`` (``padded``) elements: cut (first or last ones), then zeros after.

        COPY rows of fixed width are what the scan decodes with numpy; ``cardinality`` travels beside.
        """
        cast = WIRE[self.pg_type][2]
        value = f"{ref}::{cast}[]" if cast else ref
        kept = _first_or_last(value, ref, n, left=self.truncate == "left")
        zero = f"0::{cast or self.pg_type}" if self.pg_type != "bool" else "false"
        return f"({kept} || array_fill({zero}, ARRAY[{n} - least(cardinality({ref}), {n})]))"

    def send_sql(self, ref: str) -> str:
        """The row-wise statement's bytes for this column of one row (see :func:`statement.row_wise`).

        An array as its ``array_send``; text and bytea as their bytes; a scalar as its type's send bytes.
        A NULL stays NULL (the client sees None), except under a NULL policy (placeholder and mask).
        """
        value = self.value_sql(ref)
        if self.is_array:
            return f"array_send({value})"
        if self.is_bytes:
            return value
        return f"{SEND['int4' if self.vocabulary is not None else self.pg_type]}({value})"

    def length_sql(self, ref: str) -> str:
        """Scan mode: an array's length before the cut, sent beside it (:meth:`BatchLayout._kept` checks it)."""
        return f"cardinality({ref})::int4"

    def bytes_sql(self, ref: str) -> str:
        """Scan mode: text or bytea as bytes (UTF-8 for text), made anew so that a TOASTed value is read once.

        (A bytea column passed on as it is stays a TOAST pointer, which every function given it reads again.)
        """
        return f"convert_to({ref}::text, 'UTF8')" if self.pg_type == "text" else f"({ref} || ''::bytea)"

    def padded_bytes_sql(self, value: str) -> tuple[str, str]:
        """Scan mode: the bytes ``value`` (of :meth:`bytes_sql`) as exactly ``padded`` bytes, and their length.

        The kept bytes, as :func:`ragged.byte_runs` keeps them, then zeros. The length is the kept one, since
        a cut that would split a UTF-8 character keeps fewer than ``padded`` bytes; with ``truncate =
        "error"`` nothing is cut and the whole length travels, for :meth:`BatchLayout._kept` to name a
        longer sample. ``value`` is repeated: pass a column the scan computed once.
        """
        n = self.padded
        assert n is not None
        zeros = f"decode(repeat('00', {n}), 'hex')"  # folded into a constant when the statement is planned
        if self.truncate == "error":
            return f"substring({value} || {zeros} for {n})", f"octet_length({value})"
        start, count = self._cut_bytes(value, n)
        return f"substring(substring({value} from ({start}) + 1 for {count}) || {zeros} for {n})", f"({count})::int4"

    def _cut_bytes(self, value: str, n: int) -> tuple[str, str]:
        """SQL for the first kept byte (0-based) and the count of bytes kept of the bytes ``value``.

        Text is never cut inside a character: the first byte dropped (``right``) or kept (``left``) must
        not be a UTF-8 continuation byte (``10xxxxxx``).
        """
        size = f"octet_length({value})"
        if self.pg_type != "text":
            return (f"greatest({size} - {n}, 0)" if self.truncate == "left" else "0"), f"least({size}, {n})"
        steps = range(min(4, n))  # a character has at most 3 continuation bytes; a cut stays within the n bytes
        if self.truncate == "left":
            at = [f"{size} - {n - i}" for i in steps]
            first = " ".join(f"WHEN get_byte({value}, {a}) & 192 <> 128 THEN {a}" for a in at)
            start = f"CASE WHEN {size} <= {n} THEN 0 {first} ELSE {size} END"
            return start, f"{size} - {start}"
        ends = " ".join(f"WHEN get_byte({value}, {n - i}) & 192 <> 128 THEN {n - i}" for i in steps)
        return "0", f"CASE WHEN {size} <= {n} THEN {size} {ends} ELSE 0 END"

    @property
    def n_blobs(self) -> int:
        """How many values of the batch row carry this column: arrays and bytes send lengths, nullable ones a mask."""
        return 1 + (self.is_array or self.is_bytes) + self.nullable

    @property
    def n_sent(self) -> int:
        """How many values of a row-wise statement's row carry this column: its bytes, and a mask if nullable."""
        return 1 + self.nullable


def plan_columns(
    fields: Sequence[FieldConfig],
    returned: dict[str, tuple[str, str]],
    n_key_params: int,
    where: str,
    *,
    all_nullable: bool = False,
    not_null: frozenset[str] = frozenset(),
    pad_arrays: bool = False,
) -> tuple[tuple[Column, ...], dict[str, tuple[Column, ...]]]:
    """The columns the batch statement sends (each once), and each field's columns.

    ``returned`` maps the query's column names to (type name, kind). A column that several fields read is
    sent once, nullable if any of them has a NULL policy; a categorical field gets its own columns, coded
    with its own category list, bound as parameter ``$n`` after the key columns (in field order).
    ``all_nullable`` sends every scalar column with its NULL mask (scan mode: a NULL is an error only in
    a row some sample uses, which is known only after the read), except those in ``not_null`` (declared
    NOT NULL by the table: no mask to send, no placeholder for the server to compute). ``pad_arrays`` (scan
    mode): array, text and bytea columns of a field with ``max_length`` are cut and padded by the server.
    """
    nullable = _nullable(fields, returned, all_nullable, not_null)
    by_field: dict[str, tuple[Column, ...]] = {}
    param = n_key_params  # the key arrays come first: one bind parameter per key slot
    for f in fields:
        if f.categories is not None:
            param += 1
        vocabulary = param if f.categories is not None else None
        by_field[f.name] = tuple(
            _field_column(f, name, returned, where, name in nullable, vocabulary, pad_arrays) for name in f.columns
        )
    return tuple(dict.fromkeys(c for cols in by_field.values() for c in cols)), by_field


def _nullable(
    fields: Sequence[FieldConfig], returned: dict[str, tuple[str, str]], all_nullable: bool, not_null: frozenset[str]
) -> set[str]:
    """The columns sent with a NULL mask: those of a field with a NULL policy; every scalar one if ``all_nullable``."""
    nullable = {name for f in fields if f.null != "error" for name in f.columns}
    if all_nullable:
        kinds = {name: returned.get(name, ("", ""))[1] for f in fields for name in f.columns}
        nullable |= {name for name, kind in kinds.items() if kind != "array" and name not in not_null}
    return nullable


def _field_column(
    f: FieldConfig,
    name: str,
    returned: dict[str, tuple[str, str]],
    where: str,
    nullable: bool,
    vocabulary: int | None,
    pad_arrays: bool,
) -> Column:
    """Column ``name`` as field ``f`` reads it: its type, its mask, its category list, and how it is cut."""
    if name not in returned:
        raise ConfigError(
            f'{where}[fields.{f.name}] columns: the query returns no column "{name}" '
            f"(it returns {', '.join(returned) or 'nothing'})"
        )
    type_name, kind = returned[name]
    column = Column.from_type(
        name,
        type_name,
        kind,
        f"{where}[fields.{f.name}] columns",
        nullable=nullable,
        vocabulary=vocabulary,
        as_bytes=f.max_length is not None and f.dtype == "uint8",
    )
    if f.max_length is None or not (column.is_array or column.is_bytes):
        return column
    if pad_arrays:
        return dataclasses.replace(column, padded=f.max_length, truncate=f.truncate)
    return dataclasses.replace(column, ragged=column.is_array, cut=f.max_length, truncate=f.truncate)


def _first_or_last(value: str, ref: str, n: int, *, left: bool) -> str:
    """The first (or, ``left``, the last) ``n`` elements of the array ``value`` (``ref`` before any cast).

    Subscripts count from the array's own lower bound, which need not be 1 (``'[0:3]={1,2,3,4}'``, or
    an array built by slicing): a slice ``[1:n]`` of such an array would drop or miss its first elements,
    while the client's cut of a whole value (query mode's row-wise statement) takes the first ``n``. An
    empty or NULL array has no lower bound; ``coalesce`` keeps it empty (a NULL bound would make it NULL).
    """
    lo = f"coalesce(array_lower({ref}, 1), 1)"
    if left:
        return f"({value})[greatest(coalesce(array_upper({ref}, 1), 0) - {n} + 1, {lo}):]"
    return f"({value})[{lo}:{lo} + {n - 1}]"
