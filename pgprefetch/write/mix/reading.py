"""Each source of a mixed epoch read on the epoch's snapshot by its own mode's machinery.

A query-mode source is described and its keys read (:meth:`~pgprefetch.pg.session.Snapshot.read_keys`).
A scan-mode source's table is read whole and cut (:func:`~pgprefetch.write.scan.whole.read_whole`) where
it fits its share of the budget, and otherwise into a partition on disk (:mod:`.spilled`): the choice is
made before the read from the planner's estimate (:mod:`pgprefetch.write.scan.strategy.choice`), and a read
in memory that outgrows its share goes on into the partition, so the table is read once either way. Each
source is read with the config of its own (:meth:`~pgprefetch.config.model.Config.for_source`), the memory
budget shared out among the sources, and any error it raises is prefixed with the source's table:
``[samples.web]: ...``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from pgprefetch.config.model import Config, SamplesConfig
from pgprefetch.errors import ConfigError, PgprefetchError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.session import Shape, Snapshot
from pgprefetch.write.memory import heap
from pgprefetch.write.memory.policy import MIB, Policy
from pgprefetch.write.mix.passes import Chosen, Passes, PassOrder, choose
from pgprefetch.write.mix.spilled import SpilledIndex, SpilledPasses, SpilledScan, index_partition
from pgprefetch.write.plan import Vocabulary
from pgprefetch.write.scan.keyspill import stream
from pgprefetch.write.scan.partition import Partition, bucket_count
from pgprefetch.write.scan.shape import ScanShape
from pgprefetch.write.scan.strategy.choice import Estimate, beyond_memory, estimate
from pgprefetch.write.scan.table import Overflow, TableTooLarge
from pgprefetch.write.scan.whole import Coding, ScanRead, read_whole
from pgprefetch.write.spill.folder import SpillFolder

log = logging.getLogger("pgprefetch")


@dataclass
class SourceRead:
    """One source as read for an epoch: its keys as its passes walk them, and what serves its samples."""

    name: str
    code: int  # its position in [samples]: the value of its samples in the ``source`` array
    cfg: Config  # its own single-source config
    key_columns: KeyColumns
    chosen: Chosen | SpilledIndex  # in memory, or on disk (a scan source beyond its share)
    passes: PassOrder
    shape: Shape | None = None  # query mode
    scan: ScanRead | None = None  # scan mode, read whole
    spilled: SpilledScan | None = None  # scan mode, beyond its share

    @property
    def where(self) -> str:
        """How messages name it."""
        return f"[samples.{self.name}]"

    @property
    def scan_shape(self) -> ScanShape | None:
        """A scan source's described table (None: a query source)."""
        if self.scan is not None:
            return self.scan.shape
        return self.spilled.shape if self.spilled is not None else None


@asynccontextmanager
async def prefixed(name: str) -> AsyncIterator[None]:
    """Prefix an error raised while planning or serving source ``name`` with its table."""
    try:
        yield
    except PgprefetchError as e:
        if str(e).startswith("[samples.") or f"[samples.{name}]" in str(e):
            raise
        message = f"[samples.{name}]: {e}"
        copy = type(e).__new__(type(e))
        copy.__dict__.update(e.__dict__)
        copy.args = (message,)
        raise copy from None


