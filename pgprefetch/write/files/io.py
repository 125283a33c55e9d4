"""Bytes at offsets of open descriptors: the one I/O layer of the epoch's shard files and the spill files.

``pread`` and ``pwrite`` (and ``writev``) may move fewer bytes than asked (2 GiB at most a call, a signal, a
full disk): each helper loops until every byte has moved, and a write that moves none is ``ENOSPC``. A
failure is one line naming the file's folder (:func:`io_errors`), the same for every file a dump writes.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from pgprefetch.errors import StoreError
from pgprefetch.store.folders import Place

IOV_MAX = 512  # pieces a writev (Linux takes 1,024)


def _bytes(array: np.ndarray) -> memoryview:
    """A contiguous array's bytes (``memoryview(...)`` is typed a Buffer only from Python 3.12)."""
    return array.reshape(-1).view(np.uint8).data


def pread_into(fd: int, out: np.ndarray, offset: int) -> None:
    """Fill the contiguous ``out`` with the file's bytes from ``offset``; a file that ends first is an error."""
    view = _bytes(out)
    while view:
        got = os.preadv(fd, [view], offset)
        if got == 0:
            raise OSError(errno.EIO, f"unexpected end of file at byte {offset}")
        view, offset = view[got:], offset + got


def pwrite_all(fd: int, data: np.ndarray, offset: int) -> None:
    """Write all of the contiguous ``data`` at ``offset``."""
    view = _bytes(np.ascontiguousarray(data))
    while view:
        written = os.pwrite(fd, view, offset)
        if written == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, offset = view[written:], offset + written


def pwritev_all(fd: int, pieces: Sequence[memoryview], offset: int) -> int:
    """Write ``pieces`` back to back from ``offset`` (one ``pwritev`` per :data:`IOV_MAX` pieces); their bytes.

    Many small pieces (a chunk's rows split over a hundred buckets) in one call each: a write a piece was
    most of the time of splitting a table.
    """
    start = offset
    left = [p.cast("B") for p in pieces if p.nbytes]
    while left:
        written = os.pwritev(fd, left[:IOV_MAX], offset)
        if written == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        offset += written
        while left and written >= left[0].nbytes:  # the pieces written whole go; a piece cut short is sliced
            written -= left[0].nbytes
            left.pop(0)
        if written:
            left[0] = left[0][written:]
    return offset - start


@contextmanager
def io_errors(where: Path | Place, doing: str = "write") -> Iterator[None]:
    """Turn a failed write (or read: ``doing``) into one line naming ``where``: a full disk, a vanished folder."""
    try:
        yield
    except OSError as e:
        hint = ""
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
            hint = "; free some space and run the dump again: it resumes where it stopped"
        raise StoreError(f"cannot {doing} {where}: {e.strerror or e}{hint}") from None
