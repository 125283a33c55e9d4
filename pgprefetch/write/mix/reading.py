"""Each source of a mixed epoch read on the epoch's snapshot by its own mode's machinery.

A query-mode source is described and its keys read (:meth:`~pgprefetch.pg.session.Snapshot.read_keys`);
a scan-mode source's table is read whole and cut (:func:`~pgprefetch.write.scan.whole.read_whole`). Each is read
with the config of its own (:meth:`~pgprefetch.config.model.Config.for_source`), the memory budget shared
out among the sources, and any error it raises is prefixed with the source's table: ``[samples.web]: ...``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from pgprefetch.config.model import Config, SamplesConfig
from pgprefetch.errors import ConfigError, PgprefetchError, SourceError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.session import Shape, Snapshot
from pgprefetch.write.memory.policy import MIB, Policy
from pgprefetch.write.mix.passes import Chosen, Passes, choose
from pgprefetch.write.plan import Vocabulary
from pgprefetch.write.scan.table import TableTooLarge
from pgprefetch.write.scan.whole import Coding, ScanRead, read_whole


@dataclass
class SourceRead:
    """One source as read for an epoch: its keys as its passes walk them, and what serves its samples."""

    name: str
    code: int  # its position in [samples]: the value of its samples in the ``source`` array
    cfg: Config  # its own single-source config
    key_columns: KeyColumns
    chosen: Chosen
    passes: Passes
    shape: Shape | None = None  # query mode
    scan: ScanRead | None = None  # scan mode

    @property
    def where(self) -> str:
        """How messages name it."""
        return f"[samples.{self.name}]"


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
    """What a source holds for the epoch once read: its chosen keys and index, and a pass's hash and order."""
    return int(read.chosen.keys.nbytes + read.chosen.index.nbytes + 16 * read.chosen.m)


def scan_share(budget: int, held: int, scan_sources: int) -> int:
    """Each scan source's budget: what the data's share leaves beside the query sources' keys, equally."""
    data = Policy.for_scan(budget).data
    return max(1, (data - held) // max(1, scan_sources)) if budget else 0


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


async def read_source(
    cfg: Config,
    name: str,
    code: int,
    snap: Snapshot,
    vocabulary: Vocabulary | None,
    epoch: int,
    counts: dict[str, Any],
    *,
    budget: int = 0,
    held: int = 0,
    scan_sources: int = 1,
) -> SourceRead:
    """Read source ``name`` (its own config ``cfg``) on ``snap``: its keys, or its table cut into samples.

    ``counts`` hears the table rows a scan read (``rows_read``). ``budget``: the mixed epoch's, of which the
    query sources read before it hold ``held`` and ``scan_sources`` scan sources share the rest (for the least
    budget a refusal names).

    Raises:
        ConfigError: it returned no keys (a source of weight > 0 must give samples).
        SourceError: its table does not fit its share of ``[source] memory``.
        SampleError: a key came twice and repeats are not dropped.
    """
    where = f"[samples.{name}]"
    shape, scan = None, None
    if isinstance(cfg.samples, SamplesConfig):
        shape = await snap.describe(cfg)
        keys, key_columns = await snap.read_keys(cfg, shape.keys), shape.keys
    else:
        read = await _read_whole(cfg, snap, vocabulary, where, budget, held, scan_sources)
        scan, keys, key_columns = read, read.sample_keys, read.shape.key_columns
        counts["rows_read"] = counts.get("rows_read", 0) + read.table.rows_read
    samples = cfg.samples
    drop = samples.duplicates == "drop"
    chosen = choose(keys, seed=cfg.batches.seed, name=name, fraction=samples.fraction, drop=drop, where=where)
    if chosen.m == 0:
        what = "no keys" if not chosen.n_keys else f"{chosen.n_keys} keys of which fraction chose none"
        raise ConfigError(f"{where} returned {what}: a source needs samples (weight = 0 leaves it out)")
    passes = Passes(chosen, seed=cfg.batches.seed, name=name)
    return SourceRead(name, code, cfg, key_columns, chosen, passes, shape=shape, scan=scan)


async def _read_whole(
    cfg: Config,
    snap: Snapshot,
    vocabulary: Vocabulary | None,
    where: str,
    budget: int,
    held: int,
    scan_sources: int,
) -> ScanRead:
    """A scan source's table read whole within its share, or refused naming the least budget (:func:`_too_large`)."""
    coding = Coding(cfg, snap, vocabulary)
    shape = await coding.shape()
    try:
        read = await read_whole(cfg, snap, coding, shape)
    except TableTooLarge as e:
        # Its rows, for the least budget: counted by the server (a table beyond memory is not read here).
        rows = int((await snap.fetch(f"SELECT count(*) FROM {shape.relation}", f"rows of {shape.relation}"))[0][0])
        raise _too_large(cfg, rows, len(shape.key_names), e, where, budget, held, scan_sources) from None
    assert read is not None, "read whole or refused: no hand-over"
    return read


def _too_large(
    cfg: Config, rows: int, width: int, e: TableTooLarge, where: str, budget: int, held: int, scan_sources: int
) -> SourceError:
    """The refusal of a scan source beyond its share of ``budget``, naming the least ``--memory`` that holds it."""
    need = Policy.for_scan(cfg.source.memory_bytes).in_memory_bytes(rows, e.bytes_per_row, rows, width)
    least = least_budget(need, held, scan_sources)
    return SourceError(
        f"{where} table: {rows:,} rows need about {need / MIB:,.0f} MiB in memory, more than its share of "
        f"[source] memory ({budget / MIB:,.0f} MiB beside the other sources); a mixed epoch's scan sources are "
        f"read whole: the least budget that holds it is --memory {least // MIB}MiB"
    )


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
