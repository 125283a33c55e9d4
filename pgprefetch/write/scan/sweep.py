"""Windows beyond memory gathered a group of batches at a time, by reading the rows file forward.

The data passes (:mod:`.multipass`) leave the table's rows sorted on local disk (:mod:`.rowsfile`) and each
window's start row spooled in the epoch's order (:class:`~.passes.Spool`). The epoch's windows lie anywhere
in the rows. Gathered a batch at a time, from a mapping, each window faulted its 1-2 pages of each file in,
and the pages went out again after the batch to hold the budget: 7 million faults for 2.8 GB of 48-row
windows at stride 1, at 10 µs each on a virtual machine, three times the dump's time in memory.

Here the writer's batches are gathered a *group* at a time, as many as the budget holds: the group's windows
are sorted by start row, the rows file is read forward in pieces (skipping stretches no window of the group
starts in), and each piece's windows are gathered by the code that gathers from a table in memory
(:func:`~.table.gather`), into the group's arrays in start order. A unit's batches are then taken from them in
the epoch's order. A group costs one read of the rows it touches (6 GB/s from the page cache), shared by its
thousands of windows, instead of a fault per page per window.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np

from pgprefetch.decode.layout import BatchLayout
from pgprefetch.write.budget import Account
from pgprefetch.write.plan import EpochPlan
from pgprefetch.write.scan.passes import Spool
from pgprefetch.write.scan.rowsfile import RowsFile
from pgprefetch.write.scan.table import gather

# A gap between two windows' rows read through rather than skipped (one read fewer costs about this much).
GAP_BYTES = 64 << 10
# Per sample of a group beside its arrays: its start, the sort's order and the sorted starts, its place.
GROUP_BYTES_PER_SAMPLE = 32


class Groups:
    """The epoch's batches of windows, gathered a group at a time from ``rows`` (:meth:`fill`).

    One group is held at a time and its arrays are reused: the writer's threads take their batches from it
    under a lock, and the first to need the next group gathers it.
    """

    def __init__(self, rows: RowsFile, layout: BatchLayout, plan: EpochPlan, spool: Spool, account: Account, size: int):
        self.rows, self.layout, self.plan, self.spool, self.size = rows, layout, plan, spool, size
        width = plan.key_columns.width
        per_sample = layout.sample_bytes + 16 * width + GROUP_BYTES_PER_SAMPLE
        self.group_batches = max(1, min(plan.n_batches, account.sweep_group_bytes() // per_sample // size))
        samples = self.group_batches * size
        self._arrays = layout.allocate(samples)  # held for the write: a group's samples in start order
        self._place = np.empty(samples, np.int64)  # each epoch position's index in ``_arrays``
        self._loaded, self._count = -1, 0  # the group held, and its samples
        self._lock = threading.Lock()
        window_bytes = layout.rows * max(1, rows.row_bytes)
        self._gather = account.gather_samples(max(layout.sample_bytes, window_bytes))
        self._read_rows = max(layout.rows, account.sweep_read_bytes() // max(1, rows.row_bytes))
        self._gap_rows = max(1, GAP_BYTES // max(1, rows.row_bytes))
        rows.open(self._read_rows + layout.rows)

    def fill(self, batch: int, count: int, buffers: dict[str, np.ndarray]) -> None:
        """Fill ``buffers`` with batches ``batch`` to ``batch + count`` (gathering their groups when reached)."""
        for i in range(count):
            b = batch + i
            g = b // self.group_batches
            with self._lock:
                if g != self._loaded:
                    self._loaded = -1  # a group that failed halfway is not handed out
                    self._load(g)
                    self._loaded = g
                first = (b - g * self.group_batches) * self.size
                n = min(self.size, self._count - first)
                if n <= 0:
                    break
                place = self._place[first : first + n]
                for name, array in self._arrays.items():
                    np.take(array, place, axis=0, out=buffers[name][i * self.size : i * self.size + n], mode="clip")

    def _load(self, g: int) -> None:
        """Gather group ``g``'s windows into :attr:`_arrays`, in start order, and where each goes (:attr:`_place`)."""
        first_batch = g * self.group_batches
        batches = min(self.group_batches, self.plan.n_batches - first_batch)
        keys = self.plan.batch_keys(first_batch, self.size, batches)
        n = keys.shape[1]
        starts = np.empty(batches * self.size, np.int64)
        for i in range(batches):
            self.spool.batch(first_batch + i, {"start": starts[i * self.size : (i + 1) * self.size]})
        order = np.argsort(starts[:n], kind="stable")
        starts = starts[order]
        self._place[order] = np.arange(n)
        keys = keys[:, order]
        self._count = n
        window = self.layout.rows
        for a, b in self._pieces(starts):
            lo = int(starts[a])
            table = self.rows.read(lo, int(starts[b - 1]) + window)
            for j in range(a, b, self._gather):
                k = min(j + self._gather, b)
                out = {name: array[j:k] for name, array in self._arrays.items()}
                gather(table, self.layout, starts[j:k] - lo, keys[:, j:k], out)

    def _pieces(self, starts: np.ndarray) -> Iterator[tuple[int, int]]:
        """Runs of the sorted ``starts`` read at once: within one stretch of read rows, no long gap inside."""
        step = max(1, self._read_rows)
        cuts = (np.diff(starts // step) != 0) | (np.diff(starts) > self._gap_rows)
        bounds = np.concatenate([[0], np.flatnonzero(cuts) + 1, [starts.size]])
        yield from zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
