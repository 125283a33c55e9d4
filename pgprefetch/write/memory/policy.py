"""Who may hold what of ``--memory``, and when: every sizing rule of a dump, in the order of its phases.

``--memory`` is the process's memory (a container's limit), not the table's: the peak RSS stays within
*floor + budget + slack*, :data:`FLOOR` being the interpreter and its imports and :data:`SLACK` the measured
rest (asyncpg's receive buffers, zarr's metadata). The pool (:mod:`.pool`) holds the reservations; this
module says how large each may be. The shares add up because of the order in time:

1. **Always**: the heap's kept memory (:func:`heap_bytes`, reserved for the whole dump; glibc is told to
   keep no more by :func:`pgprefetch.write.memory.heap.fit`).
2. **Reading** (no batch buffer exists yet): keys collected (:meth:`Policy.keys_bytes`: half the data's
   share beside a scan's partition, all of it in query mode); the COPYs' undecoded bytes
   (:meth:`Policy.copy_drain_bytes`); rows held before a partition writes them
   (:meth:`Policy.partition_hold_bytes`); a table read whole (:meth:`Policy.in_memory_bytes`).
3. **Cutting** (still no batch buffer): a stretch of rows (:meth:`Policy.stretch_bytes`) or a data pass
   (:meth:`Policy.pass_bytes`), and the samples gathered from it at once (:meth:`Policy.gather_samples`).
4. **Writing**: the writer's units in flight and its threads' temporaries (:func:`writer_bytes`, charged
   first: :attr:`Policy.data` is what is left), beside what the source holds: the epoch's keys and plan
   when they fit, a table read whole, or a group of windows (:meth:`Policy.sweep_group_bytes`).

A way of reading whose holders do not fit is not taken (:mod:`pgprefetch.write.scan.strategy`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

MIB = 1 << 20
DRAIN_BYTES = 8 * MIB  # the most of one COPY stream decoded at once
# What a dump of a 1,000-row table peaks at (the interpreter, numpy, zarr, asyncpg and the dump's fixed
# buffers): 52-53 MiB measured by bench.memory on Linux x86-64, CPython 3.11; the floor the budget sits on.
FLOOR = 56 * MIB
# The peak's margin over floor + budget, measured: the worst of bench.memory's jobs was 2-25 MiB over the
# budget's own share (asyncpg's 64 KiB receive buffers per connection, zarr's and the manifest's objects).
SLACK = 32 * MIB
# The least budget the shares below add up within: under it their floors (a 1 MiB heap arena each, 256 KiB
# units, 64 KiB COPY drains, 4,096 keys a run) take more than the budget, and a dump holds those floors.
LEAST_BUDGET = 16 * MIB
READ_COPIES = 2  # a scan's decoded chunks, then the joined, sorted columns (the chunks go as they are joined)
SORT_BYTES_PER_ROW = 16  # the sort of a read's keys: its order and the sorted copy's index
PASS_COPIES = 4  # a data pass's rows: the chunks, the joined columns, their sorted copy, the windows cut
STRETCH_COPIES = 2  # a stretch's rows: the chunks, then the joined columns (put in order, never sorted by key)
GATHER_BYTES = 8 * MIB  # the most samples gathered at once (a stretch's, a group of windows' piece)
# The most rows a stretch holds, however large the budget: beyond it, larger stretches only hold more memory
# (20M rows of 17 columns: 21.5 s in 11 stretches under 512 MiB, 22.9 s in 8 of this size under 16 GiB).
STRETCH_MOST = 256 * MIB
# The estimate must put the table this far past memory before the read is skipped: an estimate a little
# high would cost a slower dump of the same bytes; one too low is caught by the read itself. A refusal's
# least budget for a read in memory counts the rows this much larger, for the same reason.
ESTIMATE_MARGIN = 1.1
# Windows stored as starts (write/scan/starts.py): beside the table, a table row's share of placing its windows
# (a bincount, counts and their shifted copy, the kept rows: 21 bytes measured at the peak), which the fit adds.
STARTS_ROW_BYTES = 24
# Per sample of a scan epoch: its keys in key order and in epoch order, the shuffle's index and hash, its
# start row and its start in epoch order (8 bytes each but the keys'): the in-memory plan's arrays.
PLAN_BYTES_PER_SAMPLE = 32
# Per row of a stretch (:mod:`pgprefetch.write.scan.strategy.stretches`): its order's hash, packed copy and
# index, its tie runs, the ordered keys' copy and the gathered rows' index.
ORDER_BYTES_PER_ROW = 48


def expected_peak(budget: int, working: int | None = None) -> int:
    """The peak RSS a dump under ``budget`` is expected to stay within: the floor, its working set, the slack.

    ``working``: what this epoch needs held at once, where it is known (query mode's keys); it is taken
    from the budget, so at most the budget is counted.
    """
    return FLOOR + (budget if working is None else min(budget, working)) + SLACK


def key_bytes(width: int) -> int:
    """A sample's keys, ``width`` int64 slots, in key order and in epoch order."""
    return 16 * width


def plan_bytes(samples: int, width: int) -> int:
    """What a scan epoch's plan holds for ``samples`` samples of ``width`` key slots."""
    return samples * (key_bytes(width) + PLAN_BYTES_PER_SAMPLE)


def heap_bytes(budget: int) -> int:
    """The freed memory glibc may keep for reuse under ``budget`` (two arenas, each trimmed past this much)."""
    return 2 * trim_threshold(budget)


def trim_threshold(budget: int) -> int:
    """Glibc's trimming threshold for ``budget``: 1/32 of it, between 1 and 128 MiB (32 MiB at 1 GiB)."""
    return max(MIB, min(128 * MIB, budget // 32))


def mmap_threshold(budget: int) -> int:
    """Glibc's mapping threshold: blocks above it are mapped on their own and returned when freed."""
    return max(MIB // 4, min(32 * MIB, budget // 64))


UNIT_BYTES = 4 * MIB  # the most batch buffer bytes a unit of several batches holds, under a large budget


def unit_bytes(budget: int) -> int:
    """A unit's batch buffers under ``budget``: 1/32 of it, between 256 KiB and :data:`UNIT_BYTES`."""
    return max(MIB // 4, min(UNIT_BYTES, budget // 32))


def writer_bytes(unit_bytes: int, key_bytes_per_unit: int, in_flight: int, threads: int) -> int:
    """The writer's memory: every unit's buffers, and each writing thread's temporaries (about 3 units).

    The temporaries are the gathered rows, their cast, and the statistics' per-batch arrays.
    """
    return in_flight * (unit_bytes + key_bytes_per_unit) + threads * 3 * unit_bytes


@dataclass(frozen=True)
class Policy:
    """One dump's budget (``[source] memory``), shared out: the writer's and the heap's part, the data's rest."""

    budget: int
    writer: int = 0

    @property
    def data(self) -> int:
        """What a source may hold: the budget less the writer and the heap's kept memory (at least 1/4 of it)."""
        return max(self.budget // 4, self.budget - self.writer - heap_bytes(self.budget))

    @classmethod
    def for_scan(cls, budget: int, threads: int = 2) -> Policy:
        """A scan dump's account: ``threads`` units in flight, as many threads writing (``BatchSource``)."""
        unit = unit_bytes(budget)
        return cls(budget, writer_bytes(unit, unit // 4, threads, threads))

    def in_memory_bytes(self, rows: int, row_bytes: float, samples: int, width: int) -> int:
        """A scan read held whole: its peak while it is joined and sorted, or with the epoch's plan beside it."""
        table = rows * row_bytes
        read = READ_COPIES * table + SORT_BYTES_PER_ROW * rows
        return int(max(read, table + plan_bytes(samples, width)))

    def fits_in_memory(self, rows: int, row_bytes: float, samples: int, width: int) -> bool:
        """Whether the table, read whole, and its epoch fit :attr:`data`."""
        return self.in_memory_bytes(rows, row_bytes, samples, width) <= self.data

    def keys_bytes(self, *, beside_rows: bool) -> int:
        """Keys collected and ordered in memory before they go to disk (:mod:`pgprefetch.write.order.spill`).

        Held through the write when they fit, so within the data's share; half of it beside a scan's rows
        (a partition's held rows, then a pass's).
        """
        return self.data // 2 if beside_rows else self.data

    def copy_drain_bytes(self, copies: int, *, into_partition: bool) -> int:
        """How much of each of ``copies`` COPY streams is decoded at once, all within a share of the data's.

        A 16th beside a table read whole (which grows beside them); a table streamed into a partition holds
        only its held rows beside the COPYs, and takes a 4th (each drain is a hand-over to a thread and back).
        Never more than :data:`DRAIN_BYTES` a stream.
        """
        share = 4 if into_partition else 16
        return max(64 << 10, min(DRAIN_BYTES, self.data // (share * max(1, copies))))

    def pass_bytes(self) -> int:
        """A data pass's decoded rows: beside the keys' half of :attr:`data` (the windows cut are ordered)."""
        return max(1, (self.data - self.data // 2) // PASS_COPIES)

    def cutting_bytes(self) -> int:
        """What cutting rows into stretches may hold in all: the budget less the heap's (no writer exists yet)."""
        return max(self.data, self.budget - heap_bytes(self.budget))

    def stretch_bytes(self, row_bytes: float) -> int:
        """A stretch's decoded rows: :data:`STRETCH_COPIES` of them and their order, beside a gather of samples.

        Rows beyond memory read in the epoch's order hold no keys of the whole epoch, and the stretches are
        all written before the writer's units exist: a stretch has what cutting may hold
        (:meth:`cutting_bytes`) less the samples it gathers at once (a 16th of the data's share).
        """
        room = self.cutting_bytes() - self.data // 16
        rows = max(1.0, room / (STRETCH_COPIES * max(1.0, row_bytes) + ORDER_BYTES_PER_ROW))
        return max(1, min(STRETCH_MOST, int(rows * row_bytes)))

    def partition_hold_bytes(self) -> int:
        """The rows a partition holds before it writes them (twice at most: a block written, the next gathered).

        While the table streams in, nothing else is held but the COPYs' undecoded bytes (a 4th of the data's
        share): larger blocks are fewer writes, and fewer reads when a pass loads them. At most 16 MiB: a
        block is written while the COPYs' threads wait for the next to be taken (docs/memory.md).
        """
        return max(MIB, min(self.data // 4, 16 * MIB))

    def sweep_group_bytes(self, threads: int, keys: int = 0) -> int:
        """Windows beyond memory as they are written: the group of batches gathered at once (:mod:`.scan.sweep`).

        Beside it: the epoch's order where it is held (``keys``: the windows' keys and start rows, which fit
        half the share: not on disk) and, for each of the ``threads`` gathering, the rows it reads at once
        (:meth:`sweep_read_bytes`) and the windows it gathers from them (:meth:`gather_samples`); the data
        passes are done, their rows on disk.
        """
        each = self.sweep_read_bytes() + self.data // 16
        return max(MIB, self.data - keys - threads * each)

    def sweep_read_bytes(self) -> int:
        """The rows file's bytes a thread reads at once for a group's windows: a 16th of the data's share."""
        return max(MIB // 4, self.data // 16)

    def gather_samples(self, sample_bytes: int) -> int:
        """Samples a pass gathers at once: its cast rows within :data:`GATHER_BYTES` and a 16th of the data."""
        return max(1, min(GATHER_BYTES, self.data // 16) // max(1, sample_bytes))


def least_budget(fits: Callable[[Policy], bool]) -> int:
    """The least budget (a whole MiB) whose scan policy ``fits`` says holds what is asked (for one-line refusals)."""
    high = MIB
    while not fits(Policy.for_scan(high)):
        high *= 2
    low = high // 2
    while high - low > MIB:
        mid = (low + high) // 2 // MIB * MIB
        if fits(Policy.for_scan(mid)):
            high = mid
        else:
            low = mid
    return high


def smallest_budget(pass_rows_bytes: int) -> int:
    """The least budget (a whole MiB) whose data passes hold ``pass_rows_bytes`` of decoded rows at once.

    For the one-line error of a series no pass under the budget can hold (it cannot be split: its windows
    would be).
    """
    return least_budget(lambda policy: policy.pass_bytes() >= pass_rows_bytes)
