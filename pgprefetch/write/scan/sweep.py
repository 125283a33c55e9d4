"""Windows beyond memory gathered a group of batches at a time, by reading the rows file forward.

The data passes leave the table's rows sorted on local disk (:mod:`.rowsfile`), and the epoch's order carries
each window's start row there (:mod:`.keyspill`); the epoch's windows lie anywhere in the rows. Gathered a
batch at a time, each window would fault its page or two of each column in, and out again to hold the
budget. So the writer's batches are gathered a *group* at a time, as many as the budget holds: the group's
windows are sorted by start row, the rows file is read forward in pieces (skipping stretches no window of
the group starts in), and each piece's windows are gathered by the code that gathers from a table in memory
(:func:`~.table.gather`), into the group's arrays in start order. A unit's batches are then taken from them
in the epoch's order: one read of the rows a group touches, shared by its thousands of windows.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np

from pgprefetch.decode.layout import BatchLayout
from pgprefetch.write import memory
from pgprefetch.write.memory.policy import Policy
from pgprefetch.write.plan import EpochPlan
from pgprefetch.write.scan.rowsfile import RowsFile
from pgprefetch.write.scan.table import gather

# A gap between two windows' rows read through rather than skipped (one read fewer costs about this much).
GAP_BYTES = 64 << 10
# Per sample of a group beside its arrays: its start, the sort's order and the sorted starts, its place.
GROUP_BYTES_PER_SAMPLE = 32


class Groups:
    """The epoch's batches of windows, gathered a group at a time from ``rows`` (:meth:`fill`).

    One group is held at a time, in arrays reused by the next. The writer's threads (``threads``) take their
    batches from it; the first to need the next group plans it, and every thread that needs it gathers its
    pieces beside it. A group is replaced only once no other thread is taking batches from it, nor waiting
    for an earlier one: a thread ahead waits for the one behind, rather than the two gathering in turn.
    """

    def __init__(
        self,
        rows: RowsFile,
        layout: BatchLayout,
        plan: EpochPlan,
        size: int,
        starts: Callable[[int, int], np.ndarray],
        held: int,
        account: Policy,
        threads: int,
    ) -> None:
        """``starts(a, b)``: the start rows of the epoch's samples ``a`` to ``b``; ``held``: the order's bytes held."""
        self.rows, self.layout, self.plan, self.size, self.starts = rows, layout, plan, size, starts
        width = plan.key_columns.width
        per_sample = layout.sample_bytes + 16 * width + GROUP_BYTES_PER_SAMPLE
        group_bytes = account.sweep_group_bytes(threads, held)
        self.group_batches = max(1, min(plan.n_batches, group_bytes // per_sample // self.size))
        samples = self.group_batches * self.size
        # Held for the write: a group's samples in start order, and each thread's reads and gathers.
        memory.current().reserve("windows group", samples * per_sample + threads * account.sweep_read_bytes())
        self._arrays = layout.allocate(samples)
        self._place = np.empty(samples, np.int64)  # each epoch position's index in ``_arrays``
        self._starts = np.empty(0, np.int64)  # the group's start rows, sorted
        self._keys = np.empty((width, 0), np.int64)  # and their keys
        window_bytes = layout.rows * max(1, rows.row_bytes)
        self._gather = account.gather_samples(max(layout.sample_bytes, window_bytes))
        self._read_rows = max(layout.rows, account.sweep_read_bytes() // max(1, rows.row_bytes))
        self._gap_rows = max(1, GAP_BYTES // max(1, rows.row_bytes))
        self._local = threading.local()  # each thread's read buffers
        self._cond = threading.Condition()
        self._group, self._ready, self._count = -1, False, 0  # the group in the arrays, whether whole, its samples
        self._pieces: list[tuple[int, int]] = []
        self._next = self._left = 0  # the next piece to gather, and those not gathered yet
        self._at: dict[int, int] = {}  # the batch each filling thread is at
        self._failed: BaseException | None = None
        rows.open()

    def fill(self, batch: int, count: int, buffers: dict[str, np.ndarray]) -> None:
        """Fill ``buffers`` with batches ``batch`` to ``batch + count`` (gathering their groups when reached)."""
        me = threading.get_ident()
        try:
            for i in range(count):
                b = batch + i
                with self._cond:
                    self._at[me] = b
                    self._cond.notify_all()  # a thread waiting to replace the group may now
                    self._wait_for(b // self.group_batches, me)
                # Outside the lock: the group stays while this thread is at one of its batches.
                first = (b % self.group_batches) * self.size
                n = min(self.size, self._count - first)
                place = self._place[first : first + n]
                for name, array in self._arrays.items():
                    np.take(array, place, axis=0, out=buffers[name][i * self.size : i * self.size + n], mode="clip")
        finally:
            with self._cond:
                self._at.pop(me, None)
                self._cond.notify_all()

    def _wait_for(self, g: int, me: int) -> None:
        """Return once group ``g`` is in the arrays, gathering pieces of it meanwhile (the lock is held)."""
        while True:
            if self._failed is not None:
                raise self._failed
            if self._group == g:
                if self._ready:
                    return
                if self._next < len(self._pieces):
                    self._gather_next()
                    continue
            elif self._free_for(g, me):
                self._plan(g)
                continue
            self._cond.wait()

    def _free_for(self, g: int, me: int) -> bool:
        """Whether group ``g`` may replace the one held: no other thread is at a batch of it or of an earlier one.

        A thread may reach a later unit before the thread with the earlier one asks for its batches (the
        writer's threads start their units in any order): that one then waits until the group it is taking
        batches from is done with, and gathers its own group again.
        """
        others = [at // self.group_batches for t, at in self._at.items() if t != me]
        return all(other >= g and other != self._group for other in others)

    def _plan(self, g: int) -> None:
        """Put group ``g``'s windows in start order and cut them into pieces (the lock is held)."""
        self._group, self._ready = g, False
        try:
            first_batch = g * self.group_batches
            batches = min(self.group_batches, self.plan.n_batches - first_batch)
            keys = self.plan.batch_keys(first_batch, self.size, batches)
            n = keys.shape[1]
            first = first_batch * self.size
            starts = self.starts(first, first + n)
            order = np.argsort(starts, kind="stable")
            self._starts = starts[order]
            self._place[order] = np.arange(n)
            self._keys = keys[:, order]
            self._count = n
            self._pieces = list(self._cut(self._starts))
        except BaseException as e:
            self._group, self._failed = -1, e
            self._cond.notify_all()
            raise
        self._next, self._left = 0, len(self._pieces)
        self._ready = not self._pieces

    def _gather_next(self) -> None:
        """Gather the next piece of the group, outside the lock (held on entry and on return)."""
        a, b = self._pieces[self._next]
        self._next += 1
        self._cond.release()
        try:
            self._gather_piece(a, b)
        except BaseException as e:
            self._cond.acquire()
            self._failed = e
            self._cond.notify_all()
            raise
        self._cond.acquire()
        self._left -= 1
        if not self._left:
            self._ready = True
            self._cond.notify_all()

    def _gather_piece(self, a: int, b: int) -> None:
        """The windows ``a`` to ``b`` of the group (in start order), from one read of the rows they span."""
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = self.rows.buffers(self._read_rows + self.layout.rows)
        lo = int(self._starts[a])
        table = self.rows.read(lo, int(self._starts[b - 1]) + self.layout.rows, buffers)
        for j in range(a, b, self._gather):
            k = min(j + self._gather, b)
            out = {name: array[j:k] for name, array in self._arrays.items()}
            gather(table, self.layout, self._starts[j:k] - lo, self._keys[:, j:k], out)

    def _cut(self, starts: np.ndarray) -> Iterator[tuple[int, int]]:
        """Runs of the sorted ``starts`` read at once: within one stretch of read rows, no long gap inside."""
        step = max(1, self._read_rows)
        cuts = (np.diff(starts // step) != 0) | (np.diff(starts) > self._gap_rows)
        bounds = np.concatenate([[0], np.flatnonzero(cuts) + 1, [starts.size]])
        yield from zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True)
