"""Decoding one batch's wire bytes straight into fixed-shape numpy arrays, with nothing silently lost.

The batch statement (see :mod:`pgprefetch.source`) returns one row: the number of rows each sample
returned, then, per result column, the samples' PostgreSQL *binary* arrays (``array_send``) back to back,
which :mod:`pgprefetch.wire` views with numpy; the big-endian values land in the batch buffer with one
vectorised cast: no Python object per value.

A fixed-length array column (``real[16]``) arrives as each row's ``array_send`` bytes back to back, plus
per sample an ``int4`` array of the rows' ``cardinality``; once every length is checked, the rows are
fixed-size records too.

What the server sends is shaped by each field's options:

* ``null`` other than ``error``: the value arrives with NULL replaced by a placeholder (``coalesce``) and
  a boolean column ``value IS NULL`` beside it. The placeholder becomes the fill value (or NaN), and the
  mask is written as the field's ``<field>_null`` array.
* ``categories``: the server maps each value to its position in the list, a bind parameter
  (``array_position``), so the label never travels as text; -1 means "not in the list".
* ``cast = "safe"`` (the default): every value must fit the field's dtype. Integer overflow, a float
  overflowing to infinity, NaN or a fraction into an integer, and anything but 0/1 into ``bool`` are
  errors. The checks are vectorised (``min``/``max`` where the source range can exceed the target's).

Anything that does not fit (a NULL, a sample with the wrong number of rows, an array of the wrong
length, a value out of range) raises :class:`~pgprefetch.errors.SampleError` naming the sample's key, the
field and the column.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import wire
from .casts import misfit_after, misfit_before
from .columns import WIRE, Column
from .config import FieldConfig
from .errors import ConfigError, SampleError
from .keys import KeyColumns

_UNITS = {
    "date": " (days since 1970-01-01)",
    "timestamp": " (µs since 1970-01-01)",
    "timestamptz": " (µs since 1970-01-01)",
}


@dataclass(frozen=True)
class FieldLayout:
    """Where one field's columns go in its batch array, and what each value must satisfy."""

    config: FieldConfig
    dtype: np.dtype
    columns: tuple[Column, ...]
    sample_shape: tuple[int, ...]
    array_length: int  # elements per array value, 1 for scalar columns

    @property
    def name(self) -> str:
        """The field's name."""
        return self.config.name


class UnknownCategoryError(SampleError):
    """A categorical value is not in the field's list; the pipeline looks the value up to name it."""

    def __init__(self, message: str, key: tuple[object, ...], field: str, column: str) -> None:
        super().__init__(message)
        self.key, self.field, self.column = key, field, column


