"""One column of a row-wise statement, every sample's values back to back: the documents a packed unit places.

The padded decoding (:mod:`.ragged`) writes each value into a row of the field's ``max_length``: right for a
batch of samples, wasteful for documents whose longest may be a hundred times their median. Packing
(:mod:`pgprefetch.write.pack`) takes a document's tokens by offset, so here the values stay flat, with each
sample's count beside them, and are cast to the field's dtype with the same safe-cast checks as any batch.

The positions of every element are computed with numpy from the rows' sizes. An array's elements sit at a
stride of 4 + the element's bytes behind a 20-byte header, so every element of an ``int2[]`` or ``int4[]``
lies at a multiple of its own size and the joined bytes are viewed as that type and indexed; an ``int8[]``'s
elements are read as two 32-bit halves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import numpy as np

from pgprefetch.decode import ragged, wire
from pgprefetch.decode.blobs import one_row_each
from pgprefetch.decode.casts import holding_dtype, misfit_before
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.pg.columns import Column
from pgprefetch.pg.statement import Fetched


def flat_column(
    layout: BatchLayout, fetched: Fetched, keys: np.ndarray, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """The layout's one field's values, sample after sample in ``keys`` order, cast to ``dtype``; each one's count.

    ``fetched``: a row-wise statement's rows (its ordinals, then the column's values, then its NULL mask when
    it has one). A NULL sent as a mask has no values.
    """
    assert layout.row_wise, "flat values come from a row-wise statement"
    (f,) = layout.fields
    (col,) = f.columns
    rows = cast("Sequence[Sequence[object]]", fetched)
    ordinals = np.array(rows[0] if rows else (), dtype=np.int64)
    order = one_row_each(layout, ordinals, keys)
    sent = cast("list[bytes | None]", list(rows[1]))
    if order is not None:
        sent = [sent[i] for i in order]
    if None in sent:
        raise layout.sample_error(keys, sent.index(None), f"field {f.name}, column {col.name} is NULL")
    values = cast("list[bytes]", sent)
    data = b"".join(values)
    sizes = np.fromiter(map(len, values), np.int64, len(values))
    try:
        v, counts = _elements(col, data, sizes)
    except wire.BadSample as e:
        raise layout.bad_value(keys, e.sample, col, e) from None
    bad = misfit_before(v, dtype)
    if bad is not None:
        index, why = bad
        sample = int(np.searchsorted(np.cumsum(counts), index, side="right"))
        value = int(v[index])
        raise layout.sample_error(
            keys,
            sample,
            f"field {f.name}, column {col.name} value {value} does not fit {dtype.name}{why}; "
            f'set [fields.{f.name}] dtype = "{holding_dtype(value, dtype)}" to hold it',
        )
    return v.astype(dtype, copy=False), counts


def _elements(col: Column, data: bytes, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every element of the joined rows (native byte order) and each row's count."""
    if col.is_bytes:
        return np.frombuffer(data, dtype=np.uint8), sizes
    width = col.wire.itemsize
    counts = ragged.lengths_of_sized(data, sizes, width)
    starts = np.zeros(sizes.size, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    total = int(counts.sum())
    within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    at = np.repeat(starts + wire.HEADER + 4, counts) + within * (4 + width)  # each element's first byte
    if width == 8:  # at a multiple of 4 only: two big-endian halves
        halves = np.frombuffer(data, dtype=">u4", count=len(data) // 4)
        high, low = halves[at // 4].astype(np.uint64), halves[at // 4 + 1].astype(np.uint64)
        return ((high << np.uint64(32)) | low).view(np.int64), counts
    view = np.frombuffer(data, dtype=col.wire, count=len(data) // width)
    return view[at // width].astype(col.wire.newbyteorder("="), copy=False), counts


__all__ = ["flat_column"]
