"""A mixed epoch's scan source beyond its share of ``--memory``: its rows and its samples' keys on disk.

A mixed epoch takes from each source a run of its pass order (:mod:`.passes`): the keys from a position, by
``(hash, key)``. A scan source whose table does not fit its share is read once into a partition by series
(:class:`~pgprefetch.write.scan.partition.Partition`, the split windows beyond memory use: a bucket holds
every row of its keys, so a window's rows and a key's repeats are never apart), and then:

1. **Index** (:func:`index_partition`): each bucket is loaded, cut into samples and its keys chosen
   (repeats, ``fraction``: :func:`.passes.choose`), and the chosen keys are appended to one column file,
   each with its bucket and the row it starts at there. Their count is the source's pass length.
2. **Take** (:class:`SpilledPasses`): a run ``[i, j)`` of pass ``p``'s order is found without sorting the
   keys: one walk over the index counts the keys' pass hashes in :data:`BINS` ranges of their top bits; the
   ranges holding ranks ``i`` and ``j - 1`` bound the run, and a second walk collects the keys in them,
   sorted by ``(hash, key)`` as :meth:`.passes.Passes.order` sorts: the run's keys and a few around it.
3. **Gather** (:meth:`SpilledScan.gather`): the run's samples are gathered a bucket at a time (each
   loaded once), put into ranges of run positions on disk, and each range in turn is placed in run order
   and appended to the run file that the mixed epoch's units read, a range of it a unit.

What is held at once: a bucket (as a data pass of windows holds one), a block of the index, the run's
keys (which the epoch's plan holds anyway) and a range of the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.errors import SourceError
from pgprefetch.pg.columns import Column
from pgprefetch.write import memory
from pgprefetch.write.memory import heap
from pgprefetch.write.memory.policy import PASS_COPIES, Policy
from pgprefetch.write.mix.passes import Position, advance, choose, pass_hash, repeated_keys, segments
from pgprefetch.write.order.splits import split_keep
from pgprefetch.write.scan.cutpasses import check_pass_fits
from pgprefetch.write.scan.partition import Partition
from pgprefetch.write.scan.shape import ScanShape
from pgprefetch.write.scan.strategy.job import ScanJob, SplitRead
from pgprefetch.write.scan.strategy.passes import series_partition
from pgprefetch.write.scan.table import Table, array_lengths, assemble, cut, gather, longest_series, no_windows
from pgprefetch.write.spill.columns import ColumnFile, Schema
from pgprefetch.write.spill.folder import SpillFolder

log = logging.getLogger("pgprefetch")

BITS = 16  # the top bits of a pass hash a walk counts by
BINS = 1 << BITS
_SHIFT = np.uint64(64 - BITS)
BLOCK_ROWS = 1 << 18  # the most chosen keys a block of the index holds (a walk reads a block at a time)
_POSITION = "at"  # a run range's column: each sample's place in the run


class SpilledIndex:
    """A source's chosen samples on disk, in bucket order: each one's key slots, bucket and start row there."""

    def __init__(self, folder: SpillFolder, width: int) -> None:
        self.width = width
        self.names = [f"k{i}" for i in range(width)]
        schema: Schema = {name: (np.dtype(np.int64), ()) for name in self.names}
        schema |= {"bucket": (np.dtype(np.int32), ()), "start": (np.dtype(np.int64), ())}
        self.file = ColumnFile(folder.create("chosen"), schema)
        self.n_keys = 0  # the samples cut, repeats included
        self.repeats = 0

    @property
    def m(self) -> int:
        """How many keys a pass walks."""
        return self.file.rows

    def append(self, keys: np.ndarray, bucket: int, starts: np.ndarray) -> None:
        """Add the chosen samples of one bucket: their keys ``(width, k)`` and start rows, a block at a time."""
        for lo in range(0, starts.size, BLOCK_ROWS):
            hi = min(starts.size, lo + BLOCK_ROWS)
            columns = {name: keys[i, lo:hi] for i, name in enumerate(self.names)}
            columns |= {"bucket": np.full(hi - lo, bucket, np.int32), "start": starts[lo:hi]}
            self.file.append(columns)

    def blocks(self) -> Iterator[tuple[int, np.ndarray, dict[str, np.ndarray]]]:
        """Each block: its first row, its keys ``(width, k)`` and its columns."""
        first = 0
        for block in self.file.read_blocks():
            keys = np.stack([block[name] for name in self.names])
            yield first, keys, block
            first += keys.shape[1]

    def pick(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The keys ``(width, n)``, buckets and start rows of index rows ``rows`` (in their order; repeats allowed)."""
        order = np.argsort(rows, kind="stable")
        ranked = rows[order]
        keys = np.empty((self.width, rows.size), np.int64)
        buckets = np.empty(rows.size, np.int32)
        starts = np.empty(rows.size, np.int64)
        for first, block_keys, block in self.blocks():
            lo, hi = np.searchsorted(ranked, [first, first + block_keys.shape[1]])
            mine, local = order[lo:hi], ranked[lo:hi] - first
            keys[:, mine] = block_keys[:, local]
            buckets[mine] = block["bucket"][local]
            starts[mine] = block["start"][local]
        return keys, buckets, starts

    def remove(self) -> None:
        """Delete the file."""
        self.file.remove()


