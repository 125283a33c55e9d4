"""Decoding one batch's wire bytes straight into fixed-shape numpy arrays, with nothing silently lost.

The batch statement (see :mod:`pgprefetch.pg.session`) returns one row: the number of rows each sample
returned, then, per result column, the samples' PostgreSQL *binary* arrays (``array_send``) back to back,
which :mod:`pgprefetch.decode.wire` views with numpy; the big-endian values land in the batch buffer with one
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

import numpy as np

from pgprefetch.config.model import N_ROWS
from pgprefetch.decode.blobs import decode_blobs
from pgprefetch.decode.casts import holding_dtype, misfit_after, misfit_before
from pgprefetch.decode.layout import BatchLayout, FieldLayout, null_hint
from pgprefetch.pg.columns import WIRE, Column
from pgprefetch.pg.statement import Fetched

_UNITS = {
    "date": " (days since 1970-01-01)",
    "timestamp": " (µs since 1970-01-01)",
    "timestamptz": " (µs since 1970-01-01)",
}


def decode(layout: BatchLayout, blobs: Fetched, keys: np.ndarray, out: dict[str, np.ndarray]) -> None:
    """Fill ``out`` with the batch whose samples have ``keys`` (shape ``(n_key_columns, n)``).

    Raises:
        SampleError: a sample returned the wrong number of rows, a NULL, an array of the wrong length,
            or a value its field's dtype cannot hold.
    """
    decoded = decode_blobs(layout, blobs, keys)
    fill(layout, decoded.values, decoded.masks, keys, out, lengths=decoded.lengths, n_rows=decoded.n_rows)


def fill(
    layout: BatchLayout,
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
    if n_rows is not None:
        out[N_ROWS][:n] = n_rows
    for f in layout.fields:
        if f.config.transform is not None:  # its transform fills it (pgprefetch.write.transform)
            continue
        target = out[f.name][:n].reshape(n * layout.rows, len(f.columns), f.array_length)
        mask_out = out[f.config.null_mask][:n].reshape(target.shape) if f.config.null_mask else None
        block = _one_block(f, values)
        if block is not None:  # the field's columns are one row-major block, in order: cast in one copy
            with np.errstate(over="ignore", invalid="ignore"):
                np.copyto(target[:, :, 0], block, casting="unsafe")
        for j, col in enumerate(f.columns):
            _cast_column(layout, f, col, values[col], masks.get(col), keys, target[:, j, :], copy=block is None)
            _fill_nulls(
                layout, f, col, masks.get(col), keys, target[:, j, :], None if mask_out is None else mask_out[:, j, :]
            )
        if f.config.max_length is not None or n_rows is not None:
            _pad(layout, f, target, keys, lengths or {}, n_rows, out)


def _cast_column(
    layout: BatchLayout,
    f: FieldLayout,
    col: Column,
    values: np.ndarray,
    mask: np.ndarray | None,
    keys: np.ndarray,
    target: np.ndarray,
    *,
    copy: bool,
) -> None:
    """Check and cast one column's values into ``target`` (``copy`` False: the field's block already did).

    A categorical code -1 outside a NULL is a value outside the list; a safe cast refuses what the dtype
    cannot hold, before the cast (a wrapped value) and after it (a float become infinite).
    """
    per_sample = layout.rows
    v = values.reshape(target.shape[0], f.array_length)
    offset = WIRE[col.pg_type][1] if col.vocabulary is None and not col.is_bytes else 0
    if offset:
        v = v.astype(np.int64) + offset
    if col.vocabulary is not None:
        unknown = v[:, 0] < 0 if mask is None else (v[:, 0] < 0) & ~mask
        if unknown.any():
            sample = int(np.flatnonzero(unknown)[0]) // per_sample
            raise layout.unknown(keys, sample, f, col)
    if f.config.cast == "safe":
        _check_fits(layout, v, f, col, keys, per_sample * f.array_length)
    if copy:
        with np.errstate(over="ignore", invalid="ignore"):  # judged by the checks, not by a warning
            np.copyto(target, v, casting="unsafe")
    if f.config.cast == "safe":
        _check_fits(layout, v, f, col, keys, per_sample * f.array_length, out=target)


def _fill_nulls(
    layout: BatchLayout,
    f: FieldLayout,
    col: Column,
    mask: np.ndarray | None,
    keys: np.ndarray,
    target: np.ndarray,
    mask_out: np.ndarray | None,
) -> None:
    """Put the field's NULL policy where the column is NULL: its mask and fill value, or the error it asks for."""
    if mask is None:
        if mask_out is not None:
            mask_out[:] = False
        return
    if mask_out is None:  # another field's policy made the column nullable; this one's is "error"
        if mask.any():
            sample = int(np.flatnonzero(mask)[0]) // layout.rows
            message = f"field {f.name}, column {col.name} {_nulls(int(mask.sum()))}{null_hint(f.config, col)}"
            raise layout.sample_error(keys, sample, message)
        return
    mask_out[:, 0] = mask
    target[:, 0][mask] = np.nan if f.config.null == "nan" else f.config.null


