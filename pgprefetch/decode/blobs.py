"""The batch statement's binary results, decoded into each column's values (not yet cast).

The batch statement (:mod:`pgprefetch.pg.statement`) returns one row: the number of rows each sample
returned, then per result column its values and, for arrays, text and bytea, each row's length (and for a
nullable column its NULL mask). With ``rows = 1`` each is one array over the whole batch, beside the rows'
key ordinals; otherwise each sample's arrays come back to back. A row-wise statement (values of any
length) returns a row per sample instead: its key ordinal, then each column's binary value.
:func:`~pgprefetch.decode.collate.decode` casts what this returns into the batch buffers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from pgprefetch.decode import ragged, wire
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.pg.columns import Column
from pgprefetch.pg.statement import Fetched


@dataclass
class Decoded:
    """One batch's column values as decoded (``(n * rows, ...)`` each), before the cast into the buffers."""

    values: dict[Column, np.ndarray] = field(default_factory=dict)
    masks: dict[Column, np.ndarray] = field(default_factory=dict)  # NULL masks of nullable columns
    lengths: dict[Column, np.ndarray] = field(default_factory=dict)  # kept lengths, fields with max_length
    n_rows: np.ndarray | None = None  # each sample's kept row count, with max_rows


def decode_blobs(layout: BatchLayout, fetched: Fetched, keys: np.ndarray) -> Decoded:
    """The values of every column of a batch whose samples have ``keys``; errors name the sample."""
    decoded = Decoded()
    # Which of Fetched's two shapes the statement returns is the layout's to say, not the type's.
    if layout.row_wise:
        _rows_each(layout, cast("Sequence[Sequence[object]]", fetched), keys, decoded)
    elif layout.rows == 1 and not layout.variable_rows:
        _rows_flat(layout, cast("Sequence[bytes | None]", fetched), keys, decoded)
    else:
        _rows_grouped(layout, cast("Sequence[bytes | None]", fetched), keys, decoded)
    return decoded


def _rows_grouped(layout: BatchLayout, blobs: Sequence[bytes | None], keys: np.ndarray, d: Decoded) -> None:
    """Decode the statement shape for ``rows > 1``: row counts, then per-sample arrays per column."""
    n = keys.shape[1]
    counts = wire.counts(blobs[0], n)
    rows = layout.rows
    if layout.variable_rows:
        empty = np.flatnonzero(counts < 1)
        if empty.size:
            raise layout.sample_error(
                keys, int(empty[0]), f"returned 0 rows, expected 1 to {rows} ([samples] max_rows)"
            )
        try:
            keep, slots, d.n_rows = ragged.place_rows(counts, rows, layout.row_truncate)
        except wire.BadSample as e:
            # (the statement stops a sample at max_rows + 1 rows: how many more it has is not known)
            raise layout.sample_error(
                keys,
                e.sample,
                f"returned more rows than max_rows {rows}; "
                '[samples] truncate = "right" or "left" keeps max_rows of them',
            ) from None
    else:
        wrong = np.flatnonzero(counts != rows)
        if wrong.size:
            bad = int(wrong[0])
            count = f"more than {rows}" if counts[bad] > rows else str(counts[bad])  # stopped at rows + 1
            raise layout.sample_error(keys, bad, f"returned {count} rows, expected {rows} ([samples] rows)")
    ends = np.cumsum(counts)

    def per_row(blob: bytes | None, dtype: np.dtype) -> np.ndarray:  # one value per row, in order
        return ragged.groups(blob, counts, dtype) if layout.variable_rows else wire.scalars(blob, dtype, n, rows)

    def padded(v: np.ndarray) -> np.ndarray:  # every sample's rows, padded to `rows`
        if not layout.variable_rows:
            return v
        out = np.zeros((n * rows, *v.shape[1:]), dtype=v.dtype)
        out[slots] = v[keep]
        return out

    i = 1
    for col in layout.columns:
        try:
            try:
                if col.is_array or col.is_bytes:
                    if col.ragged:  # the lengths from the arrays' headers
                        rows_sent = int(counts.sum()) if layout.variable_rows else n * rows
                        nulls = per_row(blobs[i + 1], np.dtype("?"))
                        lengths = ragged.lengths_of(blobs[i], rows_sent, nulls, col.wire.itemsize)
                    else:
                        lengths = per_row(blobs[i + 1], np.dtype(">i4"))
                    values, kept = _values(layout, col, blobs[i], lengths)
                    d.values[col] = padded(values)
                    if kept is not None:
                        d.lengths[col] = padded(kept)
                else:
                    d.values[col] = padded(per_row(blobs[i], col.wire))
                if col.nullable:
                    d.masks[col] = padded(per_row(blobs[i + 1], np.dtype("?")))
            except wire.BadSample as e:  # e.sample counts rows of the batch where arrays are per row
                if col.is_array or col.is_bytes:
                    raise wire.BadSample(int(np.searchsorted(ends, e.sample, side="right")), str(e)) from None
                raise
        except wire.BadSample as e:
            raise layout.bad_value(keys, e.sample, col, e) from None
        i += col.n_blobs