@dataclass
class SpilledScan:
    """A scan source read beyond its share: its rows by bucket, its chosen samples indexed."""

    cfg: Config  # the source's own config (its share of the budget)
    shape: ScanShape  # coded with whole category lists
    partition: Partition
    index: SpilledIndex
    lengths: dict[Column, int]  # each array column's element count
    rows_read: int
    folder: SpillFolder

    @property
    def policy(self) -> Policy:
        """The source's share of the budget, shared out as a scan's."""
        return Policy.for_scan(self.cfg.source.memory_bytes)

    @property
    def working_bytes(self) -> int:
        """What :meth:`gather` holds at its peak: a bucket loaded (as a data pass is) and a piece gathered from it."""
        return PASS_COPIES * self.partition.room + self.policy.data // 16

    def load(self, bucket: int) -> Table:
        """Bucket ``bucket``'s rows, sorted by (key, order) as the index cut them (its file stays)."""
        return assemble(self.shape, self.partition.read(bucket), empty_ok=True)

    def gather(self, layout: BatchLayout, keys: np.ndarray, buckets: np.ndarray, starts: np.ndarray) -> ColumnFile:
        """The run's samples (the ``i``-th: key ``keys[:, i]``, bucket and start row) in run order, in a file.

        Each bucket is loaded once and its samples go to ranges of run positions; each range is then put in
        order and appended (:meth:`_placed`).
        """
        n = starts.size
        per = max(1, self.policy.pass_bytes() // (2 * max(1, layout.sample_bytes)))  # run positions a range
        ranges = [ColumnFile(self.folder.create(f"run-{r}")) for r in range(-(-n // per))]
        chunk = self.policy.gather_samples(layout.sample_bytes)
        order = np.argsort(buckets, kind="stable")
        edges = np.concatenate([[0], np.flatnonzero(np.diff(buckets[order])) + 1, [n]]) if n else np.zeros(1, int)
        with memory.current().reserve("pass") as loaded:
            for lo, hi in itertools.pairwise(edges.tolist()):
                loaded.resize(PASS_COPIES * self.partition.room)
                table = self.load(int(buckets[order[lo]]))
                for at in range(lo, hi, chunk):
                    items = order[at : min(hi, at + chunk)]
                    out = layout.allocate(items.size)  # fresh zeros: a padded array's tail is zero
                    gather(table, layout, starts[items], np.ascontiguousarray(keys[:, items]), out)
                    _to_ranges(ranges, per, items, out)
                del table
                heap.release()
        run = ColumnFile(self.folder.create("run"), {name: (d, s) for name, d, s in layout.arrays()})
        with memory.current().reserve("run", 2 * per * layout.sample_bytes):
            for r, part in enumerate(ranges):
                run.append(_placed(part, layout, r * per, min(n, (r + 1) * per) - r * per))
                part.remove()
        return run

    def remove(self) -> None:
        """Delete the partition, the index and the run: the source's folder (the dump's goes at its end anyway)."""
        self.folder.remove()


def _to_ranges(ranges: list[ColumnFile], per: int, items: np.ndarray, out: dict[str, np.ndarray]) -> None:
    """Append gathered samples (run positions ``items``, arrays ``out``) to the ranges their positions fall in."""
    which = items // per
    order = np.argsort(which, kind="stable")
    edges = np.concatenate([[0], np.flatnonzero(np.diff(which[order])) + 1, [items.size]])
    for lo, hi in itertools.pairwise(edges.tolist()):
        mine = order[lo:hi]
        ranges[int(which[mine[0]])].append({_POSITION: items[mine]} | {name: v[mine] for name, v in out.items()})


def _placed(part: ColumnFile, layout: BatchLayout, first: int, n: int) -> dict[str, np.ndarray]:
    """Range ``part``'s ``n`` samples (run positions ``first ...``) in run order."""
    data = part.read(0, part.rows)
    assert part.rows == n, "every run position of a range gathered once"
    out = layout.allocate(n)
    at = data.pop(_POSITION) - first
    for name, values in data.items():
        out[name][at] = values
    return out


def index_partition(
    cfg: Config,
    name: str,
    shape: ScanShape,
    partition: Partition,
    folder: SpillFolder,
    rows_read: int,
    where: str,
    budget: int | None = None,
    least: Callable[[int], int] | None = None,
) -> SpilledScan:
    """The chosen samples of every bucket of ``partition`` indexed (see the module's step 1).

    ``budget`` and ``least``: what a series too large for a bucket is refused naming
    (:func:`~pgprefetch.write.scan.cutpasses.check_pass_fits`).

    Raises:
        SourceError: the table has no rows or no window, or a series larger than a bucket may be.
        SampleError: a key came twice and repeats are not dropped.
    """
    index = SpilledIndex(folder, len(shape.key_names))
    lengths: dict[Column, int] | None = None
    longest, repeated = 0, []
    samples = cfg.samples
    with memory.current().reserve("pass") as loaded:
        for bucket in range(partition.passes):
            loaded.resize(PASS_COPIES * partition.room)
            table = assemble(shape, partition.read(bucket), empty_ok=True)
            if not table.keys.shape[1]:
                continue
            check_pass_fits(cfg, shape, table, partition, budget=budget, least=least, where=where)
            lengths = array_lengths(table) if lengths is None else lengths
            longest = max(longest, longest_series(table.keys))
            keys, starts = cut(table, shape, cfg.scan_samples)
            del table
            keep, fraction = split_keep(cfg, shape.key_columns), samples.fraction
            chosen = choose(
                keys, seed=cfg.batches.seed, name=name, fraction=fraction, drop=True, where=where, keep=keep
            )
            if chosen.repeats:
                repeated.append(_first_repeat(keys))
            index.n_keys += chosen.n_keys
            index.repeats += chosen.repeats
            index.append(chosen.keys, bucket, starts[chosen.index])
            heap.release()
    if lengths is None:
        raise SourceError(f"{shape.relation} has no rows: there is nothing to dump")
    if not index.n_keys and cfg.scan_samples.window is not None:
        raise no_windows(cfg.scan_samples, longest, shape)
    if index.repeats and samples.duplicates != "drop":
        raise repeated_keys(where, index.repeats, min(repeated))
    return SpilledScan(cfg, shape, partition, index, lengths, rows_read, folder)


def _first_repeat(keys: np.ndarray) -> list[int]:
    """The first key of ``keys`` (``(width, k)``) that comes twice, in key order."""
    ordered = keys[:, np.lexsort(keys[::-1])]
    same = np.all(ordered[:, 1:] == ordered[:, :-1], axis=0)
    first: list[int] = ordered[:, 1:][:, same][:, 0].tolist()
    return first


class SpilledPasses:
    """The pass orders of a source's chosen keys on disk (:class:`SpilledIndex`), walked for what is asked.

    A :class:`~.passes.PassOrder` like :class:`~.passes.Passes`, whose positions and records it shares: a
    run taken here is the run taken there of the same keys. Its handles on the keys taken are the index's rows.
    """

    def __init__(self, index: SpilledIndex, *, seed: int, name: str) -> None:
        self.index, self.seed, self.name = index, seed, name
        self._counts: dict[int, np.ndarray] = {}
        self._last: tuple[int, int, int, list[int]] | None = None  # the last key taken: pass, index after, hash, key

    @property
    def m(self) -> int:
        """How many keys a pass walks."""
        return self.index.m

    def _hashes(self, keys: np.ndarray, p: int) -> np.ndarray:
        return pass_hash(keys, self.seed, self.name, p)

    def counts(self, p: int) -> np.ndarray:
        """How many keys' pass-``p`` hashes fall in each of the :data:`BINS` ranges of their top bits."""
        if p not in self._counts:
            if len(self._counts) > 2:
                self._counts.clear()
            counts = np.zeros(BINS, np.int64)
            for _, keys, _ in self.index.blocks():
                counts += np.bincount((self._hashes(keys, p) >> _SHIFT).astype(np.intp), minlength=BINS)
            self._counts[p] = counts
        return self._counts[p]

    def select(self, p: int, first: int, stop: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ranks ``first ... stop - 1`` of pass ``p``'s order: their index rows, hashes and keys, in that order."""
        counts = self.counts(p)
        ends = np.cumsum(counts)
        lo, hi = (int(b) for b in np.searchsorted(ends, [first, stop - 1], side="right"))
        before = int(ends[lo] - counts[lo])  # the keys of the ranges below the run's first
        rows, hashes, keys = [], [], []
        with memory.current().reserve("run keys", (stop - first) * (8 * self.index.width + 16)):
            for at, block_keys, _ in self.index.blocks():
                h = self._hashes(block_keys, p)
                top = h >> _SHIFT
                mine = np.flatnonzero((top >= lo) & (top <= hi))
                rows.append(mine + at)
                hashes.append(h[mine])
                keys.append(block_keys[:, mine])
        row, hash_, key = np.concatenate(rows), np.concatenate(hashes), np.concatenate(keys, axis=1)
        order = np.lexsort((*key[::-1], hash_))[first - before : stop - before]  # by hash, ties by key
        return row[order], hash_[order], key[:, order]

    def locate(self, p: int, after: tuple[int, list[int]] | None) -> Position:
        """The position of "pass ``p``, every key up to ``after`` (its hash and slots) taken", in these keys."""
        if after is None:
            return Position(p, 0)
        h, key = np.uint64(after[0]), after[1]
        index = 0
        for _, keys, _ in self.index.blocks():
            hashes = self._hashes(keys, p)
            index += int((hashes < h).sum())
            index += sum(1 for i in np.flatnonzero(hashes == h) if keys[:, i].tolist() <= key)  # the same hash: rare
        return Position(p, index)

    def advance(self, at: Position, n: int) -> Position:
        """The position ``n`` keys on, counting whole passes without computing their orders."""
        return advance(self.m, at, n)

    def take(self, at: Position, n: int) -> tuple[np.ndarray, Position]:
        """The next ``n`` keys from ``at`` (rows of the index, in order) and the position after them."""
        taken = []
        for p, first, stop in segments(self.m, at, n):
            rows, hashes, keys = self.select(p, first, stop)
            taken.append(rows)
            self._last = (p, stop, int(hashes[-1]), keys[:, -1].tolist())
        rows = np.concatenate(taken) if taken else np.empty(0, np.int64)
        return rows, self.advance(at, n)

    def after(self, at: Position) -> tuple[int, list[int]] | None:
        """What a record says of ``at``: the hash and slots of the last key taken in its pass (None: none)."""
        if at.index == 0:
            return None
        if self._last is not None and self._last[:2] == (at.pass_, at.index):
            return self._last[2], self._last[3]
        _, hashes, keys = self.select(at.pass_, at.index - 1, at.index)
        return int(hashes[0]), keys[:, 0].tolist()


class InBuckets(SplitRead[SpilledScan]):
    """A mixed epoch's scan source beyond its share: its table split by series as it is read, then indexed.

    The beyond-memory strategy of a mixed source (:func:`~pgprefetch.write.scan.strategy.either` chooses it, or
    hands it a read in memory that outgrew the share). It yields the :class:`SpilledScan`, whose files go
    when it closes. ``budget`` and ``least``: what a series too large for a bucket is refused naming.
    """

    name = "a mixed source's table in buckets on disk"

    def __init__(self, source: str, where: str, budget: int, least: Callable[[int], int]) -> None:
        self.source, self.where, self.budget, self.least = source, where, budget, least

    def partition(self, job: ScanJob) -> Partition:
        """Buckets of whole series, each a data pass's share of the source's budget."""
        return series_partition(job)

    @contextlib.asynccontextmanager
    async def open_from(self, job: ScanJob, partition: Partition, rows_read: int) -> AsyncIterator[SpilledScan]:
        """The source's chosen samples indexed from ``partition`` (which holds all its ``rows_read`` rows)."""
        try:
            await asyncio.to_thread(partition.settle)
            spilled = await asyncio.to_thread(self._index, job, partition, rows_read)
        except BaseException:
            partition.remove()
            raise
        message = "%s table: %s rows beyond its share of [source] memory: read once into %d buckets on disk"
        log.info(message, self.where, f"{partition.rows:,}", partition.passes)
        try:
            yield spilled
        finally:
            spilled.remove()

    def _index(self, job: ScanJob, partition: Partition, rows_read: int) -> SpilledScan:
        cfg, shape, where = job.cfg, job.shape, self.where
        return index_partition(cfg, self.source, shape, partition, job.spill, rows_read, where, self.budget, self.least)
