"""A table larger than ``[source] memory``, read once and split on local disk into passes that each fit it.

Each decoded chunk of the one COPY is split by a hash into buckets, each appended to its bucket's column
file (:mod:`pgprefetch.write.spill.columns`) a block at a time: a distribution sort. By the series key
(:class:`Partition`), a bucket holds whole series, so a pass of windows loads one bucket and joins, sorts
and cuts it as a table read whole is; by ranges of the epoch's order (:class:`EpochRanges`), a bucket is a
stretch of the epoch. The server reads the table once, whatever its indexes, and no range of it is read by
an index scattered over its pages. The number of buckets comes from the planner's row estimate; a bucket
that still came out larger than a pass's share (a SELECT has no estimate) is split again on disk, a block of
rows at a time, before any pass is loaded.
"""

from __future__ import annotations

import functools
import itertools
import math
import threading
from collections.abc import Callable, Iterator

import numpy as np

from pgprefetch.write import memory
from pgprefetch.write.order.shuffle import key_hash
from pgprefetch.write.scan.copystream import Columns
from pgprefetch.write.scan.shape import ScanShape
from pgprefetch.write.scan.table import Table, assemble
from pgprefetch.write.spill.columns import ColumnFile, Schema
from pgprefetch.write.spill.folder import SpillFolder

_BUCKET_STREAM = 0x627563686574  # "bucket": the hash that puts a series in its bucket
_SPLIT_STREAM = 0x73706C6974  # "split": the hash that splits an oversized bucket