def one_row_each(layout: BatchLayout, ordinals: np.ndarray, keys: np.ndarray) -> np.ndarray | None:
    """Check that each sample returned one row (``ordinals``: each row's sample, from 1); the rows' order.

    Rows arrive in key order; should a plan ever reorder them, sorting by ordinal restores it.
    """
    n = keys.shape[1]
    counts = np.bincount(ordinals - 1, minlength=n)[:n] if ordinals.size else np.zeros(n, np.int64)
    if ordinals.size > n:  # the statement stopped at n + 1 rows: a sample has more, and later ones may be unread
        bad = int(np.flatnonzero(counts > 1)[0])
        raise layout.sample_error(keys, bad, "returned more than 1 rows, expected 1 ([samples] rows)")
    wrong = np.flatnonzero(counts != 1)
    if wrong.size or ordinals.size != n:
        bad = int(wrong[0]) if wrong.size else 0
        raise layout.sample_error(keys, bad, f"returned {counts[bad]} rows, expected 1 ([samples] rows)")
    return None if np.all(ordinals[1:] > ordinals[:-1]) else np.argsort(ordinals)


def _rows_each(layout: BatchLayout, columns: Sequence[Sequence[object]], keys: np.ndarray, d: Decoded) -> None:
    """Decode a row-wise statement's rows: each column's binary values, one per sample, joined and viewed."""
    n = keys.shape[1]
    ordinals = np.array(columns[0] if columns else (), dtype=np.int64)
    order = one_row_each(layout, ordinals, keys)
    i = 1
    for col in layout.columns:
        sent = cast("Sequence[bytes | None]", columns[i])  # a sent column: a binary value a sample
        try:
            kept = None
            if None in sent:  # a NULL the statement did not replace: the column has no NULL policy
                nulls = sent.count(None)
                raise wire.BadSample(sent.index(None), wire.null_message(nulls))
            values = cast("Sequence[bytes]", sent)  # no NULL among them (above)
            data = b"".join(values)
            if col.is_array:
                sizes = np.fromiter(map(len, values), np.int64, n)
                v, kept = _values(layout, col, data, ragged.lengths_of_sized(data, sizes, col.wire.itemsize))
            elif col.is_bytes:
                v, kept = _values(layout, col, data, np.fromiter(map(len, values), np.int64, n))
            else:
                v = np.frombuffer(data, dtype=col.wire)
            if col.nullable:
                m = np.array(columns[i + 1], dtype=bool)
                d.masks[col] = m if order is None else m[order]
        except wire.BadSample as e:  # e.sample is the row as it arrived
            raise layout.bad_value(keys, int(ordinals[e.sample]) - 1, col, e) from None
        d.values[col] = v if order is None else v[order]
        if kept is not None:
            d.lengths[col] = kept if order is None else kept[order]
        i += col.n_sent


def _rows_flat(layout: BatchLayout, blobs: Sequence[bytes | None], keys: np.ndarray, d: Decoded) -> None:
    """Decode the statement shape for ``rows = 1``: one array per column over the batch, plus ordinals."""
    n = keys.shape[1]
    ordinals = wire.flat(blobs[0], np.dtype(">i4")).astype(np.int64)
    order = one_row_each(layout, ordinals, keys)
    i = 1
    for col in layout.columns:
        try:
            kept = None
            if col.is_array or col.is_bytes:
                if col.ragged:  # the lengths from the arrays' headers
                    nulls = wire.flat(blobs[i + 1], np.dtype("?"))
                    lengths = ragged.lengths_of(blobs[i], n, nulls, col.wire.itemsize)
                else:
                    lengths = wire.flat(blobs[i + 1], np.dtype(">i4"))
                v, kept = _values(layout, col, blobs[i], lengths)
            else:
                v = wire.flat(blobs[i], col.wire)
            if col.nullable:
                m = wire.flat(blobs[i + 1], np.dtype("?"))
                d.masks[col] = m if order is None else m[order]
        except wire.BadSample as e:  # e.sample is the row as it arrived
            raise layout.bad_value(keys, int(ordinals[e.sample]) - 1, col, e) from None
        d.values[col] = v if order is None else v[order]
        if kept is not None:
            d.lengths[col] = kept if order is None else kept[order]
        i += col.n_blobs


def _values(
    layout: BatchLayout, col: Column, blob: bytes | None, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """An array or bytes column's rows, ``(rows, length)``; and each row's kept length when it varies."""
    f = next(f.config for f in layout.fields if col in f.columns)
    if f.max_length is None:
        return wire.array_rows(blob, lengths, col.wire, layout.array_length(col)), None
    hint = f'max_length {f.max_length}; [fields.{f.name}] truncate = "right" or "left" keeps that many'
    exact = col.cut is None  # else the server cut the values (Column.cut_sql): their lengths are the cut's
    if col.is_bytes:
        return ragged.byte_runs(blob, lengths, f.max_length, f.truncate, col.pg_type == "text", hint, exact=exact)
    return ragged.arrays(blob, lengths, col.wire, f.max_length, f.truncate, hint, exact=exact)


def array_lengths(layout_columns: Sequence[Column], fetched: Fetched, row_wise: bool = False) -> dict[Column, int]:
    """The element count of each array column in the first row of a batch (fixes the field shapes)."""
    out = {}
    i = 1
    for col in layout_columns:
        if col.is_array and row_wise:  # the header's dimension word; decoding checks the value, naming its sample
            column = cast("Sequence[bytes | None]", fetched[i]) if fetched else ()  # row-wise: a column a value
            first = column[0] if column else None
            out[col] = int.from_bytes(first[12:16], "big") if first and len(first) > ragged.EMPTY else 0
        elif col.is_array:
            out[col] = wire.first_length(cast("bytes | None", fetched[i + 1]))  # one row: a value a column
        i += col.n_sent if row_wise else col.n_blobs
    return out
