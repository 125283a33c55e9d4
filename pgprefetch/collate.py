"""Decoding one batch's wire bytes straight into fixed-shape numpy arrays.

The batch statement (see :mod:`pgprefetch.source`) returns one row whose values are PostgreSQL *binary*
arrays (``array_send``), one per result column. A binary array of a fixed-width type is a 20-byte header
followed by ``(int32 length, value)`` pairs, so numpy can view it as a structured array and the
big-endian values land in the batch buffer with one vectorised cast: no Python object per value.

A fixed-length array column (``real[16]``) arrives as the concatenation of each row's ``array_send``
bytes plus an ``int4`` array of the rows' ``cardinality``; once every length is checked, the rows are
fixed-size records too.

Anything that does not fit (a NULL, a sample with the wrong number of rows, an array of the wrong
length) raises :class:`~pgprefetch.errors.SampleError` naming the sample's key, the field and the column.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .config import FieldConfig
from .errors import ConfigError, SampleError

_HEADER = 20  # ndim, has-null flag, element type oid, dimension length, lower bound: 5 x int32

# PostgreSQL type name -> (wire dtype, offset added to reach the Unix epoch, SQL cast applied server-side)
_WIRE: dict[str, tuple[str, int, str]] = {
    "bool": ("?", 0, ""),
    "int2": (">i2", 0, ""),
    "int4": (">i4", 0, ""),
    "int8": (">i8", 0, ""),
    "float4": (">f4", 0, ""),
    "float8": (">f8", 0, ""),
    "numeric": (">f8", 0, "float8"),  # arbitrary precision has no fixed width: PostgreSQL casts it
    "date": (">i4", 10_957, ""),  # days since 2000-01-01 -> days since 1970-01-01
    "timestamp": (">i8", 946_684_800_000_000, ""),  # microseconds since 2000-01-01 -> since 1970-01-01
    "timestamptz": (">i8", 946_684_800_000_000, ""),
}
SUPPORTED_TYPES = "bool, smallint, integer, bigint, real, double precision, numeric, date, timestamp, timestamptz"


@dataclass(frozen=True)
class Column:
    """One result column of the per-sample query, as it travels and is decoded."""

    name: str
    pg_type: str  # element type name as PostgreSQL reports it (int4, float8, ...)
    is_array: bool

    @classmethod
    def from_type(cls, name: str, type_name: str, kind: str, where: str) -> Column:
        """Build a column from asyncpg's type description, or raise a ConfigError naming ``where``."""
        is_array = kind == "array"
        base = type_name.removesuffix("[]") if is_array else type_name  # asyncpg names arrays "float4[]"
        base = base[1:] if is_array and base.startswith("_") else base
        if base not in _WIRE:
            shown = f"{base}[]" if is_array else base
            raise ConfigError(
                f'{where}: column "{name}" is {shown}; pgprefetch reads {SUPPORTED_TYPES} '
                "and fixed-length arrays of these"
            )
        return cls(name=name, pg_type=base, is_array=is_array)

    @property
    def wire(self) -> np.dtype:
        """The dtype of one value on the wire (big-endian)."""
        return np.dtype(_WIRE[self.pg_type][0])

    @property
    def cast(self) -> str:
        """The SQL cast PostgreSQL applies before sending ('' for none)."""
        cast = _WIRE[self.pg_type][2]
        return f"::{cast}[]" if cast and self.is_array else f"::{cast}" if cast else ""

    @property
    def n_blobs(self) -> int:
        """How many values of the batch row carry this column: arrays also send their lengths."""
        return 2 if self.is_array else 1


@dataclass(frozen=True)
class FieldLayout:
    """Where one field's columns go in its batch array."""

    name: str
    dtype: np.dtype
    columns: tuple[Column, ...]
    sample_shape: tuple[int, ...]
    array_length: int  # elements per array value, 1 for scalar columns


