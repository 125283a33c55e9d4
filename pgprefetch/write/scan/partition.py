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
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from pgprefetch.write.files.shardfiles import io_errors
from pgprefetch.write.order.shuffle import key_hash
from pgprefetch.write.scan.copystream import Columns
from pgprefetch.write.scan.passes import fresh_folder
from pgprefetch.write.scan.shape import ScanShape
from pgprefetch.write.scan.table import Table, assemble

_BUCKET_STREAM = 0x627563686574  # "bucket": the hash that puts a series in its bucket
_SPLIT_STREAM = 0x73706C6974  # "split": the hash that splits an oversized bucket


class Partition:
    """Rows split into passes by a hash of their series key (``n_key`` key slots): a file per column and pass.

    ``buckets`` is chosen before the read (:func:`bucket_count`); :meth:`settle` splits the buckets that
    outgrew ``room`` bytes (a pass's share of the budget) after it. Pass ``p`` of :meth:`load` is the pass
    :meth:`pass_of` names.
    """

    def __init__(self, folder: Path, buckets: int, n_key: int, room: int, hold: int | None = None) -> None:
        self.folder, self.buckets, self.n_key, self.room = folder, max(1, buckets), n_key, room
        self.hold = max(1 << 20, room if hold is None else hold)  # the rows held before they are written
        self._pending: dict[str, list[Columns]] = {}  # each file's rows not written yet, by chunk
        self._pending_bytes = 0
        self._blocks: dict[str, list[int]] = {}  # each file's blocks, their rows
        self.rows = 0
        self.subs = np.ones(self.buckets, np.int64)  # each bucket's passes (1 unless :meth:`settle` split it)
        self.template: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}  # each column's dtype and row shape
        self._lock = threading.Lock()  # the COPYs' chunks are decoded (and so added) on several threads
        fresh_folder(folder)  # a killed dump's leftovers go: the files are appended to

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
        order = np.argsort(where, kind="stable")
        edges = np.concatenate([[0], np.flatnonzero(np.diff(where[order])) + 1, [order.size]])
        grouped = {name: np.ascontiguousarray(v[order]) for name, v in columns.items()}
        with self._lock:
            for lo, hi in itertools.pairwise(edges):
                pieces = self._pending.setdefault(prefix(int(where[order[lo]])), [])
                pieces.append({name: v[lo:hi] for name, v in grouped.items()})
            self._pending_bytes += sum(v.nbytes for v in grouped.values())
            if self._pending_bytes >= self.hold:
                self._flush()

    def flush(self) -> None:
        """Write every row held (the read is over)."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        """Append one block to each bucket's file: its held rows, column after column (the lock is held)."""
        with io_errors(self.folder):
            for files, pieces in self._pending.items():
                rows = sum(p["k0"].shape[0] for p in pieces)
                with open(self.folder / files, "ab") as f:
                    for name in self.template:
                        for p in pieces:
                            f.write(p[name].data.cast("B"))
                self._blocks.setdefault(files, []).append(rows)
        self._pending.clear()
        self._pending_bytes = 0

    def settle(self) -> None:
        """Split each bucket larger than ``room`` bytes into enough parts, on disk, a block of rows at a time."""
        self.flush()
        if not self.template:
            return
        for b in range(self.buckets):
            rows = sum(self._blocks.get(str(b), ()))
            if rows * self._row_bytes() <= self.room:
                continue
            self.subs[b] = subs = math.ceil(rows * self._row_bytes() / max(1, self.room))
            for chunk in self._read(str(b)):
                series = np.stack([chunk[f"k{i}"].astype(np.int64, copy=False) for i in range(self.n_key)])
                h = key_hash(series, seed=0, epoch=0, stream=_SPLIT_STREAM)
                self._append((h % np.uint64(subs)).astype(np.int64), chunk, functools.partial("{}-{}".format, b))
            self.flush()
            self._unlink(str(b))

    def load(self, p: int) -> list[Columns]:
        """Pass ``p``'s rows, a chunk of columns a block (none if it has no rows); its file is removed."""
        prefix = self._prefix(p)
        chunks = list(self._read(prefix))
        self._unlink(prefix)  # read: its disk is given back as the passes go
        return chunks

    def keys(self, p: int, width: int, order_offset: int = 0) -> np.ndarray:
        """Pass ``p``'s key and order slots ``(width, m)`` int64, as the rows came; its file stays for :meth:`load`."""
        prefix = self._prefix(p)
        blocks = self._blocks.get(prefix, [])
        keys = np.empty((width, sum(blocks)), np.int64)
        at = 0
        for chunk in self._read(prefix, [f"k{i}" for i in range(width)]):
            n = chunk["k0"].shape[0]
            for i in range(width):
                keys[i, at : at + n] = chunk[f"k{i}"]
            at += n
        if order_offset:
            keys[-1] += order_offset
        return keys

    def _prefix(self, p: int) -> str:
        """The file of pass ``p``: its bucket's, or its part of a split bucket's."""
        first = np.cumsum(self.subs) - self.subs
        b = int(np.searchsorted(first, p, side="right")) - 1
        return str(b) if self.subs[b] == 1 else f"{b}-{p - first[b]}"

    def _row_bytes(self) -> int:
        return sum(d.itemsize * math.prod(s) for d, s in self.template.values())

    def _read(self, prefix: str, names: list[str] | None = None) -> Iterator[Columns]:
        """The blocks of ``prefix``'s file, each as columns (only ``names``, if given), in the order written."""
        offset = 0
        with io_errors(self.folder):
            for rows in self._blocks.get(prefix, []):
                chunk = {}
                for name, (dtype, shape) in self.template.items():
                    size = rows * math.prod(shape) * dtype.itemsize
                    if names is None or name in names:
                        data = np.fromfile(self.folder / prefix, dtype, rows * math.prod(shape), offset=offset)
                        chunk[name] = data.reshape(-1, *shape)
                    offset += size
                yield chunk

    def _unlink(self, prefix: str) -> None:
        (self.folder / prefix).unlink(missing_ok=True)
        self._blocks.pop(prefix, None)

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
