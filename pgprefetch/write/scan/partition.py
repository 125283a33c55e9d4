"""A table larger than ``[source] memory``, read once and split by key range on local disk: the data passes.

The data passes of a table that does not fit (:mod:`pgprefetch.write.scan.passes`) used to COPY each key range
of the table on its own (``WHERE (key) >= (lo) AND (key) < (hi)``). Without an index on the key every such
COPY scanned the whole table (a 3.6M-row table of windows under 64 MiB: 4x the time of the dump in memory),
and with one, a table not stored in key order was read by index lookups scattered over its pages.

Instead the table is read once, by the same parallel page-range COPY as a table that fits, and each decoded
chunk is split by key range (:func:`~pgprefetch.write.scan.keyspill.ranks` against the passes' bounds) and
appended, column by column, to its pass's files: a distribution sort, as the spool does for batches. A pass
then loads its files (its rows, about ``memory`` bytes) and is joined, sorted and cut as a read range is. The
extra cost is the decoded table written and read once on local disk; what is held is a COPY chunk at a time.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.pg.session import BatchReader, Snapshot
from pgprefetch.write.files.shardfiles import io_errors
from pgprefetch.write.scan.copystream import Columns, CopyDecoder
from pgprefetch.write.scan.keyspill import ranks
from pgprefetch.write.scan.shape import ScanShape, copy_select, vocabularies
from pgprefetch.write.scan.table import Table, assemble, copy_drain_bytes, page_ranges
from pgprefetch.write.tasks import first_error


class Partition:
    """Rows split into passes by their series key: pass ``ranks(bounds, key) // group``, a file per column and pass.

    ``bounds`` ``(n_key, L)``: sorted series keys, each the first of a key range; ``group`` consecutive ranges
    make a pass (the spilled keys' passes group one range a connection; a table's own passes are one range each).
    """

    def __init__(self, folder: Path, bounds: np.ndarray, group: int, n_key: int) -> None:
        self.folder, self.bounds, self.group, self.n_key = folder, bounds, max(1, group), n_key
        self.passes = bounds.shape[1] // self.group + 1
        self.rows = 0
        self._template: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}  # each column's dtype and row shape
        self._lock = threading.Lock()  # the COPYs' chunks are decoded (and so added) on several threads
        shutil.rmtree(folder, ignore_errors=True)  # a killed dump's leftovers: the files are appended to
        with io_errors(folder):
            folder.mkdir(parents=True, mode=0o700)  # the table's rows: for this user only

    def add(self, columns: Columns) -> None:
        """Append a decoded chunk's rows, each to its pass's files."""
        n = columns["k0"].size
        if not n:
            return
        series = np.stack([columns[f"k{i}"].astype(np.int64, copy=False) for i in range(self.n_key)])
        passes = ranks(self.bounds, series) // self.group
        del series
        order = np.argsort(passes, kind="stable")
        cuts = np.flatnonzero(np.diff(passes[order])) + 1
        with self._lock, io_errors(self.folder):
            for name, v in columns.items():
                self._template.setdefault(name, (v.dtype, v.shape[1:]))
            for rows in np.split(order, cuts):
                p = int(passes[rows[0]])
                for name, v in columns.items():
                    with open(self.folder / f"{p}.{name}", "ab") as f:
                        f.write(np.ascontiguousarray(v[rows]).tobytes())
            self.rows += n

    def load(self, p: int) -> list[Columns]:
        """Pass ``p``'s rows as one chunk of columns (none if it has no rows)."""
        with io_errors(self.folder):
            if not (self.folder / f"{p}.k0").exists():
                return []
            chunk = {
                name: np.fromfile(self.folder / f"{p}.{name}", dtype=dtype).reshape(-1, *shape)
                for name, (dtype, shape) in self._template.items()
            }
        for name in chunk:
            (self.folder / f"{p}.{name}").unlink()  # read: its disk is given back as the passes go
        return [chunk]

    def remove(self) -> None:
        """Delete the pass files."""
        shutil.rmtree(self.folder, ignore_errors=True)


async def partition_table(
    cfg: Config,
    snap: Snapshot,
    shape: ScanShape,
    partition: Partition,
    on_rows: Callable[[int], None] | None = None,
) -> int:
    """COPY the whole relation on ``snap`` (page ranges over the connections) into ``partition``; the rows read."""
    ranges = await page_ranges(snap, shape, cfg.source.connections)
    drain = copy_drain_bytes(cfg, len(ranges))
    decoders = [CopyDecoder(shape, on_rows, drain, route=partition.add) for _ in ranges]

    def sink(decoder: CopyDecoder) -> Callable[[bytes], object]:
        async def take(data: bytes) -> None:
            if decoder.feed(data):  # decoded (and written) on a thread: the other COPYs keep streaming
                await asyncio.to_thread(decoder.drain)

        return take

    async with BatchReader.open(cfg.source, snap.id, None, vocabularies=vocabularies(shape)) as workers:
        copies = [
            workers.copy(f"reading {shape.relation}", copy_select(shape, where), sink(d))
            for d, where in zip(decoders, ranges, strict=True)
        ]
        await first_error(copies)
    for d in decoders:
        await asyncio.to_thread(d.finish)
    return partition.rows


def pass_table(shape: ScanShape, partition: Partition, p: int) -> Table:
    """Pass ``p`` of ``partition`` as a read range's table: joined and sorted by (key, order)."""
    return assemble(shape, partition.load(p), empty_ok=True)