@dataclass(frozen=True)
class BatchLayout:
    """The decoding plan of a dump: result columns, fields, rows per sample and key column names."""

    columns: tuple[Column, ...]
    fields: tuple[FieldLayout, ...]
    rows: int
    key_names: tuple[str, ...]

    @classmethod
    def build(
        cls,
        fields: Sequence[FieldConfig],
        columns: Sequence[Column],
        array_lengths: dict[str, int],
        rows: int,
        key_names: Sequence[str],
    ) -> BatchLayout:
        """Combine the config's fields with the columns' types and array lengths (from the first sample).

        ``columns`` must be in the order the batch statement sends them (see :func:`result_columns`).
        """
        by_name = {c.name: c for c in columns}
        layouts = []
        for f in fields:
            cols = tuple(by_name[c] for c in f.columns)
            lengths = {array_lengths[c.name] if c.is_array else 0 for c in cols}
            if len(lengths) != 1:
                raise ConfigError(
                    f"[fields.{f.name}] columns: mixes scalars and arrays, or arrays of different lengths "
                    f"({', '.join(f'{c.name}: {array_lengths.get(c.name, 1)}' for c in cols)})"
                )
            n = lengths.pop()
            shape = (*([rows] if rows > 1 else []), *([len(cols)] if len(cols) > 1 else []), *([n] if n else []))
            layouts.append(FieldLayout(f.name, np.dtype(f.dtype), cols, shape, max(n, 1)))
        return cls(columns=tuple(columns), fields=tuple(layouts), rows=rows, key_names=tuple(key_names))

    @property
    def n_blobs(self) -> int:
        """Values in the batch row: the sample ordinals, then each column's."""
        return 1 + sum(c.n_blobs for c in self.columns)

    def allocate(self, size: int) -> dict[str, np.ndarray]:
        """Zeroed batch buffers, one per field, to be filled by :meth:`decode` (and reused)."""
        return {f.name: np.zeros((size, *f.sample_shape), dtype=f.dtype) for f in self.fields}

    def decode(self, blobs: Sequence[bytes | None], keys: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Fill ``out`` with the batch whose samples have ``keys`` (shape ``(n_key_columns, n)``).

        Raises:
            SampleError: a sample returned the wrong number of rows, a NULL or an array of the wrong length.
        """
        n = keys.shape[1]
        if blobs[0] is None:  # no sample returned any row
            raise self._error(keys, 0, f"returned 0 rows, expected {self.rows} ([samples] rows)")
        ordinals = _scalar(blobs[0], np.dtype(">i4"))
        self._check_rows(ordinals, keys)
        # Rows arrive sample by sample; should a plan ever interleave samples, a stable sort restores them.
        in_order = bool(np.all(ordinals[1:] >= ordinals[:-1]))
        order = None if in_order else np.argsort(ordinals, kind="stable")
        values: dict[str, np.ndarray] = {}
        i = 1
        for col in self.columns:
            try:
                if col.is_array:
                    v = _array(blobs[i], blobs[i + 1], col.wire, self._length(col))
                else:
                    v = _scalar(blobs[i], col.wire)
            except _BadRow as e:  # e.row counts rows as they arrived, like ordinals
                sample = int(ordinals[e.row]) - 1
                raise self._error(keys, sample, f"{self._field_of(col)}column {col.name} {e}") from None
            values[col.name] = v if order is None else v[order]
            i += col.n_blobs
        for f in self.fields:
            target = out[f.name][:n].reshape(n * self.rows, len(f.columns), f.array_length)
            for j, col in enumerate(f.columns):
                v = values[col.name].reshape(n * self.rows, f.array_length)
                offset = _WIRE[col.pg_type][1]
                if offset:
                    v = v.astype(np.int64) + offset
                np.copyto(target[:, j, :], v, casting="unsafe")

    def _check_rows(self, ordinals: np.ndarray, keys: np.ndarray) -> None:
        n = keys.shape[1]
        if ordinals.size == n * self.rows:
            counts = np.bincount(ordinals - 1, minlength=n)
            if counts.size == n and np.all(counts == self.rows):
                return
        counts = np.bincount(ordinals - 1, minlength=n)[:n]
        bad = int(np.flatnonzero(counts != self.rows)[0])
        raise self._error(keys, bad, f"returned {counts[bad]} rows, expected {self.rows} ([samples] rows)")

    def _length(self, col: Column) -> int:
        for f in self.fields:
            if col in f.columns:
                return f.array_length
        raise KeyError(col.name)

    def _field_of(self, col: Column) -> str:
        names = [f.name for f in self.fields if col in f.columns]
        return f"field {', '.join(names)}, " if names else ""

    def _error(self, keys: np.ndarray, sample: int, message: str) -> SampleError:
        key = ", ".join(f"{name}={int(keys[j, sample])}" for j, name in enumerate(self.key_names))
        return SampleError(f"sample ({key}): {message}")


class _BadRow(Exception):
    """A value at result row ``row`` cannot be decoded; the message says why."""

    def __init__(self, row: int, message: str) -> None:
        super().__init__(message)
        self.row = row


def _scalar(blob: bytes | None, wire: np.dtype) -> np.ndarray:
    """The values of a one-dimensional binary array of a fixed-width type."""
    if blob is None:
        return np.empty(0, dtype=wire)
    ndim, has_null, _oid, length, _lower = np.frombuffer(blob, dtype=">i4", count=5)
    if has_null:
        raise _BadRow(_first_null(blob, length), "is NULL")
    assert ndim == 1
    rec = np.frombuffer(blob, dtype=[("len", ">i4"), ("v", wire)], offset=_HEADER, count=length)
    return rec["v"]


def _first_null(blob: bytes, length: int) -> int:
    """Walk the elements of a binary array with NULLs to find the first one (error path only)."""
    pos = _HEADER
    for i in range(length):
        n = int.from_bytes(blob[pos : pos + 4], "big", signed=True)
        if n < 0:
            return i
        pos += 4 + n
    return 0


def _array(blob: bytes | None, lengths_blob: bytes | None, wire: np.dtype, n: int) -> np.ndarray:
    """Rows of a fixed-length array column, shape ``(rows, n)``."""
    if lengths_blob is None:
        return np.empty((0, n), dtype=wire)
    _ndim, has_null, _oid, rows, _lower = np.frombuffer(lengths_blob, dtype=">i4", count=5)
    if has_null:  # cardinality(NULL) is NULL
        raise _BadRow(_first_null(lengths_blob, rows), "is NULL")
    lengths = np.frombuffer(lengths_blob, dtype=[("len", ">i4"), ("v", ">i4")], offset=_HEADER, count=rows)["v"]
    if np.any(lengths != n):
        bad = int(np.flatnonzero(lengths != n)[0])
        raise _BadRow(bad, f"has {lengths[bad]} elements, expected {n} (as in the first sample)")
    element = np.dtype([("len", ">i4"), ("v", wire)])
    row = np.dtype(
        [("ndim", ">i4"), ("has_null", ">i4"), ("oid", ">i4"), ("dim", ">i4"), ("lower", ">i4"), ("e", element, (n,))]
    )
    if blob is None or len(blob) != rows * row.itemsize:
        raise _BadRow(
            _first_irregular(blob or b"", rows, row.itemsize), "has a NULL element or more than one dimension"
        )
    rec = np.frombuffer(blob, dtype=row, count=rows)
    irregular = (rec["ndim"] != 1) | (rec["has_null"] != 0)
    if np.any(irregular):
        raise _BadRow(int(np.flatnonzero(irregular)[0]), "has a NULL element or more than one dimension")
    return rec["e"]["v"]


def _first_irregular(blob: bytes, rows: int, size: int) -> int:
    """The first row whose array is not a plain one-dimensional array without NULLs (error path only)."""
    pos = 0
    for i in range(rows):
        ndim, has_null = np.frombuffer(blob, dtype=">i4", count=2, offset=pos) if pos + 8 <= len(blob) else (0, 1)
        if ndim != 1 or has_null:
            return i
        pos += size
    return rows - 1


def result_columns(fields: Sequence[FieldConfig], columns: dict[str, Column]) -> tuple[Column, ...]:
    """The columns the batch statement sends, each once, in the order the fields name them."""
    return tuple(dict.fromkeys(columns[name] for f in fields for name in f.columns))


def array_lengths(layout_columns: Sequence[Column], blobs: Sequence[bytes | None]) -> dict[str, int]:
    """The element count of each array column in the first row of a batch (fixes the field shapes)."""
    out = {}
    i = 1
    for col in layout_columns:
        if col.is_array:
            lengths_blob = blobs[i + 1]
            if lengths_blob is not None:
                _ndim, has_null, _oid, rows, _lower = np.frombuffer(lengths_blob, dtype=">i4", count=5)
                if rows and not has_null:
                    out[col.name] = int(np.frombuffer(lengths_blob, dtype=">i4", count=1, offset=_HEADER + 4)[0])
                else:
                    out[col.name] = 0
            else:
                out[col.name] = 0
        i += col.n_blobs
    return out
