"""An epoch's keys in the epoch's order, on disk: written a bucket at a time, read back a unit at a time.

When the keys outgrow ``[source] memory`` they are ordered on disk (:mod:`pgprefetch.write.order.spill`), and
the ordered list is this file rather than an array: key slot ``j`` of sample ``i`` is the int64 at
``(j * capacity + i) * 8``, one region per slot, so the keys of a run of samples are one contiguous range
per slot. The batches read their keys with ``pread`` (:meth:`OrderedKeys.columns`), not through a memory
map: the pages go through the page cache, never into the dump's RSS, however long the epoch.

The sha256 of the key list, which a partial epoch's journal records and a resumed dump compares, is the
in-memory path's: every slot's values of the used samples, slot after slot. Slot 0 is hashed as the file
is written, up to the samples surely used (a multiple of the batch size with ``drop_last``); the rest,
and the other slots, when the count is known (:meth:`OrderedKeys.finish`).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from pgprefetch.store.folders import Place, as_place
from pgprefetch.write.files.shardfiles import io_errors, pwrite_all

READ_SAMPLES = 1 << 20  # keys hashed per read when the file is read back for its sha256


def pread_into(fd: int, out: np.ndarray, offset: int) -> None:
    """Fill the contiguous ``out`` with the file's bytes from ``offset`` (``pread`` may return less)."""
    view = out.reshape(-1).view(np.uint8).data  # memoryview(...): typed a Buffer only from Python 3.12
    while view:
        got = os.preadv(fd, [view], offset)
        if got == 0:
            raise OSError(f"unexpected end of {fd}")
        view, offset = view[got:], offset + got


class OrderedKeys:
    """The ordered key file of one epoch: ``width`` slots of up to ``capacity`` samples each.

    ``quantum``: the used samples are a multiple of it (the batch size with ``drop_last``, else 1), so
    slot 0 can be hashed as far as that multiple while the file is still growing. ``payload``: slots kept
    after the key's, carried with each sample but not part of its key (windows beyond memory: the row each
    starts at, :meth:`payload`); they are not in the digest, nor in :meth:`columns`.
    """

    def __init__(self, path: Path | Place, width: int, capacity: int, quantum: int, payload: int = 0) -> None:
        self.path = as_place(path)
        self.width = width
        self.slots = width + payload
        self.capacity = capacity
        self.quantum = max(1, quantum)
        self.n = 0
        self._digest = hashlib.sha256()
        self._hashed = 0  # samples of slot 0 in the digest
        with io_errors(self.path.parent), self.path.parent.open() as folder:  # never through a planted link
            self._fd = folder.open(self.path.name, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)

    @property
    def shape(self) -> tuple[int, int]:
        """``(width, n)``, as the in-memory key array's."""
        return self.width, self.n

    def append(self, keys: np.ndarray, order: np.ndarray | None = None) -> None:
        """Add ``keys`` (``(width + payload, m)`` int64), or ``keys[:, order]``, after those already written.

        With ``order`` each slot is permuted and written in turn: one slot's copy at a time in memory.
        """
        m = keys.shape[1] if order is None else order.size
        assert self.n + m <= self.capacity, "more keys than the file was made for"
        assert keys.shape[0] == self.slots, "every slot of every key"
        with io_errors(self.path.parent):
            for j, column in enumerate(keys):
                values = np.ascontiguousarray(column) if order is None else column[order]
                pwrite_all(self._fd, values, (j * self.capacity + self.n) * 8)
        self.n += m
        self._hash(0, self._hashed, self.n // self.quantum * self.quantum)
        self._hashed = self.n // self.quantum * self.quantum

    def finish(self, used: int) -> str:
        """The sha256 of the first ``used`` samples' keys (the in-memory path's ``keys_sha256``)."""
        assert self._hashed <= used <= self.n
        self._hash(0, self._hashed, used)
        self._hashed = used
        for j in range(1, self.width):
            self._hash(j, 0, used)
        return self._digest.hexdigest()

    def _hash(self, slot: int, start: int, end: int) -> None:
        buffer = np.empty(min(READ_SAMPLES, max(0, end - start)), dtype=np.int64)
        for lo in range(start, end, READ_SAMPLES):
            part = buffer[: min(READ_SAMPLES, end - lo)]
            pread_into(self._fd, part, (slot * self.capacity + lo) * 8)
            self._digest.update(part.data)

    def columns(self, start: int, end: int) -> np.ndarray:
        """The keys of samples ``start`` to ``end`` (cut at the last one), ``(width, m)`` int64."""
        return self._slots(range(self.width), start, end)

    def payload(self, start: int, end: int) -> np.ndarray:
        """The payload of samples ``start`` to ``end`` (cut at the last one), ``(payload, m)`` int64."""
        return self._slots(range(self.width, self.slots), start, end)

    def _slots(self, slots: range, start: int, end: int) -> np.ndarray:
        end = min(end, self.n)
        out = np.empty((len(slots), max(0, end - start)), dtype=np.int64)
        for i, j in enumerate(slots):
            pread_into(self._fd, out[i], (j * self.capacity + start) * 8)
        return out

    def close(self) -> None:
        """Close the file (its folder is removed by whoever made it)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
