"""Rows of one column, every row's values back to back: the pieces of documents a packed unit places.

The padded decoding (:mod:`.ragged`) writes each value into a row of the field's ``max_length``: right for a
batch of samples, wasteful for pieces of documents of any length. Packing (:mod:`pgprefetch.write.pack`) lays
each piece's tokens out in order, so here the values stay flat, with each row's count beside them, and are cast
to the field's dtype with the same safe-cast checks as any batch.

The positions of every element are computed with numpy from the rows' sizes. An array's elements sit at a
stride of 4 + the element's bytes behind a 20-byte header, so every element of an ``int2[]`` or ``int4[]``
lies at a multiple of its own size and the joined bytes are viewed as that type and indexed; an ``int8[]``'s
elements are read as two 32-bit halves.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pgprefetch.decode import ragged, wire
from pgprefetch.decode.casts import holding_dtype, misfit_before
from pgprefetch.pg.columns import Column


def flat_values(
    col: Column, sent: Sequence[bytes | None], dtype: np.dtype, width: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of one column (each an ``array_send`` or bytes), their values back to back in ``dtype``; each one's count.

    ``width``: a ``bytea``'s tokens are little-endian, ``width`` bytes each (0: an array's elements, or bytes).
    A NULL has no values.

    Raises:
        wire.BadSample: a row holds no whole tokens, a NULL element, or a value ``dtype`` cannot hold (its row).
    """
    values = [b"" if v is None else v for v in sent]
    data = b"".join(values)
    sizes = np.fromiter(map(len, values), np.int64, len(values))
    if width:
        ragged_rows = np.flatnonzero(sizes % width)
        if ragged_rows.size:
            row = int(ragged_rows[0])
            raise wire.BadSample(row, f"has {sizes[row]} bytes, not whole tokens of {width} bytes")
        v, counts = np.frombuffer(data, dtype=dtype.newbyteorder("<")), sizes // width
    else:
        v, counts = _elements(col, data, sizes)
    bad = misfit_before(v, dtype)
    if bad is not None:
        index, why = bad
        value = int(v[index])
        raise wire.BadSample(
            int(np.searchsorted(np.cumsum(counts), index, side="right")),
            f'value {value} does not fit {dtype.name}{why}; set dtype = "{holding_dtype(value, dtype)}" to hold it',
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


__all__ = ["flat_values"]
