"""A table larger than ``[source] memory``, read once and split into passes of whole series on local disk.

The data passes of a table that does not fit (:mod:`pgprefetch.write.scan.passes`) used to COPY each key
range of the table on its own (``WHERE (key) >= (lo) AND (key) < (hi)``), after a first COPY of the keys.
Without an index on the key every such COPY scanned the whole table (a 3.6M-row table of windows under
64 MiB: 4x the time of the dump in memory); with one, a table not stored in key order was read by index
lookups scattered over its pages.

Now the keys pass COPYs every column, once: its keys go to the keys pass as before, and each decoded chunk
is split by a hash of its series key into buckets, appended column by column to the bucket's files (a
distribution sort, as the spool does for batches). A bucket holds whole series, so a pass loads one
bucket's files and joins, sorts and cuts them as a read range is. The number of buckets comes from the
planner's row estimate; a bucket that still came out larger than a pass's share of the budget (a SELECT
has no estimate) is split again on disk, a chunk of rows at a time, before any pass is loaded. The server
reads the table once; the client writes and reads the decoded table once on local disk.
"""

from __future__ import annotations

import functools
import itertools
import math
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pgprefetch.write.files.shardfiles import io_errors
from pgprefetch.write.order.shuffle import key_hash
from pgprefetch.write.scan.copystream import Columns
from pgprefetch.write.scan.shape import ScanShape
from pgprefetch.write.scan.table import Table, assemble

_BUCKET_STREAM = 0x627563686574  # "bucket": the hash that puts a series in its bucket
_SPLIT_STREAM = 0x73706C6974  # "split": the hash that splits an oversized bucket
SPLIT_ROWS = 1 << 18  # rows of an oversized bucket re-split at once


