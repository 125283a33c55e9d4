"""Each source of a mixed epoch read on the epoch's snapshot by its own mode's machinery.

A query-mode source is described and its keys read (:meth:`~pgprefetch.pg.session.Snapshot.read_keys`).
A scan-mode source's table is read by a scan epoch's strategies: whole where it fits its share of the
budget, otherwise into buckets on disk (:class:`~.spilled.InBuckets`), the choice made before the read from
the planner's estimate, and a read in memory that outgrows its share going on into the buckets, so the
table is read once either way (:mod:`pgprefetch.write.scan.strategy`). Each
source is read with the config of its own (:meth:`~pgprefetch.config.model.Config.for_source`), the memory
budget shared out among the sources, and any error it raises is prefixed with the source's table:
``[samples.web]: ...``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import Config, SamplesConfig
from pgprefetch.errors import ConfigError, PgprefetchError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.session import Shape, Snapshot
from pgprefetch.write.memory.policy import MIB, Policy
from pgprefetch.write.mix.passes import Chosen, Passes, PassOrder, choose
from pgprefetch.write.mix.spilled import InBuckets, SpilledIndex, SpilledPasses, SpilledScan
from pgprefetch.write.order.splits import split_keep
from pgprefetch.write.plan import Vocabulary
from pgprefetch.write.scan.shape import ScanShape
from pgprefetch.write.scan.strategy import either
from pgprefetch.write.scan.strategy.choice import Estimate, estimate
from pgprefetch.write.scan.strategy.job import BeyondMemory, ScanJob
from pgprefetch.write.scan.whole import Coding, ScanRead
from pgprefetch.write.spill.folder import SpillFolder


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
    def rows_read(self) -> int:
        """The table rows its read made the server read (0: a query source)."""
        if self.scan is not None:
            return self.scan.table.rows_read
        return self.spilled.rows_read if self.spilled is not None else 0

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

    snap: Snapshot
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
    return ScanTable(snap, coding, shape, await estimate(snap, shape))


async def read_query_source(cfg: Config, name: str, code: int, snap: Snapshot) -> SourceRead:
    """Read query source ``name`` (its own config ``cfg``) on ``snap``: its keys, chosen for its passes.

    Raises:
        ConfigError: it returned no keys (a source of weight > 0 must give samples).
        SampleError: a key came twice and repeats are not dropped.
    """
    assert isinstance(cfg.samples, SamplesConfig)
    shape = await snap.describe(cfg)
    chosen = _choose(cfg, name, await snap.read_keys(cfg, shape.keys), shape.keys)
    read = SourceRead(name, code, cfg, shape.keys, chosen, Passes(chosen, seed=cfg.batches.seed, name=name))
    read.shape = shape
    return _has_samples(read)


async def read_scan_source(
    cfg: Config,
    name: str,
    code: int,
    table: ScanTable,
    share: Share,
    spill: SpillFolder,
    stack: contextlib.AsyncExitStack,
) -> SourceRead:
    """Read scan source ``name`` (its own config ``cfg``, its ``share`` of the budget): whole, or into buckets.

    The choice is a scan epoch's (:func:`~pgprefetch.write.scan.strategy.either`): in memory where the table
    fits the share, else into buckets on disk in ``spill``, a folder of its own (:class:`~.spilled.InBuckets`);
    a read in memory that outgrows the share goes on into the buckets, so the table is read once. The
    buckets are removed when ``stack`` closes (the epoch is written).

    Raises:
        ConfigError: it gave no samples.
        SampleError: a key came twice and repeats are not dropped.
    """
    where = f"[samples.{name}]"
    job = ScanJob(cfg, table.snap, 0, table.shape, table.coding, table.guess, spill)
    beyond: BeyondMemory[ScanRead | SpilledScan] = InBuckets(name, where, share.budget, share.least)
    strategy = either(job, beyond, _as_read)
    got = await stack.enter_async_context(strategy.open(job))
    if isinstance(got, SpilledScan):
        spilled = SpilledPasses(got.index, seed=cfg.batches.seed, name=name)
        return _has_samples(SourceRead(name, code, cfg, got.shape.key_columns, got.index, spilled, spilled=got))
    chosen = _choose(cfg, name, got.sample_keys, got.shape.key_columns)
    passes = Passes(chosen, seed=cfg.batches.seed, name=name)
    return _has_samples(SourceRead(name, code, cfg, got.shape.key_columns, chosen, passes, scan=got))


def _as_read(job: ScanJob, read: ScanRead) -> ScanRead | SpilledScan:
    """A table read whole, as a mixed source holds it (its epochs are cut by the mix)."""
    return read


def _choose(cfg: Config, name: str, keys: np.ndarray, key_columns: KeyColumns) -> Chosen:
    """The keys a source's passes walk (:func:`~.passes.choose`), by its ``fraction`` and ``duplicates``."""
    samples = cfg.samples
    drop = samples.duplicates == "drop"
    where = f"[samples.{name}]"
    fraction, keep = samples.fraction, split_keep(cfg, key_columns)
    return choose(keys, seed=cfg.batches.seed, name=name, fraction=fraction, drop=drop, where=where, keep=keep)


def _has_samples(read: SourceRead) -> SourceRead:
    """``read``, which must give samples.

    Raises:
        ConfigError: its keys (or those ``fraction`` chose) are none.
    """
    if read.chosen.m == 0:
        n_keys = read.chosen.n_keys
        what = "no keys" if not n_keys else f"{n_keys} keys of which fraction chose none"
        raise ConfigError(f"{read.where} returned {what}: a source needs samples (weight = 0 leaves it out)")
    return read


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
