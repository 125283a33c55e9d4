"""Keys beyond ``[source] memory``: the epoch's order computed on disk, the same order, the same bytes.

The epoch's order is "by the splitmix hash of (seed, epoch, key), ties by key"
(:mod:`pgprefetch.write.order.shuffle`). In memory that is one sort. A billion keys do not fit a dump host's
budget (8 bytes a key column, more while sorting), so beyond the budget the sort is an external one:

1. **Runs.** The keys stream from the cursor into memory, a budget's worth at a time; each such run is
   sorted by hash and appended to a spill file (the hashes, then each key column), and dropped.
2. **Buckets.** Once every key is read their count is known, and the hash space is cut into as many
   equal ranges as the budget needs (a range that holds too many keys is halved). A bucket is one range:
   its part of every run, found by reading each run's sorted hashes forward from where the previous
   bucket stopped. Equal keys hash alike and ties are broken by key inside a range, so each bucket
   sorted in memory (:func:`~pgprefetch.write.order.shuffle.order_part`: repeats, ``fraction``) gives the next
   stretch of the epoch's order; the buckets are appended to the ordered key file
   (:mod:`pgprefetch.write.order.keyfile`) in range order, and the spill file is deleted.

Every key is written twice (spill, ordered file) and read twice: disk of about ``8 * (2 * slots + 1)``
bytes a key at the peak, then ``8 * slots`` for the rest of the dump. While the keys fit the budget
nothing of this happens: :func:`collect_keys` returns them as one array, the in-memory path.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import numpy as np

from pgprefetch.write import memory
from pgprefetch.write.order import shuffle
from pgprefetch.write.order.keyfile import OrderedKeys, slot_names
from pgprefetch.write.spill.columns import ColumnFile, Schema
from pgprefetch.write.spill.folder import SpillFolder

log = logging.getLogger("pgprefetch")

MIN_KEYS = 4096  # the fewest keys a run or a bucket holds, however small the budget
KEYS_RESERVATION = "keys"  # the pool's name for the keys held (a packed epoch's documents take what they leave)
_SPAN = 1 << 64  # the hash space
FILL = 0.9  # buckets aim at this share of the budget: the ranges' counts vary a little


def bytes_per_key(width: int) -> int:
    """Memory a key of ``width`` int64 slots takes at the peak of ordering it (in memory, a run or a bucket).

    The keys themselves, then the sort's temporaries: the hashes, the packed sort keys and a permuted
    column (or, with ``fraction``, the second hash), 8 bytes each; and twice the keys for a moment while
    the cursor's chunks are joined.
    """
    return max(16 * width, 8 * width + 32)


def keys_in_budget(budget: int, width: int) -> int:
    """How many keys of ``width`` slots are ordered within ``budget`` bytes."""
    return max(MIN_KEYS, budget // bytes_per_key(width))


@dataclass(frozen=True)
class _Run:
    """A run in the spill file: ``count`` keys sorted by hash from row ``offset``: their hash, then each slot."""

    offset: int
    count: int


class KeyRuns:
    """The spill file of one epoch's keys: runs sorted by hash, then read back by hash range.

    Made by :func:`collect_keys` once the keys outgrow the budget; :meth:`order` turns it into the
    ordered key file, after which the spill file is gone.
    """

    def __init__(
        self,
        folder: SpillFolder,
        width: int,
        seed: int,
        epoch: int,
        budget: int,
        started: float,
        hashed: int | None = None,
        payload: int = 0,
    ) -> None:
        self.folder = folder
        self.width = width
        self.hashed = width if hashed is None else hashed  # the leading slots the hash covers (scan: the series)
        self.slots = width + payload  # and after the key's, slots carried with it (see OrderedKeys)
        self.seed, self.epoch = seed, epoch
        self.budget = budget
        self.runs: list[_Run] = []
        self.n = 0
        self.started = started  # (monotonic) when the keys began to stream: the log gives the whole phase
        schema: Schema = {"h": (np.dtype(np.uint64), ())}
        schema.update({n: (np.dtype(np.int64), ()) for n in slot_names(self.slots)})
        self.file = ColumnFile(folder.create("runs"), schema)  # a block a run

    def add(self, chunks: list[np.ndarray]) -> None:
        """Sort ``chunks`` of keys (``(slots, m)`` each) by hash into one run (a block) of the spill file."""
        keys = np.concatenate(chunks, axis=1) if len(chunks) > 1 else chunks[0]
        chunks.clear()  # the caller's list: its chunks go as soon as they are joined
        h = shuffle.key_hash(keys[: self.hashed], seed=self.seed, epoch=self.epoch)
        order = shuffle.epoch_order(keys[: self.width], seed=self.seed, epoch=self.epoch, h=h)
        m = keys.shape[1]
        first = self.file.rows
        hashes = h[order]
        del h  # the unordered hashes go before a slot is copied
        self.file.append_lazily(m, itertools.chain([hashes], (column[order] for column in keys)))
        self.runs.append(_Run(first, m))
        self.n += m

    def buckets(self, cap: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Every key with its hash, a hash range at a time, in hash order: ``(keys (slots, m), hashes (m,))``.

        A bucket holds at most ``cap`` keys, unless one hash value alone holds more (a key repeated that
        often): a range is halved until it fits or is that one value.
        """
        count = max(1, math.ceil(self.n / max(1, int(cap * FILL))))
        span = -(-_SPAN // count)
        at = [0] * len(self.runs)  # per run: its first key not yet handed out
        ahead: list[np.ndarray] = [np.empty(0, np.uint64) for _ in self.runs]  # its hashes from there, read
        lo = 0
        while lo < _SPAN:
            hi = min(lo + span, _SPAN)
            ends = [self._end_of(r, at[r], ahead, lo, hi) for r in range(len(self.runs))]
            while sum(e - a for e, a in zip(ends, at, strict=True)) > cap and hi - lo > 1:
                hi = lo + (hi - lo) // 2  # the hashes read cover it: no read
                ends = [a + int(np.searchsorted(ahead[r], np.uint64(hi))) for r, a in enumerate(at)]
            yield self._load(at, ends, ahead)
            lo = hi

    def _end_of(self, r: int, start: int, ahead: list[np.ndarray], lo: int, hi: int) -> int:
        """Where run ``r``'s hashes reach ``hi`` (its end for the last range), reading them forward as needed.

        Hashes are uniform, so about ``count * (hi - lo) / 2**64`` of the run's keys fall in ``[lo, hi)``:
        a little more than that is read at once, and twice as much again while ``hi`` is not reached.
        """
        run = self.runs[r]
        if hi >= _SPAN:
            self._read_hashes(r, start, ahead, run.count)
            return run.count
        step = max(256, int(run.count * (hi - lo) / _SPAN * 1.1))
        while True:
            i = int(np.searchsorted(ahead[r], np.uint64(hi)))
            if i < ahead[r].size or start + ahead[r].size >= run.count:
                return start + i
            self._read_hashes(r, start, ahead, step)
            step *= 2

    def _read_hashes(self, r: int, start: int, ahead: list[np.ndarray], more: int) -> None:
        """Read up to ``more`` further hashes of run ``r`` (its hashes from key ``start`` on are ``ahead[r]``)."""
        run = self.runs[r]
        first = start + ahead[r].size
        stop = run.offset + min(run.count, first + more)
        extra = self.file.read(run.offset + first, stop, ["h"])["h"]
        ahead[r] = np.concatenate([ahead[r], extra]) if ahead[r].size else extra

    def _load(self, at: list[int], ends: list[int], ahead: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """The keys ``at[r]:ends[r]`` of every run ``r``, with their hashes; moves ``at`` and ``ahead`` on."""
        n = sum(e - a for e, a in zip(ends, at, strict=True))
        keys = np.empty((self.slots, n), dtype=np.int64)
        hashes = np.empty(n, dtype=np.uint64)
        pos = 0
        for r, run in enumerate(self.runs):
            m = ends[r] - at[r]
            if m:
                hashes[pos : pos + m] = ahead[r][:m]
                names = slot_names(self.slots)
                lo = run.offset + at[r]
                self.file.read(lo, lo + m, names, {n: keys[j, pos : pos + m] for j, n in enumerate(names)})
            ahead[r] = ahead[r][m:].copy() if ahead[r].size > m else np.empty(0, np.uint64)
            at[r] = ends[r]
            pos += m
        return keys, hashes

    def order(
        self, *, fraction: float, quantum: int, keep: Callable[[np.ndarray], np.ndarray] | None = None
    ) -> tuple[OrderedKeys, shuffle.Repeats, int]:
        """Write the epoch's order into the ordered key file; return it, the repeats found and the buckets.

        ``quantum``: see :class:`~pgprefetch.write.order.keyfile.OrderedKeys`. A repeated key is written once,
        and counted in the repeats: the caller refuses them or not. ``keep``: a split's keys
        (:func:`~.shuffle.order_part`).
        """
        cap = keys_in_budget(self.budget, self.slots)
        out = OrderedKeys(self.folder, "ordered", self.width, quantum, self.slots - self.width)
        found: list[shuffle.Repeats] = []
        buckets = 0
        try:
            for keys, hashes in self.buckets(cap):
                if not keys.shape[1]:
                    continue
                buckets += 1
                key = keys[: self.width]  # (the payload is carried, not ordered by)
                order, repeats = shuffle.order_part(
                    key, seed=self.seed, epoch=self.epoch, fraction=fraction, h=hashes, keep=keep
                )
                del hashes
                if repeats.count:
                    found.append(repeats)
                out.append(keys, order)
        except BaseException:
            out.close()
            raise
        self.file.remove()
        return out, shuffle.Repeats.merged(found, self.width), buckets

    def close(self) -> None:
        """Close the spill file (the folder is removed by whoever chose it)."""
        self.file.close()

    def discard(self) -> None:
        """Close and delete the spill file (its buckets were read by the caller)."""
        self.file.remove()


class KeyCollector:
    """Keys arriving a chunk at a time: held while they fit, sorted into runs on disk once they do not.

    ``limit``: the most keys held at once (default: :func:`keys_in_budget`); ``hashed``, ``payload``: see
    :class:`KeyRuns` (a chunk has ``width + payload`` slots).
    :meth:`add` may be called from several threads (one at a time: it takes a lock).
    """

    def __init__(
        self,
        folder: SpillFolder,
        width: int,
        budget: int,
        *,
        seed: int,
        epoch: int,
        limit: int | None = None,
        hashed: int | None = None,
        payload: int = 0,
    ) -> None:
        self.folder, self.width, self.budget = folder, width, budget
        self.seed, self.epoch, self.hashed, self.payload = seed, epoch, hashed, payload
        self.limit = keys_in_budget(budget, width + payload) if limit is None else max(MIN_KEYS, limit)
        # A key's share of the budget while it is held and ordered: a full hold reserves the budget.
        self.per_key = budget / self.limit if budget else float(bytes_per_key(width + payload))
        self.reservation = memory.current().reserve(KEYS_RESERVATION)
        self.started = time.monotonic()
        self.held: list[np.ndarray] = []
        self.n = 0  # keys held
        self.runs: KeyRuns | None = None
        self._lock = threading.Lock()

    def add(self, chunk: np.ndarray) -> None:
        """Take a ``(width + payload, m)`` chunk of keys; a full hold goes to disk as one run first."""
        with self._lock:
            if self.n + chunk.shape[1] > self.limit and self.held:
                if self.runs is None:
                    self.runs = KeyRuns(
                        self.folder,
                        self.width,
                        self.seed,
                        self.epoch,
                        self.budget,
                        self.started,
                        self.hashed,
                        self.payload,
                    )
                self.runs.add(self.held)
                self.n = 0
                self.reservation.free()
            # At most a full hold: a chunk larger than that is its caller's (a pass's windows, reserved as the pass).
            self.reservation.grow(int(min(chunk.shape[1], self.limit - self.n) * self.per_key))
            self.held.append(chunk)
            self.n += chunk.shape[1]

    def result(self) -> np.ndarray | KeyRuns:
        """Every key: one array if they all fit (its reservation held for the epoch), else the runs on disk.

        The caller closes the runs.
        """
        if self.runs is None:
            if not self.held:
                return np.empty((self.width + self.payload, 0), dtype=np.int64)
            keys = np.concatenate(self.held, axis=1) if len(self.held) > 1 else self.held[0]
            self.held = []
            return keys
        if self.held:
            self.runs.add(self.held)
        self.reservation.free()
        return self.runs

    def close(self) -> None:
        """Close the runs' file, if any, and let go of the keys held (after a failure)."""
        self.reservation.free()
        if self.runs is not None:
            self.runs.close()


async def collect_keys(
    chunks: AsyncIterator[np.ndarray], width: int, budget: int, folder: SpillFolder, *, seed: int, epoch: int
) -> np.ndarray | KeyRuns:
    """The keys of ``chunks`` (``(width, m)`` int64 each): one array while they fit ``budget``, else runs on disk.

    ``folder`` (created, emptied first, only if the keys spill) holds the spill and ordered key files;
    the caller removes it when the epoch is done or failed.
    """
    collector = KeyCollector(folder, width, budget, seed=seed, epoch=epoch)
    try:
        async for chunk in chunks:
            collector.add(chunk)
        return collector.result()
    except BaseException:
        collector.close()
        raise
