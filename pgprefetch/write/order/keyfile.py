"""An epoch's keys in the epoch's order, on disk: written a bucket at a time, read back a unit at a time.

When the keys outgrow ``[source] memory`` they are ordered on disk (:mod:`pgprefetch.write.order.spill`), and
the ordered list is a :class:`~pgprefetch.write.spill.columns.ColumnFile` rather than an array: one int64
column a key slot (``k0``, ``k1``, ...), a block a bucket. The batches read their keys with ``pread``
(:meth:`OrderedKeys.columns`), not through a memory map: the pages go through the page cache, never into
the dump's RSS, however long the epoch.

The sha256 of the key list, which a partial epoch's journal records and a resumed dump compares, is the
in-memory path's: every slot's values of the used samples, slot after slot. Slot 0 is hashed as the file
is written, up to the samples surely used (a multiple of the batch size with ``drop_last``); the rest,
and the other slots, when the count is known (:meth:`OrderedKeys.finish`).
"""

from __future__ import annotations

import hashlib

import numpy as np

from pgprefetch.write.spill.columns import ColumnFile
from pgprefetch.write.spill.folder import SpillFolder

READ_SAMPLES = 1 << 20  # keys hashed per read when the file is read back for its sha256


def slot_names(slots: int) -> list[str]:
    """The columns of a key file of ``slots`` int64 slots."""
    return [f"k{j}" for j in range(slots)]


class OrderedKeys:
    """The ordered key file of one epoch: ``width`` key slots a sample, and ``payload`` slots carried after them.

    ``quantum``: the used samples are a multiple of it (the batch size with ``drop_last``, else 1), so
    slot 0 can be hashed as far as that multiple while the file is still growing. ``payload``: slots kept
    after the key's, carried with each sample but not part of its key (windows beyond memory: the row each
    starts at, :meth:`payload`); they are not in the digest, nor in :meth:`columns`.
    """

    def __init__(self, folder: SpillFolder, name: str, width: int, quantum: int, payload: int = 0) -> None:
        self.width = width
        self.slots = width + payload
        self.quantum = max(1, quantum)
        self._names = slot_names(self.slots)
        self.file = ColumnFile(folder.create(name), {n: (np.dtype(np.int64), ()) for n in self._names})
        self._digest = hashlib.sha256()
        self._hashed = 0  # samples of slot 0 in the digest

    @property
    def n(self) -> int:
        """The samples written."""
        return self.file.rows

    @property
    def shape(self) -> tuple[int, int]:
        """``(width, n)``, as the in-memory key array's."""
        return self.width, self.n

    def append(self, keys: np.ndarray, order: np.ndarray | None = None) -> None:
        """Add ``keys`` (``(width + payload, m)`` int64), or ``keys[:, order]``, after those already written."""
        assert keys.shape[0] == self.slots, "every slot of every key"
        m = keys.shape[1] if order is None else order.size
        self.file.append_lazily(m, (column if order is None else column[order] for column in keys))
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
        buffer = {self._names[slot]: np.empty(min(READ_SAMPLES, max(0, end - start)), dtype=np.int64)}
        for lo in range(start, end, READ_SAMPLES):
            part = self.file.read(lo, min(end, lo + READ_SAMPLES), [self._names[slot]], buffer)
            self._digest.update(part[self._names[slot]].data)

    def columns(self, start: int, end: int) -> np.ndarray:
        """The keys of samples ``start`` to ``end`` (cut at the last one), ``(width, m)`` int64."""
        return self._slots(self._names[: self.width], start, end)

    def payload(self, start: int, end: int) -> np.ndarray:
        """The payload of samples ``start`` to ``end`` (cut at the last one), ``(payload, m)`` int64."""
        return self._slots(self._names[self.width :], start, end)

    def _slots(self, names: list[str], start: int, end: int) -> np.ndarray:
        end = min(end, self.n)
        out = np.empty((len(names), max(0, end - start)), dtype=np.int64)
        self.file.read(start, end, names, dict(zip(names, out, strict=True)))
        return out

    def close(self) -> None:
        """Close the file (its folder is removed by whoever made it)."""
        self.file.close()
