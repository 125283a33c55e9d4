"""The decoding plan of a dump: which result columns make which field, in what shape and dtype.

A :class:`BatchLayout` is fixed once per epoch (the query mode from its first batch's array lengths, the
scan mode from the table it read) and then only read: :mod:`pgprefetch.decode.collate` fills batch buffers
by it, and every decoding error names its sample through it (:meth:`BatchLayout.sample_error`), so that
an error says which key, which field and which column, in both modes alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import N_ROWS, FieldConfig
from pgprefetch.decode import wire
from pgprefetch.errors import ConfigError, SampleError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.columns import Column


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

    @property
    def column_names(self) -> tuple[str, ...]:
        """The names of its columns; a transform's output is one column of the field's own name."""
        return tuple(c.name for c in self.columns) if self.config.transform is None else (self.name,)


class UnknownCategoryError(SampleError):
    """A categorical value is not in the field's list; the pipeline looks the value up to name it.

    ``sample`` is how the message names the sample (``sample (id=4)``), kept apart: a key's value may hold
    a colon (a timestamp), so the message cannot be split to find it again.
    """

    def __init__(self, message: str, sample: str, key: tuple[object, ...], field: str, column: str) -> None:
        super().__init__(message)
        self.sample, self.key, self.field, self.column = sample, key, field, column

    def __reduce__(self) -> tuple[type[UnknownCategoryError], tuple[str, str, tuple[object, ...], str, str]]:
        """Pickled whole: a Ray part raises it in its worker, the driver names the value."""
        return type(self), (str(self), self.sample, self.key, self.field, self.column)


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
            if f.transform is not None:  # filled by its transform (pgprefetch.write.transform), not by columns
                shape = (f.max_length,) if f.max_length is not None else f.shape
                layouts.append(FieldLayout(f, np.dtype(f.dtype), (), shape, math.prod(shape)))
                continue
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
        """Zeroed batch buffers, one per array, for :func:`~pgprefetch.decode.collate.decode` to fill (and reuse)."""
        return {name: np.zeros((size, *shape), dtype=dtype) for name, dtype, shape in self.arrays()}

    def array_length(self, col: Column) -> int:
        """Elements per row of array column ``col`` (its field's length)."""
        for f in self.fields:
            if col in f.columns:
                return f.array_length
        raise KeyError(col.name)

    def decode_hint(self, col: Column, e: wire.BadSample) -> str:
        """The decoding error, with the way to keep NULLs when that is what it is about."""
        owner = next((f for f in self.fields if col in f.columns), None)
        if owner is None or (col.is_array and owner.config.max_length is None) or not str(e).startswith("is NULL"):
            return str(e)
        return f"{e}{null_hint(owner.config, col)}"

    def column_label(self, col: Column) -> str:
        """``field <name>, `` for the fields reading ``col``: how an error names where it is."""
        names = [f.name for f in self.fields if col in f.columns]
        return f"field {', '.join(names)}, " if names else ""

    def bad_value(self, keys: np.ndarray, sample: int, col: Column, e: wire.BadSample) -> SampleError:
        """The error for a value of ``col`` that does not decode, naming its sample, field and column."""
        return self.sample_error(keys, sample, f"{self.column_label(col)}column {col.name} {self.decode_hint(col, e)}")

    def sample_error(self, keys: np.ndarray, sample: int, message: str) -> SampleError:
        """The error for sample ``sample`` of a batch with ``keys``, naming its key."""
        return SampleError(f"sample ({self.keys.show(keys[:, sample])}): {message}")

    def unknown(self, keys: np.ndarray, sample: int, f: FieldLayout, col: Column) -> UnknownCategoryError:
        """The error for a value outside ``f``'s category list (the dump looks the value up to name it)."""
        named = f"sample ({self.keys.show(keys[:, sample])})"
        message = f"{named}: field {f.name}, column {col.name} has a value that is not in [fields.{f.name}] categories"
        return UnknownCategoryError(message, named, self.keys.values(keys[:, sample]), f.name, col.name)


def null_hint(f: FieldConfig, col: Column | None = None) -> str:
    """How to keep NULLs of ``col`` in ``f`` (the advice a NULL error ends with): the fix that works.

    A null policy fills a scalar; a field of whole values (``max_length``: arrays, text, bytea) cannot take
    one, so its NULLs are turned into empty values in the query instead. A category code's fill must be
    no code: -1 (a signed dtype), or a value past the list.
    """
    if f.max_length is not None and col is not None:
        return f"; {empty_for_null(col)}"
    if f.categories is not None:
        fill = "-1" if f.dtype != "uint8" else "255"
        return f"; set [fields.{f.name}] null = {fill} to code NULLs as {fill} (a mask records them)"
    keep = '"nan" or a fill value' if f.dtype.startswith("float") else "a fill value"
    return f"; set [fields.{f.name}] null = {keep} to keep NULLs"


def empty_for_null(col: Column) -> str:
    """The advice for a NULL text, bytea or array read whole: select it as an empty value."""
    empty = "''" if col.is_bytes else "'{}'"
    return (
        f"select coalesce({col.name}, {empty}) AS {col.name} in the query (scan mode: in a SELECT as "
        "[samples] table) to read NULL as empty (length 0)"
    )
