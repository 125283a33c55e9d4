"""PostgreSQL binary arrays (``array_send``) viewed as numpy arrays, without a Python object per value.

A one-dimensional binary array of a fixed-width type is a 20-byte header (ndim, has-null flag, element
type oid, length, lower bound) followed by ``(int32 length, value)`` pairs, big-endian. When no element
is NULL every pair has the same size, so numpy views the whole blob as a structured array. A NULL
element has length -1 and no value bytes, which breaks that regularity: such blobs are walked in Python,
on the error path only, to name the first NULL and count them.

Every function here raises :class:`BadSample` with the position of the offending sample or row, and
:mod:`pgprefetch.decode.collate` turns that into a message naming the sample's key.
"""

from __future__ import annotations

import numpy as np

HEADER = 20  # ndim, has-null flag, element type oid, dimension length, lower bound: 5 x int32


class BadSample(Exception):
    """A value of sample ``sample`` (its index in the batch) cannot be decoded; the message says why."""

    def __init__(self, sample: int, message: str) -> None:
        super().__init__(message)
        self.sample = sample


def counts(blob: bytes | None, n: int) -> np.ndarray:
    """The rows each of the batch's ``n`` samples returned (an int4 binary array)."""
    if blob is None:
        return np.zeros(n, dtype=np.int64)
    rec = np.frombuffer(blob, dtype=[("len", ">i4"), ("v", ">i4")], offset=HEADER, count=n)
    return rec["v"].astype(np.int64)


def scalars(blob: bytes | None, wire: np.dtype, n: int, rows: int) -> np.ndarray:
    """A scalar column: ``n`` per-sample binary arrays of ``rows`` values each, back to back -> ``(n * rows,)``."""
    sample = np.dtype([("head", ">i4", (5,)), ("e", [("len", ">i4"), ("v", wire)], (rows,))])
    if blob is None or len(blob) != n * sample.itemsize:  # a NULL element shortens its sample's array
        raise BadSample(first_with_null(blob or b"", n, wire.itemsize), _null_message(blob))
    rec = np.frombuffer(blob, dtype=sample, count=n)
    nulls = np.flatnonzero(rec["head"][:, 1])
    if nulls.size:
        raise BadSample(int(nulls[0]), _null_message(blob))
    return rec["e"]["v"].reshape(n * rows)


def flat(blob: bytes | None, wire: np.dtype) -> np.ndarray:
    """The values of one binary array of a fixed-width type; a NULL raises with its position."""
    if blob is None:
        return np.empty(0, dtype=wire)
    _ndim, has_null, _oid, length, _lower = np.frombuffer(blob, dtype=">i4", count=5)
    if has_null:
        raise BadSample(_first_null(blob, int(length)), _null_message(blob))
    return np.frombuffer(blob, dtype=[("len", ">i4"), ("v", wire)], offset=HEADER, count=length)["v"]


def array_rows(blob: bytes | None, lengths: np.ndarray, wire: np.dtype, width: int) -> np.ndarray:
    """Rows of a fixed-length array column: each row's ``array_send`` back to back -> ``(rows, width)``.

    ``lengths`` holds each row's ``cardinality``; errors raise with the row's position.
    """
    wrong = np.flatnonzero(lengths != width)
    if wrong.size:
        bad = int(wrong[0])
        raise BadSample(bad, f"has {lengths[bad]} elements, expected {width} (as in the first sample)")
    element = np.dtype([("len", ">i4"), ("v", wire)])
    row = np.dtype([("head", ">i4", (5,)), ("e", element, (width,))])
    total = lengths.size
    if blob is None or len(blob) != total * row.itemsize:
        raise BadSample(
            _first_irregular(blob or b"", total, row.itemsize), "has a NULL element or more than one dimension"
        )
    rec = np.frombuffer(blob, dtype=row, count=total)
    irregular = np.flatnonzero((rec["head"][:, 0] != 1) | (rec["head"][:, 1] != 0))
    if irregular.size:
        raise BadSample(int(irregular[0]), "has a NULL element or more than one dimension")
    return rec["e"]["v"]


def first_length(blob: bytes | None) -> int:
    """The first element of an int4 binary array (0 when it is empty, NULL or missing)."""
    if blob is None:
        return 0
    _ndim, has_null, _oid, rows, _lower = np.frombuffer(blob, dtype=">i4", count=5)
    if not rows or has_null:
        return 0
    return int(np.frombuffer(blob, dtype=">i4", count=1, offset=HEADER + 4)[0])


def count_nulls(blob: bytes | None) -> int:
    """NULL elements in binary arrays sent back to back (error path only: a walk in Python)."""
    if not blob:
        return 0
    nulls, pos = 0, 0
    while pos + 12 <= len(blob):
        ndim = int.from_bytes(blob[pos : pos + 4], "big", signed=True)
        dims = [int.from_bytes(blob[pos + 12 + 8 * d : pos + 16 + 8 * d], "big") for d in range(ndim)]
        pos += 12 + 8 * ndim
        for _ in range(int(np.prod(dims)) if ndim else 0):
            size = int.from_bytes(blob[pos : pos + 4], "big", signed=True)
            nulls += size < 0
            pos += 4 + max(size, 0)
    return nulls


def _null_message(blob: bytes | None) -> str:
    return null_message(count_nulls(blob))


def null_message(n: int) -> str:
    """The error for a sample's NULL, with the count of NULLs in its batch (``n``; 0 when not known)."""
    return f"is NULL ({n} NULL{'s' if n != 1 else ''} in this batch)" if n else "is NULL"


def first_with_null(blob: bytes, n: int, width: int) -> int:
    """Walk the per-sample arrays to the first one flagged as holding a NULL (error path only)."""
    pos = 0
    for s in range(n):
        if pos + HEADER > len(blob):
            return s
        _ndim, has_null, _oid, length, _lower = np.frombuffer(blob, dtype=">i4", count=5, offset=pos)
        if has_null:
            return s
        pos += HEADER + int(length) * (4 + width)
    return 0


def _first_null(blob: bytes, length: int) -> int:
    """Walk the elements of a binary array with NULLs to the first one (error path only)."""
    pos = HEADER
    for i in range(length):
        size = int.from_bytes(blob[pos : pos + 4], "big", signed=True)
        if size < 0:
            return i
        pos += 4 + size
    return 0


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