class Partition:
    """Rows split into passes by a hash of their series key (``n_key`` key slots): a file per column and pass.

    ``buckets`` is chosen before the read (:func:`bucket_count`); :meth:`settle` splits the buckets that
    outgrew ``room`` bytes (a pass's share of the budget) after it. Pass ``p`` of :meth:`load` is the pass
    :meth:`pass_of` names.
    """

    def __init__(self, folder: Path, buckets: int, n_key: int, room: int) -> None:
        self.folder, self.buckets, self.n_key, self.room = folder, max(1, buckets), n_key, room
        self.rows = 0
        self.subs = np.ones(self.buckets, np.int64)  # each bucket's passes (1 unless :meth:`settle` split it)
        self.template: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}  # each column's dtype and row shape
        self._lock = threading.Lock()  # the COPYs' chunks are decoded (and so added) on several threads
        shutil.rmtree(folder, ignore_errors=True)  # a killed dump's leftovers: the files are appended to
        with io_errors(folder):
            folder.parent.mkdir(parents=True, mode=0o700, exist_ok=True)  # the epoch's spool: for this user only
            folder.mkdir(mode=0o700)

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
        h = key_hash(series, seed=0, epoch=0, stream=_SPLIT_STREAM)
        parts: np.ndarray = np.where(split, (h % subs.astype(np.uint64)).astype(np.int64), 0)
        out: np.ndarray = first + parts
        return out

    def add(self, columns: Columns) -> None:
        """Append a decoded chunk's rows, each to its bucket's files."""
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
        """Append the rows of ``columns`` to the files of ``prefix(where[row])``.

        The rows are put in bucket order (one gather a column) outside the lock; the lock keeps a bucket's
        column files in step (row ``i`` of each is the same row) when several COPYs' chunks arrive at once.
        """
        order = np.argsort(where, kind="stable")
        edges = np.concatenate([[0], np.flatnonzero(np.diff(where[order])) + 1, [order.size]])
        grouped = {name: np.ascontiguousarray(v[order]) for name, v in columns.items()}
        folder = str(self.folder)
        with self._lock, io_errors(self.folder):
            for lo, hi in itertools.pairwise(edges):
                files = prefix(int(where[order[lo]]))
                for name, v in grouped.items():
                    with open(f"{folder}/{files}.{name}", "ab") as f:
                        f.write(v[lo:hi].data.cast("B"))

    def settle(self) -> None:
        """Split each bucket larger than ``room`` bytes into enough parts, on disk, a chunk of rows at a time."""
        room = self.room
        if not self.template:
            return
        row_bytes = sum(d.itemsize * math.prod(s) for d, s in self.template.values())
        for b in range(self.buckets):
            rows = self._rows(str(b))
            if rows * row_bytes <= room:
                continue
            self.subs[b] = subs = math.ceil(rows * row_bytes / max(1, room))
            for lo in range(0, rows, SPLIT_ROWS):
                chunk = self._read(str(b), lo, min(rows, lo + SPLIT_ROWS))
                series = np.stack([chunk[f"k{i}"].astype(np.int64, copy=False) for i in range(self.n_key)])
                h = key_hash(series, seed=0, epoch=0, stream=_SPLIT_STREAM)
                self._append((h % np.uint64(subs)).astype(np.int64), chunk, functools.partial("{}-{}".format, b))
            self._unlink(str(b))

    def load(self, p: int) -> list[Columns]:
        """Pass ``p``'s rows as one chunk of columns (none if it has no rows); its files are removed."""
        prefix = self._prefix(p)
        if not self.template or not (self.folder / f"{prefix}.k0").exists():
            return []
        chunk = self._read(prefix, 0, None)
        self._unlink(prefix)  # read: its disk is given back as the passes go
        return [chunk]

    def keys(self, p: int, width: int, order_offset: int = 0) -> np.ndarray:
        """Pass ``p``'s key and order slots ``(width, m)`` int64, as the rows came; its files stay for :meth:`load`."""
        prefix = self._prefix(p)
        if not self.template or not (self.folder / f"{prefix}.k0").exists():
            return np.empty((width, 0), np.int64)
        with io_errors(self.folder):
            columns = [np.fromfile(self.folder / f"{prefix}.k{i}", self.template[f"k{i}"][0]) for i in range(width)]
        keys = np.empty((width, columns[0].size), np.int64)
        for i, c in enumerate(columns):
            keys[i] = c
        if order_offset:
            keys[-1] += order_offset
        return keys

    def _prefix(self, p: int) -> str:
        """The files of pass ``p``: its bucket's, or its part of a split bucket's."""
        first = np.cumsum(self.subs) - self.subs
        b = int(np.searchsorted(first, p, side="right")) - 1
        return str(b) if self.subs[b] == 1 else f"{b}-{p - first[b]}"

    def _rows(self, prefix: str) -> int:
        path = self.folder / f"{prefix}.k0"
        dtype, shape = self.template["k0"]
        return path.stat().st_size // (dtype.itemsize * math.prod(shape)) if path.exists() else 0

    def _read(self, prefix: str, lo: int, hi: int | None) -> Columns:
        """Rows ``lo:hi`` of the files of ``prefix`` (``hi`` None: to the end)."""
        out = {}
        with io_errors(self.folder):
            for name, (dtype, shape) in self.template.items():
                items = math.prod(shape)  # per row
                count = -1 if hi is None else (hi - lo) * items
                path, offset = self.folder / f"{prefix}.{name}", lo * items * dtype.itemsize
                data = np.fromfile(path, dtype=dtype, count=count, offset=offset)
                out[name] = data.reshape(-1, *shape)
        return out

    def _unlink(self, prefix: str) -> None:
        for name in self.template:
            (self.folder / f"{prefix}.{name}").unlink(missing_ok=True)

    def remove(self) -> None:
        """Delete the pass files."""
        shutil.rmtree(self.folder, ignore_errors=True)


def bucket_count(rows: float, row_bytes: float, room: int) -> int:
    """Buckets for about ``rows`` rows of ``row_bytes`` so that each fits ``room`` bytes, with a margin for skew.

    A bucket that still outgrows it (an estimate too low) is split by :meth:`Partition.settle`.
    """
    return max(1, math.ceil(1.25 * rows * row_bytes / max(1, room)))


def pass_table(shape: ScanShape, partition: Partition, p: int) -> Table:
    """Pass ``p`` of ``partition`` as a read range's table: joined and sorted by (key, order)."""
    return assemble(shape, partition.load(p), empty_ok=True)
