"""Decoding one batch's wire bytes straight into fixed-shape numpy arrays.

The batch statement (see :mod:`pgprefetch.source`) returns one row: the number of rows each sample
returned, then, per result column, the samples' PostgreSQL *binary* arrays (``array_send``) back to
back. A binary array of a fixed-width type is a 20-byte header followed by ``(int32 length, value)``
pairs, so once every sample is known to have ``rows`` rows, numpy views the whole column as a structured
array and the big-endian values land in the batch buffer with one vectorised cast: no Python object per
value.

A fixed-length array column (``real[16]``) arrives as each row's ``array_send`` bytes back to back, plus
per sample an ``int4`` array of the rows' ``cardinality``; once every length is checked, the rows are
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

    def allocate(self, size: int) -> dict[str, np.ndarray]:
        """Zeroed batch buffers, one per field, to be filled by :meth:`decode` (and reused)."""
        return {f.name: np.zeros((size, *f.sample_shape), dtype=f.dtype) for f in self.fields}

    def decode(self, blobs: Sequence[bytes | None], keys: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Fill ``out`` with the batch whose samples have ``keys`` (shape ``(n_key_columns, n)``).

        Raises:
            SampleError: a sample returned the wrong number of rows, a NULL or an array of the wrong length.
        """
        n = keys.shape[1]
        values = self._rows_flat(blobs, keys) if self.rows == 1 else self._rows_grouped(blobs, keys)
        for f in self.fields:
            target = out[f.name][:n].reshape(n * self.rows, len(f.columns), f.array_length)
            for j, col in enumerate(f.columns):
                v = values[col.name].reshape(n * self.rows, f.array_length)
                offset = _WIRE[col.pg_type][1]
                if offset:
                    v = v.astype(np.int64) + offset
                np.copyto(target[:, j, :], v, casting="unsafe")

    def _rows_grouped(self, blobs: Sequence[bytes | None], keys: np.ndarray) -> dict[str, np.ndarray]:
        """Decode the statement shape for ``rows > 1``: row counts, then per-sample arrays per column."""
        n = keys.shape[1]
        counts = _counts(blobs[0], n)
        wrong = np.flatnonzero(counts != self.rows)
        if wrong.size:
            bad = int(wrong[0])
            raise self._error(keys, bad, f"returned {counts[bad]} rows, expected {self.rows} ([samples] rows)")
        values: dict[str, np.ndarray] = {}
        i = 1
        for col in self.columns:
            try:
                if col.is_array:
                    lengths = _scalars(blobs[i + 1], np.dtype(">i4"), n, self.rows)
                    try:
                        values[col.name] = _array_rows(blobs[i], lengths, col.wire, self._length(col))
                    except _BadSample as e:  # e.sample counts rows here
                        raise _BadSample(e.sample // self.rows, str(e)) from None
                else:
                    values[col.name] = _scalars(blobs[i], col.wire, n, self.rows)
            except _BadSample as e:
                raise self._error(keys, e.sample, f"{self._field_of(col)}column {col.name} {e}") from None
            i += col.n_blobs
        return values

    def _rows_flat(self, blobs: Sequence[bytes | None], keys: np.ndarray) -> dict[str, np.ndarray]:
        """Decode the statement shape for ``rows = 1``: one array per column over the batch, plus ordinals."""
        n = keys.shape[1]
        ordinals = _flat(blobs[0], np.dtype(">i4")).astype(np.int64)
        counts = np.bincount(ordinals - 1, minlength=n)[:n] if ordinals.size else np.zeros(n, np.int64)
        wrong = np.flatnonzero(counts != 1)
        if wrong.size or ordinals.size != n:
            bad = int(wrong[0]) if wrong.size else 0
            raise self._error(keys, bad, f"returned {counts[bad]} rows, expected 1 ([samples] rows)")
        # Rows arrive in key order; should a plan ever reorder them, sorting by ordinal restores it.
        order = None if np.all(ordinals[1:] > ordinals[:-1]) else np.argsort(ordinals)
        values: dict[str, np.ndarray] = {}
        i = 1
        for col in self.columns:
            try:
                if col.is_array:
                    lengths = _flat(blobs[i + 1], np.dtype(">i4"))
                    v = _array_rows(blobs[i], lengths, col.wire, self._length(col))
                else:
                    v = _flat(blobs[i], col.wire)
            except _BadSample as e:  # e.sample is the row as it arrived
                sample = int(ordinals[e.sample]) - 1
                raise self._error(keys, sample, f"{self._field_of(col)}column {col.name} {e}") from None
            values[col.name] = v if order is None else v[order]
            i += col.n_blobs
        return values

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


class _BadSample(Exception):
    """A value of sample ``sample`` (its index in the batch) cannot be decoded; the message says why."""

    def __init__(self, sample: int, message: str) -> None:
        super().__init__(message)
        self.sample = sample


def _counts(blob: bytes | None, n: int) -> np.ndarray:
    """The rows each of the batch's ``n`` samples returned (an int4 binary array)."""
    if blob is None:
        return np.zeros(n, dtype=np.int64)
    rec = np.frombuffer(blob, dtype=[("len", ">i4"), ("v", ">i4")], offset=_HEADER, count=n)
    return rec["v"].astype(np.int64)


def _scalars(blob: bytes | None, wire: np.dtype, n: int, rows: int) -> np.ndarray:
    """A scalar column: ``n`` per-sample binary arrays of ``rows`` values each, back to back -> ``(n * rows,)``."""
    sample = np.dtype([("head", ">i4", (5,)), ("e", [("len", ">i4"), ("v", wire)], (rows,))])
    if blob is None or len(blob) != n * sample.itemsize:  # a NULL element shortens its sample's array
        raise _BadSample(_first_with_null(blob or b"", n, wire.itemsize), "is NULL")
    rec = np.frombuffer(blob, dtype=sample, count=n)
    nulls = np.flatnonzero(rec["head"][:, 1])
    if nulls.size:
        raise _BadSample(int(nulls[0]), "is NULL")
    return rec["e"]["v"].reshape(n * rows)


def _first_with_null(blob: bytes, n: int, width: int) -> int:
    """Walk the per-sample arrays to the first one flagged as holding a NULL (error path only)."""
    pos = 0
    for s in range(n):
        if pos + _HEADER > len(blob):
            return s
        _ndim, has_null, _oid, length, _lower = np.frombuffer(blob, dtype=">i4", count=5, offset=pos)
        if has_null:
            return s
        pos += _HEADER + int(length) * (4 + width)
    return 0


def _flat(blob: bytes | None, wire: np.dtype) -> np.ndarray:
    """The values of one binary array of a fixed-width type; a NULL raises with its position."""
    if blob is None:
        return np.empty(0, dtype=wire)
    _ndim, has_null, _oid, length, _lower = np.frombuffer(blob, dtype=">i4", count=5)
    if has_null:
        raise _BadSample(_first_null(blob, int(length)), "is NULL")
    return np.frombuffer(blob, dtype=[("len", ">i4"), ("v", wire)], offset=_HEADER, count=length)["v"]


def _first_null(blob: bytes, length: int) -> int:
    """Walk the elements of a binary array with NULLs to the first one (error path only)."""
    pos = _HEADER
    for i in range(length):
        size = int.from_bytes(blob[pos : pos + 4], "big", signed=True)
        if size < 0:
            return i
        pos += 4 + size
    return 0


def _array_rows(blob: bytes | None, lengths: np.ndarray, wire: np.dtype, width: int) -> np.ndarray:
    """Rows of a fixed-length array column: each row's ``array_send`` back to back -> ``(rows, width)``.

    ``lengths`` holds each row's ``cardinality``; errors raise with the row's position.
    """
    wrong = np.flatnonzero(lengths != width)
    if wrong.size:
        bad = int(wrong[0])
        raise _BadSample(bad, f"has {lengths[bad]} elements, expected {width} (as in the first sample)")
    element = np.dtype([("len", ">i4"), ("v", wire)])
    row = np.dtype([("head", ">i4", (5,)), ("e", element, (width,))])
    total = lengths.size
    if blob is None or len(blob) != total * row.itemsize:
        raise _BadSample(
            _first_irregular(blob or b"", total, row.itemsize), "has a NULL element or more than one dimension"
        )
    rec = np.frombuffer(blob, dtype=row, count=total)
    irregular = np.flatnonzero((rec["head"][:, 0] != 1) | (rec["head"][:, 1] != 0))
    if irregular.size:
        raise _BadSample(int(irregular[0]), "has a NULL element or more than one dimension")
    return rec["e"]["v"]


def _first_irregular(blob: bytes, rows: int, size: int) -> int:
    """The first row whose array is not a plain one-dimensional array without NULLs (error path only)."""
    pos = 0
    for i in range(rows):
        if pos + 8 > len(blob):
            return i
        ndim, has_null = np.frombuffer(blob, dtype=">i4", count=2, offset=pos)
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