class Partition:
    """Rows split into passes by a hash of their series key (``n_key`` key slots): a file per column and pass.

    ``buckets`` is chosen before the read (:func:`bucket_count`); :meth:`settle` splits the buckets that
    outgrew ``room`` bytes (a pass's share of the budget) after it. Pass ``p`` of :meth:`load` is the pass
    :meth:`pass_of` names.
    """

    def __init__(self, folder: SpillFolder, buckets: int, n_key: int, room: int, hold: int | None = None) -> None:
        self.buckets, self.n_key, self.room = max(1, buckets), n_key, room
        self.hold = max(1 << 20, room if hold is None else hold)  # the rows held before they are written
        self._pending: dict[str, list[Columns]] = {}  # each file's rows not written yet, by chunk
        self._pending_bytes = 0
        self._files: dict[str, ColumnFile] = {}  # each pass's (or bucket's) file, a block each time rows are held
        self.rows = 0
        self.subs = np.ones(self.buckets, np.int64)  # each bucket's passes (1 unless :meth:`settle` split it)
        self.template: Schema = {}  # each column's dtype and row shape
        self._lock = threading.Lock()  # the COPYs' chunks are decoded (and so added) on several threads
        self._writing = threading.Lock()  # held rows are written by one thread at a time
        self.folder = folder
        self.holding = memory.current().reserve("partition", 2 * self.hold)  # freed once settled

    @property
    def passes(self) -> int:
        """The data passes: one per bucket, more for a bucket :meth:`settle` split."""
        return int(self.subs.sum())

    def bucket_of(self, series: np.ndarray) -> np.ndarray:
        """The bucket of each series key (a column of ``series``, ``(n_key, m)`` int64)."""
        h = key_hash(series, seed=0, epoch=0, stream=_BUCKET_STREAM)
        return (h % np.uint64(self.buckets)).astype(np.int64)

    def pass_of(self, series: np.ndarray) -> np.ndarray:
        """The data pass of each series key (a column of ``series``): its bucket's, or its part of a split one."""
        bucket = self.bucket_of(series)
        first: np.ndarray = (np.cumsum(self.subs) - self.subs)[bucket]  # each row's bucket's first pass
        subs = self.subs[bucket]
        split = subs > 1
        if not split.any():
            return first
        parts = np.zeros(bucket.size, np.int64)
        for b in np.unique(bucket[split]):
            mine = bucket == b
            parts[mine] = self.part_of(series[:, mine], int(b), int(self.subs[b]))
        out: np.ndarray = first + parts
        return out

    def part_of(self, series: np.ndarray, bucket: int, subs: int) -> np.ndarray:
        """The part of split ``bucket`` (one of ``subs``) each series key of it goes to: a second hash's."""
        h = key_hash(series, seed=0, epoch=0, stream=_SPLIT_STREAM)
        return (h % np.uint64(subs)).astype(np.int64)

    def add(self, columns: Columns) -> None:
        """Take a decoded chunk's rows, each for its bucket (held until :meth:`flush` writes them)."""
        n = columns["k0"].shape[0]
        if not n:
            return
        series = np.stack([columns[f"k{i}"].astype(np.int64, copy=False) for i in range(self.n_key)])
        with self._lock:
            for name, v in columns.items():
                self.template.setdefault(name, (v.dtype, v.shape[1:]))
            self.rows += n
        self._append(self.bucket_of(series), columns, str)

    def _append(self, where: np.ndarray, columns: Columns, prefix: Callable[[int], str]) -> None:
        """Hold the rows of ``columns`` for the files of ``prefix(where[row])``; write them all once enough are held.

        The rows are put in bucket order (one gather a column) outside the lock. A chunk of a few thousand rows
        split over a hundred buckets was a hundred tiny writes a column: held, they go out as one block a bucket.
        """
        small = where.astype(np.uint16) if where.size and int(where.max()) < 1 << 16 else where
        order = np.argsort(small, kind="stable")  # (a radix sort on 16 bits: four times as fast as on 64)
        edges = np.concatenate([[0], np.flatnonzero(np.diff(where[order])) + 1, [order.size]])
        grouped = {name: np.ascontiguousarray(v[order]) for name, v in columns.items()}
        with self._lock:
            for lo, hi in itertools.pairwise(edges):
                pieces = self._pending.setdefault(prefix(int(where[order[lo]])), [])
                pieces.append({name: v[lo:hi] for name, v in grouped.items()})
            self._pending_bytes += sum(v.nbytes for v in grouped.values())
            if self._pending_bytes < self.hold:
                return
            held = self._take()
        self._write(held)  # outside the lock: the other COPYs' chunks go on being split meanwhile

    def flush(self) -> None:
        """Write every row held (the read is over)."""
        with self._lock:
            held = self._take()
        self._write(held)

    def _take(self) -> dict[str, list[Columns]]:
        """The rows held, to write (the lock is held): once the last ones taken are written.

        So at most twice :attr:`hold` is held: the rows being written, and those gathering meanwhile.
        """
        self._writing.acquire()
        held, self._pending, self._pending_bytes = self._pending, {}, 0
        return held

    def _write(self, held: dict[str, list[Columns]]) -> None:
        """Append one block to each bucket's file (:meth:`_take` acquired the writing lock for it), in its order."""
        try:
            self._write_blocks(held)
        finally:
            self._writing.release()

    def _write_blocks(self, held: dict[str, list[Columns]]) -> None:
        for name, pieces in held.items():
            file = self._files.get(name)
            if file is None:
                file = self._files[name] = ColumnFile(self.folder.create(name), self.template)
            file.append_pieces(pieces)
            file.close()  # many buckets: their descriptors are not kept

    @property
    def row_bytes(self) -> int:
        """A row's bytes over every column (0 before the first row)."""
        return self._row_bytes()

    def settle(self) -> None:
        """Split each bucket larger than ``room`` bytes into enough parts, on disk, a block of rows at a time."""
        self.flush()
        try:
            self._split()
        finally:
            self.holding.free()

    def _split(self) -> None:
        if not self.template:
            return
        for b in range(self.buckets):
            rows = self._files[str(b)].rows if str(b) in self._files else 0
            if rows * self._row_bytes() <= self.room:
                continue
            self.subs[b] = subs = math.ceil(rows * self._row_bytes() / max(1, self.room))
            for chunk in self._read(str(b)):
                series = np.stack([chunk[f"k{i}"].astype(np.int64, copy=False) for i in range(self.n_key)])
                self._append(self.part_of(series, b, subs), chunk, functools.partial("{}-{}".format, b))
            self.flush()
            self._unlink(str(b))

    def load(self, p: int) -> list[Columns]:
        """Pass ``p``'s rows, a chunk of columns a block (none if it has no rows); its file is removed."""
        chunks = self.read(p)
        self._unlink(self._prefix(p))  # read: its disk is given back as the passes go
        return chunks

    def read(self, p: int) -> list[Columns]:
        """Pass ``p``'s rows, a chunk of columns a block (none if it has no rows); its file stays, to be read again."""
        return list(self._read(self._prefix(p)))

    def _prefix(self, p: int) -> str:
        """The file of pass ``p``: its bucket's, or its part of a split bucket's."""
        first = np.cumsum(self.subs) - self.subs
        b = int(np.searchsorted(first, p, side="right")) - 1
        return str(b) if self.subs[b] == 1 else f"{b}-{p - first[b]}"

    def _row_bytes(self) -> int:
        return sum(d.itemsize * math.prod(s) for d, s in self.template.values())

    def _read(self, prefix: str) -> Iterator[Columns]:
        """The blocks of ``prefix``'s file, each as columns (views of one read of the block), in the order written."""
        file = self._files.get(prefix)
        if file is not None:
            try:
                yield from file.read_blocks()
            finally:
                file.close()

    def _unlink(self, prefix: str) -> None:
        file = self._files.pop(prefix, None)
        if file is not None:
            file.remove()

    def remove(self) -> None:
        """Delete the pass files."""
        self.folder.remove()