def _pad(
    layout: BatchLayout,
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
    if (length_array := f.config.length_array) is not None:  # (a field with max_length)
        length = _kept(layout, f, keys, lengths)
        for col in f.columns[1:]:
            differs = np.flatnonzero(lengths[col] != length)
            if differs.size:
                row = int(differs[0])
                raise layout.sample_error(
                    keys,
                    row // layout.rows,
                    f"field {f.name}: column {f.columns[0].name} has {length[row]} elements and {col.name} "
                    f"{lengths[col][row]}; the columns of a field share one length",
                )
        out[length_array][:n] = length.reshape(out[length_array][:n].shape)
    # Padding arrives as zeros, cast to zero, unless an epoch offset moved it (dates, timestamps).
    if f.config.pad == 0 and not any(WIRE.get(c.pg_type, ("", 0))[1] for c in f.columns):
        return
    empty = np.zeros(target.shape[::2], dtype=bool)  # (n * rows, length): where padding goes
    if length is not None:
        empty |= np.arange(target.shape[2]) >= length[:, None]
    if n_rows is not None:
        empty |= (np.arange(layout.rows) >= n_rows[:, None]).reshape(-1, 1)
    target.transpose(0, 2, 1)[empty] = f.config.pad


def _kept(layout: BatchLayout, f: FieldLayout, keys: np.ndarray, lengths: dict[Column, np.ndarray]) -> np.ndarray:
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
            raise layout.sample_error(
                keys,
                row // layout.rows,
                f"field {f.name}, column {col.name} has {lengths[col][row]} {unit}, more than max_length "
                f'{limit}; [fields.{f.name}] truncate = "right" or "left" keeps that many',
            )
        if over.size:
            lengths[col] = np.minimum(lengths[col], limit)
    return lengths[f.columns[0]]


def _one_block(f: FieldLayout, values: dict[Column, np.ndarray]) -> np.ndarray | None:
    """The field's columns' values as one ``(rows, k)`` array, if they are the columns of a row-major block.

    Scan mode gathers a run of columns as one row-major block (:mod:`pgprefetch.write.scan.table`), and a
    field over that run (a feature vector of ``real`` columns) is then one contiguous cast into its
    ``(n, k)`` place instead of ``k`` strided ones. Only exact views qualify (column ``j`` the ``j``-th
    value of each row), so the copy is the one the columns would make; None otherwise.
    """
    k = len(f.columns)
    first = values[f.columns[0]]
    item = first.itemsize
    if f.array_length != 1 or k < 2 or first.ndim != 1 or first.strides != (k * item,) or first.base is None:
        return None
    start = first.__array_interface__["data"][0]
    for j, col in enumerate(f.columns):
        v = values[col]
        if col.vocabulary is not None or col.is_bytes or WIRE[col.pg_type][1]:  # each of these is cast on its own
            return None
        if v.base is not first.base or v.dtype != first.dtype or v.shape != first.shape or v.strides != first.strides:
            return None
        if j and v.__array_interface__["data"][0] != start + j * item:
            return None
    return np.lib.stride_tricks.as_strided(first, (first.shape[0], k), (k * item, item), writeable=False)


def _check_fits(
    layout: BatchLayout,
    v: np.ndarray,
    f: FieldLayout,
    col: Column,
    keys: np.ndarray,
    per_sample: int,
    *,
    out: np.ndarray | None = None,
) -> None:
    """Raise for the first value of ``v`` that does not fit: before the cast, or after it into ``out``."""
    bad = misfit_before(v, f.dtype) if out is None else misfit_after(v, out, f.dtype)
    if bad is None:
        return
    index, why = bad
    value = v.reshape(-1)[index]
    shown = repr(float(value)) if v.dtype.kind == "f" else str(int(value))
    unit = _UNITS.get(col.pg_type, "") if col.vocabulary is None else ""
    advice = f'set [fields.{f.name}] dtype = "{holding_dtype(value.item(), f.dtype)}" to hold it'
    if f.dtype.kind == "f":  # the one lossy cast with a meaning: too large for the float is infinity
        advice += ', or cast = "unsafe" to store it as infinity'
    raise layout.sample_error(
        keys,
        index // per_sample,
        f"field {f.name}, column {col.name} value {shown}{unit} does not fit {f.dtype.name}{why}; {advice}",
    )


def _nulls(count: int) -> str:
    return f"is NULL ({count} NULL{'s' if count != 1 else ''} in this batch)"