@dataclass(frozen=True)
class BatchLayout:
    """The decoding plan of a dump: result columns, fields, rows per sample and the key columns."""

    columns: tuple[Column, ...]
    fields: tuple[FieldLayout, ...]
    rows: int
    keys: KeyColumns  # how errors name a sample

    @classmethod
    def build(
        cls,
        fields: Sequence[FieldConfig],
        columns: Sequence[Column],
        by_field: dict[str, tuple[Column, ...]],
        array_lengths: dict[Column, int],
        rows: int,
        keys: KeyColumns,
    ) -> BatchLayout:
        """Combine the config's fields with the columns' types and array lengths (from the first sample).

        ``columns`` must be in the order the batch statement sends them (see :func:`plan_columns`).
        """
        layouts = []
        for f in fields:
            cols = by_field[f.name]
            lengths = {array_lengths[c] if c.is_array else 0 for c in cols}
            if len(lengths) != 1:
                raise ConfigError(
                    f"[fields.{f.name}] columns: mixes scalars and arrays, or arrays of different lengths "
                    f"({', '.join(f'{c.name}: {array_lengths.get(c, 1)}' for c in cols)})"
                )
            n = lengths.pop()
            shape = (*([rows] if rows > 1 else []), *([len(cols)] if len(cols) > 1 else []), *([n] if n else []))
            layouts.append(FieldLayout(f, np.dtype(f.dtype), cols, shape, max(n, 1)))
        return cls(columns=tuple(columns), fields=tuple(layouts), rows=rows, keys=keys)

    def arrays(self) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
        """Every array a batch fills: (name, dtype, per-sample shape), each field then its NULL mask."""
        out = []
        for f in self.fields:
            out.append((f.name, f.dtype, f.sample_shape))
            if f.config.null_mask:
                out.append((f.config.null_mask, np.dtype(bool), f.sample_shape))
        return out

    @property
    def sample_bytes(self) -> int:
        """Bytes one sample takes in the batch buffers (the keys not counted)."""
        return sum(dtype.itemsize * math.prod(shape) for _, dtype, shape in self.arrays())

    def allocate(self, size: int) -> dict[str, np.ndarray]:
        """Zeroed batch buffers, one per array, to be filled by :meth:`decode` (and reused)."""
        return {name: np.zeros((size, *shape), dtype=dtype) for name, dtype, shape in self.arrays()}

    def decode(self, blobs: Sequence[bytes | None], keys: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Fill ``out`` with the batch whose samples have ``keys`` (shape ``(n_key_columns, n)``).

        Raises:
            SampleError: a sample returned the wrong number of rows, a NULL, an array of the wrong length,
                or a value its field's dtype cannot hold.
        """
        values, masks = self._rows_flat(blobs, keys) if self.rows == 1 else self._rows_grouped(blobs, keys)
        self.fill(values, masks, keys, out)

    def fill(
        self,
        values: dict[Column, np.ndarray],
        masks: dict[Column, np.ndarray],
        keys: np.ndarray,
        out: dict[str, np.ndarray],
    ) -> None:
        """Cast the batch's column values (``(n * rows, ...)`` each, wire dtypes) into ``out``, checking each.

        Both modes end here: the batch statement's decoded blobs, and the rows scan mode gathered.
        """
        n = keys.shape[1]
        per_sample = self.rows
        for f in self.fields:
            target = out[f.name][:n].reshape(n * self.rows, len(f.columns), f.array_length)
            mask_out = out[f.config.null_mask][:n].reshape(target.shape) if f.config.null_mask else None
            for j, col in enumerate(f.columns):
                v = values[col].reshape(n * self.rows, f.array_length)
                offset = WIRE[col.pg_type][1] if col.vocabulary is None else 0
                if offset:
                    v = v.astype(np.int64) + offset
                mask = masks.get(col)
                if col.vocabulary is not None:
                    unknown = v[:, 0] < 0 if mask is None else (v[:, 0] < 0) & ~mask
                    if unknown.any():
                        sample = int(np.flatnonzero(unknown)[0]) // per_sample
                        raise self._unknown(keys, sample, f, col)
                if f.config.cast == "safe":
                    self._check_fits(v, f, col, keys, per_sample * f.array_length, pre=True)
                with np.errstate(over="ignore", invalid="ignore"):  # judged by the checks, not by a warning
                    np.copyto(target[:, j, :], v, casting="unsafe")
                if f.config.cast == "safe":
                    self._check_fits(v, f, col, keys, per_sample * f.array_length, pre=False, out=target[:, j, :])
                if mask is None:
                    if mask_out is not None:
                        mask_out[:, j, :] = False
                    continue
                if mask_out is None:  # another field's policy made the column nullable; this one's is "error"
                    if mask.any():
                        sample = int(np.flatnonzero(mask)[0]) // per_sample
                        message = f"field {f.name}, column {col.name} {_nulls(int(mask.sum()))}{_null_hint(f.config)}"
                        raise self._error(keys, sample, message)
                    continue
                mask_out[:, j, 0] = mask
                fill = np.nan if f.config.null == "nan" else f.config.null
                target[:, j, 0][mask] = fill

    def _check_fits(
        self,
        v: np.ndarray,
        f: FieldLayout,
        col: Column,
        keys: np.ndarray,
        per_sample: int,
        *,
        pre: bool,
        out: np.ndarray | None = None,
    ) -> None:
        bad = misfit_before(v, f.dtype) if pre else misfit_after(v, out, f.dtype)  # type: ignore[arg-type]
        if bad is None:
            return
        index, why = bad
        value = v.reshape(-1)[index]
        shown = repr(float(value)) if v.dtype.kind == "f" else str(int(value))
        unit = _UNITS.get(col.pg_type, "") if col.vocabulary is None else ""
        raise self._error(
            keys,
            index // per_sample,
            f"field {f.name}, column {col.name} value {shown}{unit} does not fit {f.dtype.name}{why}; "
            f'set [fields.{f.name}] cast = "unsafe" to accept lossy casts',
        )

    def _rows_grouped(
        self, blobs: Sequence[bytes | None], keys: np.ndarray
    ) -> tuple[dict[Column, np.ndarray], dict[Column, np.ndarray]]:
        """Decode the statement shape for ``rows > 1``: row counts, then per-sample arrays per column."""
        n = keys.shape[1]
        counts = wire.counts(blobs[0], n)
        wrong = np.flatnonzero(counts != self.rows)
        if wrong.size:
            bad = int(wrong[0])
            raise self._error(keys, bad, f"returned {counts[bad]} rows, expected {self.rows} ([samples] rows)")
        values: dict[Column, np.ndarray] = {}
        masks: dict[Column, np.ndarray] = {}
        i = 1
        for col in self.columns:
            try:
                if col.is_array:
                    lengths = wire.scalars(blobs[i + 1], np.dtype(">i4"), n, self.rows)
                    try:
                        values[col] = wire.array_rows(blobs[i], lengths, col.wire, self._length(col))
                    except wire.BadSample as e:  # e.sample counts rows here
                        raise wire.BadSample(e.sample // self.rows, str(e)) from None
                else:
                    values[col] = wire.scalars(blobs[i], col.wire, n, self.rows)
                if col.nullable:
                    masks[col] = wire.scalars(blobs[i + 1], np.dtype("?"), n, self.rows)
            except wire.BadSample as e:
                raise self._error(
                    keys, e.sample, f"{self._field_of(col)}column {col.name} {self._hint(col, e)}"
                ) from None
            i += col.n_blobs
        return values, masks

    def _rows_flat(
        self, blobs: Sequence[bytes | None], keys: np.ndarray
    ) -> tuple[dict[Column, np.ndarray], dict[Column, np.ndarray]]:
        """Decode the statement shape for ``rows = 1``: one array per column over the batch, plus ordinals."""
        n = keys.shape[1]
        ordinals = wire.flat(blobs[0], np.dtype(">i4")).astype(np.int64)
        counts = np.bincount(ordinals - 1, minlength=n)[:n] if ordinals.size else np.zeros(n, np.int64)
        wrong = np.flatnonzero(counts != 1)
        if wrong.size or ordinals.size != n:
            bad = int(wrong[0]) if wrong.size else 0
            raise self._error(keys, bad, f"returned {counts[bad]} rows, expected 1 ([samples] rows)")
        # Rows arrive in key order; should a plan ever reorder them, sorting by ordinal restores it.
        order = None if np.all(ordinals[1:] > ordinals[:-1]) else np.argsort(ordinals)
        values: dict[Column, np.ndarray] = {}
        masks: dict[Column, np.ndarray] = {}
        i = 1
        for col in self.columns:
            try:
                if col.is_array:
                    lengths = wire.flat(blobs[i + 1], np.dtype(">i4"))
                    v = wire.array_rows(blobs[i], lengths, col.wire, self._length(col))
                else:
                    v = wire.flat(blobs[i], col.wire)
                if col.nullable:
                    m = wire.flat(blobs[i + 1], np.dtype("?"))
                    masks[col] = m if order is None else m[order]
            except wire.BadSample as e:  # e.sample is the row as it arrived
                sample = int(ordinals[e.sample]) - 1
                raise self._error(
                    keys, sample, f"{self._field_of(col)}column {col.name} {self._hint(col, e)}"
                ) from None
            values[col] = v if order is None else v[order]
            i += col.n_blobs
        return values, masks

    def _length(self, col: Column) -> int:
        for f in self.fields:
            if col in f.columns:
                return f.array_length
        raise KeyError(col.name)

    def _hint(self, col: Column, e: wire.BadSample) -> str:
        """The decoding error, with the way to keep NULLs when that is what it is about."""
        owner = next((f for f in self.fields if col in f.columns), None)
        keep = owner is not None and not col.is_array and str(e).startswith("is NULL")
        return f"{e}{_null_hint(owner.config)}" if keep else str(e)  # type: ignore[union-attr]

    def _field_of(self, col: Column) -> str:
        names = [f.name for f in self.fields if col in f.columns]
        return f"field {', '.join(names)}, " if names else ""

    def _error(self, keys: np.ndarray, sample: int, message: str) -> SampleError:
        return SampleError(f"sample ({self.keys.show(keys[:, sample])}): {message}")

    def _unknown(self, keys: np.ndarray, sample: int, f: FieldLayout, col: Column) -> UnknownCategoryError:
        message = (
            f"sample ({self.keys.show(keys[:, sample])}): field {f.name}, column {col.name} "
            f"has a value that is not in [fields.{f.name}] categories"
        )
        return UnknownCategoryError(message, self.keys.values(keys[:, sample]), f.name, col.name)


def _null_hint(f: FieldConfig) -> str:
    keep = '"nan" or a fill value' if f.dtype.startswith("float") else "a fill value"
    return f"; set [fields.{f.name}] null = {keep} to keep NULLs"


def _nulls(count: int) -> str:
    return f"is NULL ({count} NULL{'s' if count != 1 else ''} in this batch)"


def array_lengths(layout_columns: Sequence[Column], blobs: Sequence[bytes | None]) -> dict[Column, int]:
    """The element count of each array column in the first row of a batch (fixes the field shapes)."""
    out = {}
    i = 1
    for col in layout_columns:
        if col.is_array:
            out[col] = wire.first_length(blobs[i + 1])
        i += col.n_blobs
    return out