class EpochRanges(Partition):
    """Rows split by ranges of their epoch's order hash: pass after pass, each a stretch of the epoch.

    The epoch's order is by a 64-bit hash of each sample's key (:mod:`pgprefetch.write.order.shuffle`), so the
    keys whose hash falls in one range are one stretch of the epoch, and the ranges in turn are the epoch:
    rows, each its own sample (not windows, which must stay with their series), need no order of the whole
    and no routing of samples to passes (:mod:`.stretches`). Bucket ``b`` of ``B`` holds the hashes whose top
    32 bits ``t`` have ``t * B >> 32 == b``; a bucket split by :meth:`settle` is cut into sub-ranges of ``t``
    the same way, so every pass is still one range and the passes stay in the order's order. Equal keys hash
    alike: a repeated key lies in one pass, whose order finds it.
    """

    def __init__(
        self,
        folder: SpillFolder,
        buckets: int,
        n_key: int,
        room: int,
        hold: int | None = None,
        *,
        seed: int,
        epoch: int,
    ) -> None:
        super().__init__(folder, min(buckets, 1 << 31), n_key, room, hold)
        self.seed, self.epoch = seed, epoch

    def _top(self, series: np.ndarray) -> np.ndarray:
        """The top 32 bits of each key's order hash (what orders the passes), as uint64."""
        return key_hash(series, seed=self.seed, epoch=self.epoch) >> np.uint64(32)

    def bucket_of(self, series: np.ndarray) -> np.ndarray:
        """The range of the order hash each key falls in: ``t * buckets >> 32``."""
        return ((self._top(series) * np.uint64(self.buckets)) >> np.uint64(32)).astype(np.int64)

    def part_of(self, series: np.ndarray, bucket: int, subs: int) -> np.ndarray:
        """The sub-range of ``bucket``'s range each of its keys falls in (``subs`` about equal ones, in order)."""
        lo = -(-(bucket << 32) // self.buckets)  # the bucket's smallest top-32-bit value, and past its largest
        hi = -(-((bucket + 1) << 32) // self.buckets)
        part: np.ndarray = (self._top(series) - np.uint64(lo)) * np.uint64(subs) // np.uint64(max(1, hi - lo))
        out: np.ndarray = np.minimum(part, np.uint64(subs - 1)).astype(np.int64)
        return out


def bucket_count(rows: float, row_bytes: float, room: int) -> int:
    """Buckets for about ``rows`` rows of ``row_bytes`` so that each fits ``room`` bytes, with a margin for skew.

    A bucket that still outgrows it (an estimate too low) is split by :meth:`Partition.settle`.
    """
    return max(1, math.ceil(1.25 * rows * row_bytes / max(1, room)))


def pass_table(shape: ScanShape, partition: Partition, p: int) -> Table:
    """Pass ``p`` of ``partition`` as a read range's table: joined and sorted by (key, order)."""
    return assemble(shape, partition.load(p), empty_ok=True)