def source_config(cfg: Config, name: str, memory: int, query_sources: int) -> Config:
    """Source ``name``'s own config: its samples, its share ``memory`` of the budget, its share of connections."""
    own = cfg.for_source(name)
    connections = max(1, -(-cfg.source.connections // max(1, query_sources)))
    source = dataclasses.replace(cfg.source, memory_bytes=memory, connections=connections)
    return dataclasses.replace(own, source=source)


def held_bytes(read: SourceRead) -> int:
    """What a source holds for the epoch once read: its chosen keys and index, and a pass's hash and order.

    A source beyond its share holds them on disk; what it holds of its run is reserved as it is taken.
    """
    if not isinstance(read.chosen, Chosen):
        return 0
    return int(read.chosen.keys.nbytes + read.chosen.index.nbytes + 16 * read.chosen.m)


def scan_share(budget: int, held: int, scan_sources: int) -> int:
    """Each scan source's budget: what the data's share leaves beside the query sources' keys, equally."""
    data = Policy.for_scan(budget).data
    return max(1, (data - held) // max(1, scan_sources)) if budget else 0


@dataclass(frozen=True)
class Share:
    """A scan source's part of a mixed epoch's ``--memory``: the data's share less the query sources' keys, split.

    The source is read with a config of its own whose ``[source] memory`` gives it this share
    (:attr:`own_budget`); a refusal names the ``--memory`` of the whole epoch (:meth:`least`).
    """

    budget: int  # the epoch's --memory
    held: int  # the query sources' keys
    scan_sources: int

    @property
    def own_budget(self) -> int:
        """The ``[source] memory`` whose data share is the source's share (0: no budget)."""
        share = scan_share(self.budget, self.held, self.scan_sources)
        return least_budget(share, 0, 1) if share else 0

    def least(self, own: int) -> int:
        """The least ``--memory`` under which the source's own ``[source] memory`` is at least ``own``."""
        return least_budget(Policy.for_scan(own).data, self.held, self.scan_sources)


def least_budget(need: int, held: int, scan_sources: int) -> int:
    """The least ``--memory`` (a whole MiB) under which each scan source's share holds ``need`` bytes."""
    high = MIB
    while scan_share(high, held, scan_sources) < need:
        high *= 2
    low = high // 2
    while high - low > MIB:
        mid = (low + high) // 2 // MIB * MIB
        if scan_share(mid, held, scan_sources) >= need:
            high = mid
        else:
            low = mid
    return high


@dataclass(frozen=True)
class ScanTable:
    """A scan source's table described before it is read: its category lists and the planner's estimate."""

    coding: Coding
    shape: ScanShape
    guess: Estimate

    @property
    def size_order(self) -> tuple[bool, float]:
        """The order the scan sources are read in: the smallest first, a table of unknown size last."""
        return (not self.guess.known, self.guess.table_bytes)


async def describe_table(cfg: Config, snap: Snapshot, vocabulary: Vocabulary | None) -> ScanTable:
    """A scan source's table described and coded (its ``[source] memory`` plays no part yet)."""
    coding = Coding(cfg, snap, vocabulary)
    shape = await coding.shape()
    return ScanTable(coding, shape, await estimate(snap, shape))


async def read_source(
    cfg: Config,
    name: str,
    code: int,
    snap: Snapshot,
    vocabulary: Vocabulary | None,
    counts: dict[str, Any],
    spill: SpillFolder,
    scan: tuple[ScanTable, Share] | None = None,
) -> SourceRead:
    """Read source ``name`` (its own config ``cfg``) on ``snap``: its keys, or its table cut into samples.

    ``counts`` hears the table rows a scan read (``rows_read``). A scan source's table, described
    (:func:`describe_table`), is read within its share of the budget or spills to ``spill``, a folder of its
    own (``scan``).

    Raises:
        ConfigError: it returned no keys (a source of weight > 0 must give samples).
        SampleError: a key came twice and repeats are not dropped.
    """
    where = f"[samples.{name}]"
    samples = cfg.samples
    drop = samples.duplicates == "drop"
    if isinstance(samples, SamplesConfig):
        shape = await snap.describe(cfg)
        keys = await snap.read_keys(cfg, shape.keys)
        chosen = choose(keys, seed=cfg.batches.seed, name=name, fraction=samples.fraction, drop=drop, where=where)
        read = SourceRead(name, code, cfg, shape.keys, chosen, Passes(chosen, seed=cfg.batches.seed, name=name))
        read.shape = shape
    else:
        assert scan is not None, "a scan source's table is described first"
        got = await _read_scan(cfg, name, snap, spill, where, *scan)
        if isinstance(got, SpilledScan):
            counts["rows_read"] = counts.get("rows_read", 0) + got.rows_read
            spilled = SpilledPasses(got.index, seed=cfg.batches.seed, name=name)
            read = SourceRead(name, code, cfg, got.shape.key_columns, got.index, spilled, spilled=got)
        else:
            counts["rows_read"] = counts.get("rows_read", 0) + got.table.rows_read
            keys = got.sample_keys
            chosen = choose(keys, seed=cfg.batches.seed, name=name, fraction=samples.fraction, drop=drop, where=where)
            passes = Passes(chosen, seed=cfg.batches.seed, name=name)
            read = SourceRead(name, code, cfg, got.shape.key_columns, chosen, passes, scan=got)
    if read.chosen.m == 0:
        n_keys = read.chosen.n_keys
        what = "no keys" if not n_keys else f"{n_keys} keys of which fraction chose none"
        raise ConfigError(f"{where} returned {what}: a source needs samples (weight = 0 leaves it out)")
    return read


async def _read_scan(
    cfg: Config, name: str, snap: Snapshot, spill: SpillFolder, where: str, table: ScanTable, share: Share
) -> ScanRead | SpilledScan:
    """A scan source's table read whole within its share, or into a partition beyond it (the table read once).

    As a scan epoch chooses (:mod:`pgprefetch.write.scan.strategy`): straight into the partition where the
    estimate puts the table past the share; else read whole, handed over midway if it outgrows the share
    (read again with whole category lists only where it was coded against the store's).
    """
    coding, shape, guess = table.coding, table.shape, table.guess
    if not beyond_memory(cfg, shape, guess):
        overflow = Overflow(lambda rows, row_bytes: _partition(cfg, shape, spill, _measured(guess, rows, row_bytes)))
        try:
            read = await read_whole(cfg, snap, coding, shape, overflow=overflow)
        except TableTooLarge as e:  # coded against the store's lists: read again, with whole ones
            heap.release()
            coding.rows_read += e.rows
            guess = _measured(guess, e.rows, e.bytes_per_row)
        else:
            if read is not None:
                return read
            heap.release()
            assert isinstance(overflow.partition, Partition), "the read was handed over to a partition"
            rows_read = overflow.rows + coding.rows_read
            return await _indexed(cfg, name, coding.current, overflow.partition, rows_read, spill, where, share)
    shape = await coding.complete()
    partition = _partition(cfg, shape, spill, guess)
    try:
        rows = await stream(cfg, snap, shape, lambda chunk: None, None, partition, keep=())
    except BaseException:
        partition.remove()
        raise
    return await _indexed(cfg, name, shape, partition, rows + coding.rows_read, spill, where, share)


def _measured(guess: Estimate, rows: int, row_bytes: float) -> Estimate:
    """The estimate corrected by a read that outgrew its share after ``rows`` rows of ``row_bytes``."""
    return Estimate(max(guess.rows, 2.0 * rows), row_bytes or guess.row_bytes)


def _partition(cfg: Config, shape: ScanShape, spill: SpillFolder, guess: Estimate) -> Partition:
    """The partition by series a scan source beyond its share is read into: buckets of a data pass's share."""
    policy = Policy.for_scan(cfg.source.memory_bytes)
    room = policy.pass_bytes()
    buckets = bucket_count(guess.rows, max(1.0, guess.row_bytes), room)
    return Partition(spill.sub("partition"), buckets, shape.n_key, room, hold=policy.partition_hold_bytes())


async def _indexed(
    cfg: Config,
    name: str,
    shape: ScanShape,
    partition: Partition,
    rows_read: int,
    spill: SpillFolder,
    where: str,
    share: Share,
) -> SpilledScan:
    """The partition settled and its chosen samples indexed (:func:`~.spilled.index_partition`)."""
    budget, least = share.budget, share.least
    try:
        await asyncio.to_thread(partition.settle)
        spilled = await asyncio.to_thread(
            index_partition, cfg, name, shape, partition, spill, rows_read, where, budget=budget, least=least
        )
    except BaseException:
        partition.remove()
        raise
    message = "%s table: %s rows beyond its share of [source] memory: read once into %d buckets on disk"
    log.info(message, where, f"{partition.rows:,}", partition.passes)
    return spilled


def widest(sources: list[SourceRead]) -> KeyColumns:
    """The key columns of the source with the most slots: the ``keys`` array is as wide as that."""
    return max((s.key_columns for s in sources), key=lambda k: k.width)


def check_same_arrays(named: list[tuple[str, list[tuple[str, np.dtype, tuple[int, ...]]]]]) -> None:
    """Refuse sources whose samples would not fit one batch: every array the same name, dtype and shape.

    Raises:
        ConfigError: naming the source and the array that differs.
    """
    first, expected = named[0]
    for name, arrays in named[1:]:
        theirs = {a: (d, s) for a, d, s in arrays}
        for array, dtype, shape in expected:
            if array not in theirs:
                raise ConfigError(f"[samples.{name}]: gives no array {array!r}, which [samples.{first}] gives")
            if theirs[array] != (dtype, shape):
                got = theirs[array]
                raise ConfigError(
                    f"[samples.{name}]: field array {array!r} is {got[0]} {got[1]} per sample, [samples.{first}]'s "
                    f"{dtype} {shape}: every source must give each field the same dtype and shape"
                )
        extra = sorted(set(theirs) - {a for a, _, _ in expected})
        if extra:
            raise ConfigError(f"[samples.{name}]: gives an array {extra[0]!r} that [samples.{first}] does not")
