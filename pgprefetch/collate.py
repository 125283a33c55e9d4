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
from .blobs import Fetched, decode_blobs
from .casts import holding_dtype, misfit_after, misfit_before
from .columns import WIRE, Column
from .config import N_ROWS, FieldConfig
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
    rows: int  # rows per sample; with variable_rows, the most a sample may have (padded to them)
    keys: KeyColumns  # how errors name a sample
    variable_rows: bool = False  # [samples] max_rows: 1..rows rows per sample, counted in the n_rows array
    row_truncate: str = "error"
    row_wise: bool = False  # the batch statement returns a row per sample (statement.row_wise)

    @classmethod
    def build(
        cls,
        fields: Sequence[FieldConfig],
        columns: Sequence[Column],
        by_field: dict[str, tuple[Column, ...]],
        array_lengths: dict[Column, int],
        rows: int,
        keys: KeyColumns,
        *,
        variable_rows: bool = False,
        row_truncate: str = "error",
        row_wise: bool = False,
    ) -> BatchLayout:
        """Combine the config's fields with the columns' types and array lengths (from the first sample).

        ``columns`` must be in the order the batch statement sends them (see :func:`plan_columns`).
        """
        layouts = []
        for f in fields:
            cols = by_field[f.name]
            if f.max_length is not None:
                if len({c.is_array for c in cols}) != 1 or not all(c.is_array or c.is_bytes for c in cols):
                    kinds = ", ".join(f"{c.name}: {'array' if c.is_array else c.pg_type}" for c in cols)
                    raise ConfigError(
                        f"[fields.{f.name}] max_length: needs array columns, or text or bytea ones, not a mix "
                        f"or scalars ({kinds})"
                    )
                n = f.max_length
            else:
                lengths = {array_lengths[c] if c.is_array else 0 for c in cols}
                if len(lengths) != 1:
                    raise ConfigError(
                        f"[fields.{f.name}] columns: mixes scalars and arrays, or arrays of different lengths "
                        f"({', '.join(f'{c.name}: {array_lengths.get(c, 1)}' for c in cols)})"
                    )
                n = lengths.pop()
            shape = (*([rows] if rows > 1 else []), *([len(cols)] if len(cols) > 1 else []), *([n] if n else []))
            layouts.append(FieldLayout(f, np.dtype(f.dtype), cols, shape, max(n, 1)))
        return cls(tuple(columns), tuple(layouts), rows, keys, variable_rows, row_truncate, row_wise)

    def arrays(self) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
        """Every array a batch fills: (name, dtype, per-sample shape), each field then its NULL mask."""
        out = []
        per_row = (self.rows,) if self.rows > 1 else ()
        for f in self.fields:
            out.append((f.name, f.dtype, f.sample_shape))
            if f.config.null_mask:
                out.append((f.config.null_mask, np.dtype(bool), f.sample_shape))
            if f.config.length_array:
                out.append((f.config.length_array, np.dtype(np.int32), per_row))
        if self.variable_rows:
            out.append((N_ROWS, np.dtype(np.int32), ()))
        return out

    @property
    def sample_bytes(self) -> int:
        """Bytes one sample takes in the batch buffers (the keys not counted)."""
        return sum(dtype.itemsize * math.prod(shape) for _, dtype, shape in self.arrays())

    def allocate(self, size: int) -> dict[str, np.ndarray]:
        """Zeroed batch buffers, one per array, to be filled by :meth:`decode` (and reused)."""
        return {name: np.zeros((size, *shape), dtype=dtype) for name, dtype, shape in self.arrays()}

    def decode(self, blobs: Fetched, keys: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Fill ``out`` with the batch whose samples have ``keys`` (shape ``(n_key_columns, n)``).

        Raises:
            SampleError: a sample returned the wrong number of rows, a NULL, an array of the wrong length,
                or a value its field's dtype cannot hold.
        """
        decoded = decode_blobs(self, blobs, keys)
        self.fill(decoded.values, decoded.masks, keys, out, lengths=decoded.lengths, n_rows=decoded.n_rows)

    def fill(
        self,
        values: dict[Column, np.ndarray],
        masks: dict[Column, np.ndarray],
        keys: np.ndarray,
        out: dict[str, np.ndarray],
        *,
        lengths: dict[Column, np.ndarray] | None = None,
        n_rows: np.ndarray | None = None,
    ) -> None:
        """Cast the batch's column values (``(n * rows, ...)`` each, wire dtypes) into ``out``, checking each.

        Both modes end here: the batch statement's decoded blobs, and the rows scan mode gathered. Fields
        with ``max_length`` come with each row's kept ``lengths``, variable rows with ``n_rows``; padding
        gets the field's ``pad``.
        """
        n = keys.shape[1]
        per_sample = self.rows
        if n_rows is not None:
            out[N_ROWS][:n] = n_rows
        for f in self.fields:
            target = out[f.name][:n].reshape(n * self.rows, len(f.columns), f.array_length)
            mask_out = out[f.config.null_mask][:n].reshape(target.shape) if f.config.null_mask else None
            for j, col in enumerate(f.columns):
                v = values[col].reshape(n * self.rows, f.array_length)
                offset = WIRE[col.pg_type][1] if col.vocabulary is None and not col.is_bytes else 0
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
                        raise self.sample_error(keys, sample, message)
                    continue
                mask_out[:, j, 0] = mask
                fill = np.nan if f.config.null == "nan" else f.config.null
                target[:, j, 0][mask] = fill
            if f.config.max_length is not None or n_rows is not None:
                self._pad(f, target, keys, lengths or {}, n_rows, out)

    def _pad(
        self,
        f: FieldLayout,
        target: np.ndarray,
        keys: np.ndarray,
        lengths: dict[Column, np.ndarray],
        n_rows: np.ndarray | None,
        out: dict[str, np.ndarray],
    ) -> None:
        """Record a padded field's lengths (one for all its columns) and put ``pad`` where nothing is."""
        n = keys.shape[1]
        length = None
        if f.config.max_length is not None:
            length = self._kept(f, keys, lengths)
            for col in f.columns[1:]:
                differs = np.flatnonzero(lengths[col] != length)
                if differs.size:
                    row = int(differs[0])
                    raise self.sample_error(
                        keys,
                        row // self.rows,
                        f"field {f.name}: column {f.columns[0].name} has {length[row]} elements and {col.name} "
                        f"{lengths[col][row]}; the columns of a field share one length",
                    )
            out[f.config.length_array][:n] = length.reshape(out[f.config.length_array][:n].shape)  # type: ignore[index]
        # Padding arrives as zeros, cast to zero, unless an epoch offset moved it (dates, timestamps).
        if f.config.pad == 0 and not any(WIRE.get(c.pg_type, ("", 0))[1] for c in f.columns):
            return
        empty = np.zeros(target.shape[::2], dtype=bool)  # (n * rows, length): where padding goes
        if length is not None:
            empty |= np.arange(target.shape[2]) >= length[:, None]
        if n_rows is not None:
            empty |= (np.arange(self.rows) >= n_rows[:, None]).reshape(-1, 1)
        target.transpose(0, 2, 1)[empty] = f.config.pad

    def _kept(self, f: FieldLayout, keys: np.ndarray, lengths: dict[Column, np.ndarray]) -> np.ndarray:
        """The kept length of each row of a field with ``max_length``, its columns' lengths agreeing.

        Query mode cuts arrays on the client, so its lengths are kept ones already; scan mode's server
        cuts them and sends their whole length, which is checked against ``max_length`` here.
        """
        limit = f.config.max_length
        assert limit is not None
        for col in f.columns:
            over = np.flatnonzero(lengths[col] > limit)
            if over.size and f.config.truncate == "error":
                row = int(over[0])
                unit = "bytes" if col.is_bytes else "elements"
                raise self.sample_error(
                    keys,
                    row // self.rows,
                    f"field {f.name}, column {col.name} has {lengths[col][row]} {unit}, more than max_length "
                    f'{limit}; [fields.{f.name}] truncate = "right" or "left" keeps that many',
                )
            if over.size:
                lengths[col] = np.minimum(lengths[col], limit)
        return lengths[f.columns[0]]

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
        advice = f'set [fields.{f.name}] dtype = "{holding_dtype(value.item(), f.dtype)}" to hold it'
        if f.dtype.kind == "f":  # the one lossy cast with a meaning: too large for the float is infinity
            advice += ', or cast = "unsafe" to store it as infinity'
        raise self.sample_error(
            keys,
            index // per_sample,
            f"field {f.name}, column {col.name} value {shown}{unit} does not fit {f.dtype.name}{why}; {advice}",
        )

    def array_length(self, col: Column) -> int:
        """Elements per row of array column ``col`` (its field's length)."""
        for f in self.fields:
            if col in f.columns:
                return f.array_length
        raise KeyError(col.name)

    def decode_hint(self, col: Column, e: wire.BadSample) -> str:
        """The decoding error, with the way to keep NULLs when that is what it is about."""
        owner = next((f for f in self.fields if col in f.columns), None)
        keep = owner is not None and not col.is_array and str(e).startswith("is NULL")
        return f"{e}{_null_hint(owner.config)}" if keep else str(e)  # type: ignore[union-attr]

    def column_label(self, col: Column) -> str:
        """``field <name>, `` for the fields reading ``col``: how an error names where it is."""
        names = [f.name for f in self.fields if col in f.columns]
        return f"field {', '.join(names)}, " if names else ""

    def sample_error(self, keys: np.ndarray, sample: int, message: str) -> SampleError:
        """The error for sample ``sample`` of a batch with ``keys``, naming its key."""
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
