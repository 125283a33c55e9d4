"""Values of varying length off the wire, padded into fixed-shape arrays with their real lengths.

A field with ``max_length`` takes arrays of any length, or text and bytea as bytes; with ``[samples]
max_rows`` a sample has 1 to ``max_rows`` rows. Either way the store keeps fixed-shape chunks (which is
what makes the reader zero-copy): values are padded to the maximum and the real lengths travel beside.

Everything here is vectorised: the position of every kept value in the wire bytes is computed with numpy
(cumulative sums of the lengths the server sends beside the values), and one fancy index gathers them.
No Python loop runs per sample or per value. Errors raise :class:`~pgprefetch.decode.wire.BadSample` with the
position of the offending row, which :mod:`pgprefetch.decode.collate` turns into a message naming its key.
"""

from __future__ import annotations

import struct

import numpy as np

from pgprefetch.decode.wire import HEADER, BadSample, first_with_null

EMPTY = 12  # array_send of an empty array: ndim 0, has-null flag, element type; no dimension


def kept(
    lengths: np.ndarray, limit: int, truncate: str, what: str, hint: str, *, exact: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """How many of each row's ``lengths`` values are kept, and the first kept one, under ``truncate``.

    ``right`` keeps the first ``limit``, ``left`` the last; ``error`` raises for the first longer row.
    ``exact``: the lengths are the values' own; else the server cut the values (to ``limit + 1`` under
    ``error``), and a longer one is said to be longer without a count that would be the cut's.
    """
    over = lengths > limit
    if truncate == "error" and over.any():
        bad = int(np.flatnonzero(over)[0])
        told = f"has {int(lengths[bad])} {what}, more than {hint}" if exact else f"has more {what} than {hint}"
        raise BadSample(bad, told)
    count = np.minimum(lengths, limit)
    first = lengths - count if truncate == "left" else np.zeros_like(lengths)
    return count, first


def arrays(
    blob: bytes | None,
    lengths: np.ndarray,
    wire: np.dtype,
    limit: int,
    truncate: str,
    hint: str,
    *,
    exact: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of an array column of any length: each row's ``array_send`` back to back -> ``(rows, limit)``.

    ``lengths`` holds each row's ``cardinality``. Returns the values (zero beyond each row's kept length,
    wire dtype) and the kept lengths. ``exact``: as for :func:`kept`.
    """
    lengths = lengths.astype(np.int64)
    step = 4 + wire.itemsize  # each element: its int32 length, then the value
    sizes = np.where(lengths > 0, HEADER + lengths * step, EMPTY)
    starts = np.zeros(lengths.size, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    data = blob or b""
    if len(data) != int(sizes.sum()):
        raise BadSample(first_with_null(data, lengths.size, wire.itemsize), "has a NULL element")
    if lengths.size:
        ndim, flags = _heads(data, starts)
        irregular = np.flatnonzero((ndim != (lengths > 0)) | (flags != 0))
        if irregular.size:
            raise BadSample(int(irregular[0]), "has a NULL element or more than one dimension")
    count, first = kept(lengths, limit, truncate, "elements", hint, exact=exact)
    at = starts + HEADER + 4 + first * step  # each row's first kept value
    return _gather(data, at, count, step, wire, limit), count


def lengths_of(blob: bytes | None, rows: int, nulls: np.ndarray, width: int) -> np.ndarray:
    """Each row's element count, read from the headers of its ``array_send`` (the rows back to back).

    A walk from header to header, since each row's place depends on the lengths before it: a few hundred
    steps a batch, where asking the server for ``cardinality`` would decompress every TOASTed array again.
    ``nulls`` marks the rows whose array is NULL (sent as nothing).
    """
    if nulls.any():
        raise BadSample(int(np.flatnonzero(nulls)[0]), "is NULL")
    data = blob or b""
    lengths = np.zeros(rows, dtype=np.int64)
    pos, step, end = 0, 4 + width, len(data)
    for r in range(rows):
        if pos + EMPTY > end:
            raise BadSample(r, "has a NULL element")  # the data ran out: a NULL element shortened a row
        ndim, has_null = _HEAD.unpack_from(data, pos)
        if has_null or ndim > 1:
            raise BadSample(r, "has a NULL element or more than one dimension")
        if ndim == 0:
            pos += EMPTY
            continue
        n = int.from_bytes(data[pos + 12 : pos + 16], "big")
        lengths[r] = n
        pos += HEADER + n * step
    return lengths


_HEAD = struct.Struct(">ii")


def lengths_of_sized(data: bytes, sizes: np.ndarray, width: int) -> np.ndarray:
    """Each row's element count, from the byte size of its ``array_send`` (the rows back to back in ``data``).

    The row-wise statement hands each row's value over on its own, so its size is known and the count
    follows from it; only the headers' ndim and has-null words are read, with one index for all rows.
    They are checked here, where each row's start is known exactly, so that an error names the right
    row (:func:`arrays` checks them again, a few microseconds, as it must for the aggregated statement).
    """
    step = 4 + width
    lengths = np.where(sizes > EMPTY, (sizes - HEADER) // step, 0)
    starts = np.zeros(sizes.size, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    ndim, has_null = _heads(data, starts)
    bad = (has_null != 0) | (ndim > 1) | ((sizes > EMPTY) & ((sizes - HEADER) % step != 0))
    if bad.any():
        raise BadSample(int(np.flatnonzero(bad)[0]), "has a NULL element or more than one dimension")
    return lengths


def byte_runs(
    blob: bytes | None,
    lengths: np.ndarray,
    limit: int,
    truncate: str,
    utf8: bool,
    hint: str,
    *,
    exact: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Rows of text or bytea: their bytes back to back -> ``(rows, limit)`` uint8, and the kept lengths.

    ``exact``: as for :func:`kept`.
    Text (``utf8``) is never cut inside a character: a cut that would split one moves back to its start.
    """
    lengths = lengths.astype(np.int64)
    starts = np.zeros(lengths.size, dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    data = blob or b""
    if len(data) != int(lengths.sum()):
        raise BadSample(0, "holds fewer bytes than its lengths say")
    count, first = kept(lengths, limit, truncate, "bytes", hint, exact=exact)
    raw = np.frombuffer(data, dtype=np.uint8)
    if utf8:
        cut = np.flatnonzero(count < lengths)
        for _ in range(3):  # a UTF-8 character is at most 4 bytes: at most 3 continuation bytes to step over
            live = cut[count[cut] > 0]  # rows cut to nothing have no byte left to look at
            if truncate == "left":  # the first kept byte must not be a continuation byte
                inside = live[raw[starts[live] + first[live]] & 0xC0 == 0x80]
                first[inside] += 1
                count[inside] -= 1
            else:  # the first byte dropped must not be a continuation byte
                inside = live[raw[starts[live] + count[live]] & 0xC0 == 0x80]
                count[inside] -= 1
            if not inside.size:
                break
    return _gather(data, starts + first, count, 1, np.dtype(np.uint8), limit), count


def _gather(data: bytes, at: np.ndarray, count: np.ndarray, step: int, wire: np.dtype, limit: int) -> np.ndarray:
    """``count[r]`` values of width ``wire.itemsize`` from byte ``at[r]`` on, ``step`` apart, into row ``r``.

    Returns ``(rows, limit)``, zero beyond each row's count. When the rows fill a good part of ``limit``,
    every row is copied whole out of a strided view of the data (its first axis a byte position, its
    second the values from there, ``step`` apart): one index per row, not per value, 2-3x faster. The slots
    past a row's end are zeroed after. When the rows are short, only the values are gathered.
    """
    rows = count.size
    total = int(count.sum())
    if not total:
        return np.zeros((rows, limit), dtype=wire)
    if 3 * total >= rows * limit:
        slack = limit * step + 32  # the last rows' windows reach past the data (also from an empty last row)
        buf = data + bytes(slack)
        windows = np.ndarray((len(data) + 32, limit), dtype=wire, buffer=buf, strides=(1, step))
        values: np.ndarray = windows[at]
        values[np.arange(limit, dtype=np.int32) >= count.astype(np.int32)[:, None]] = 0
        return values
    row = np.repeat(np.arange(rows), count)
    offsets = np.zeros(rows, dtype=np.int64)
    np.cumsum(count[:-1], out=offsets[1:])
    index = np.arange(total, dtype=np.int64) - offsets[row]  # position within the row
    width = wire.itemsize
    if width in (1, 2, 4, 8) and step % width == 0 and not (at % width).any():  # aligned: the data as values
        values = np.frombuffer(data, dtype=wire, count=len(data) // width)[(at // width)[row] + index * (step // width)]
    else:
        pos = at[row] + index * step  # byte offset of each value
        values = np.frombuffer(data, dtype=np.uint8)[pos[:, None] + np.arange(width)].view(wire)[:, 0]
    out = np.zeros((rows, limit), dtype=wire)
    out[row, index] = values
    return out


def _heads(data: bytes, starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ndim and has-null words of the ``array_send`` values starting at ``starts`` (not 4-aligned in general)."""
    raw = np.frombuffer(data, dtype=np.uint8)
    words = raw[starts[:, None] + np.arange(8)].view(">i4")
    return words[:, 0], words[:, 1]


def groups(blob: bytes | None, counts: np.ndarray, wire: np.dtype) -> np.ndarray:
    """A scalar column of samples with varying row counts: per sample an ``array_send`` of its rows.

    Returns every row's value in order, ``(counts.sum(),)``.
    """
    counts = counts.astype(np.int64)
    step = 4 + wire.itemsize
    sizes = HEADER + counts * step
    data = blob or b""
    if len(data) != int(sizes.sum()):
        raise BadSample(first_with_null(data, counts.size, wire.itemsize), "is NULL")
    starts = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(sizes[:-1], out=starts[1:])
    if counts.size:
        nulls = np.flatnonzero(_heads(data, starts)[1])
        if nulls.size:
            raise BadSample(int(nulls[0]), "is NULL")
    values = _gather(data, starts + HEADER + 4, counts, step, wire, int(counts.max(initial=0)))
    mask = np.arange(values.shape[1]) < counts[:, None]
    return values[mask]


def place_rows(counts: np.ndarray, limit: int, truncate: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each sample's rows go when every sample is padded to ``limit`` rows.

    Returns the kept rows (indices into all rows, in order), their slots in the padded ``(n * limit)`` rows,
    and each sample's kept row count.
    """
    counts = counts.astype(np.int64)
    count, first = kept(counts, limit, truncate, "rows", f"max_rows {limit} ([samples] truncate)")
    starts = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    sample = np.repeat(np.arange(counts.size), count)
    offsets = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(count[:-1], out=offsets[1:])
    index = np.arange(int(count.sum()), dtype=np.int64) - offsets[sample]
    return starts[sample] + first[sample] + index, sample * limit + index, count
