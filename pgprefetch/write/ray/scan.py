"""Scan mode on a Ray cluster: the table read once, in page ranges, and routed to the parts that write it.

No process holds the whole table. Under the driver's exported snapshot:

1. **Read.** Reader tasks COPY disjoint page ranges of the table (the single process's ranges, its decoder,
   ``[source] connections`` sub-ranges each) and each keeps its range, a *block*, in the object store (which
   spills to disk); only the block's keys come back to the driver. There are at least as many readers as
   parts, and more when the table's pages exceed ``[source] memory`` per reader, so that none holds more.
2. **Cut.** The driver sorts the keys of all blocks and cuts the samples from them as the single process
   does (:mod:`pgprefetch.write.scan.exchange`), so the epoch's order is the same; the read is kept in the
   run's cache, and every epoch of a ``--epochs A-B`` run is cut from it without reading the table again.
3. **Exchange.** Per epoch, one task beside each block cuts it into a piece per part: the rows that part's
   samples span. Each part joins its pieces and writes its batches with the single process's gather,
   writer and checksums (:func:`~pgprefetch.write.ray.part.run_part`). Parts are made small enough that a
   part's rows fit ``[source] memory`` (:func:`min_parts`).

Every task is a plain Ray task retried when its worker or node is lost (its objects are rebuilt from
lineage); bad data and lost connections fail the epoch with the single process's errors.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from pgprefetch.config.model import Config, ScanConfig
from pgprefetch.errors import SourceError
from pgprefetch.pg.columns import Column
from pgprefetch.pg.session import Snapshot
from pgprefetch.write.batches import BatchSource, Progress
from pgprefetch.write.plan import EpochPlan, Vocabulary, resolve_categories
from pgprefetch.write.ray.cluster import TASK_RETRIES, failure
from pgprefetch.write.ray.part import ScanPart
from pgprefetch.write.ray.secret import opened, sealed
from pgprefetch.write.scan.exchange import Merged, Piece, cut_block, merge_keys, part_rows, route, rows_of
from pgprefetch.write.scan.shape import ScanShape, describe_scan, distinct_values
from pgprefetch.write.scan.table import Table, cut_whole, page_ranges, read_ranges
from pgprefetch.write.scan.whole import plan_scan, scan_layout


@dataclass(frozen=True)
class BlockSummary:
    """What a reader hands the driver: its block's keys and sizes (the block stays in the object store)."""

    keys: np.ndarray  # (n_key_columns [+ 1], n_rows), sorted within the block
    nbytes: int
    widths: dict[str, int]  # each array column's element count (one length for the whole table)


@dataclass
class SpreadRead:
    """A table read by a cluster's readers: the blocks where they lie, and the samples cut from their keys."""

    shape: ScanShape
    blocks: list[Any]  # ObjectRefs of each range's Table, its keys left out
    merged: Merged
    sample_keys: np.ndarray
    starts: np.ndarray  # each cut sample's first row, in the merged (sorted) order
    lengths: dict[Column, int]  # array columns' element counts, for the layout
    snapshot: str
    server_version: str
    nbytes: int  # the table's decoded bytes, over all blocks
    epochs_cut: int = 0


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES, num_returns=2)
def read_block(
    cfg: Config, snapshot: str, shape: ScanShape, wheres: list[str], dsn: tuple[Any, ...] = ()
) -> tuple[BlockSummary, Table]:
    """The Ray task: COPY a range of the table on the snapshot (a sub-range a connection); keys out, rows kept.

    ``cfg``'s DSN has no password; ``dsn`` is the whole one in the object store (:mod:`.secret`).
    """
    cfg = opened(cfg, dsn)
    mine = dataclasses.replace(cfg, source=dataclasses.replace(cfg.source, connections=len(wheres)))
    table = asyncio.run(read_ranges(mine, snapshot, shape, wheres, budget=0, empty_ok=True))
    widths = {c.name: v.shape[1] for c, v in table.values.items() if c.is_array}
    summary = BlockSummary(table.keys, table.nbytes, widths)
    return summary, dataclasses.replace(table, keys=np.empty((0, 0), dtype=np.int64))


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES)
def split_block(block: Table, wanted: list[tuple[np.ndarray, np.ndarray]]) -> Piece | list[Piece]:
    """The Ray task beside a block: its rows for each part (a list of one piece per part; one piece alone)."""
    pieces = cut_block(block, wanted)
    return pieces if len(pieces) > 1 else pieces[0]


async def read_spread(
    cfg: Config, snap: Snapshot, parts: int, progress: Progress | None, vocabulary: Vocabulary | None
) -> SpreadRead:
    """Read ``cfg``'s table on ``snap`` with reader tasks, and cut its samples (see the module's docstring)."""
    assert isinstance(cfg.samples, ScanConfig)
    shape = await describe_scan(cfg, snap)

    async def distinct(columns: list[str]) -> dict[str, set[str]]:
        return (await distinct_values(cfg, snap, shape, columns))[0]

    categories = await resolve_categories(cfg, distinct, vocabulary)
    shape = dataclasses.replace(shape, categories=categories)
    readers = max(parts, await _ranges_for_memory(cfg, snap, shape))
    per = cfg.source.connections  # each reader reads its range as the single process reads the table
    wheres = await page_ranges(snap, shape, readers * per)
    ranges = [wheres[i : i + per] for i in range(0, len(wheres), per)]
    sent, dsn = sealed(cfg)  # the readers' config names the server without the password
    refs = [read_block.remote(sent, snap.id, shape, mine, dsn) for mine in ranges]
    futures = {asyncio.wrap_future(summary.future()): i for i, (summary, _) in enumerate(refs)}
    summaries: list[BlockSummary] = [BlockSummary(np.empty((0, 0), np.int64), 0, {})] * len(refs)
    waiting = set(futures)
    try:
        while waiting:
            finished, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for future in finished:
                i = futures[future]
                try:
                    summaries[i] = future.result()
                except ray.exceptions.RayError as e:
                    raise failure(e, f"reader {i + 1} of {len(refs)} of {shape.relation}") from None
                if progress:
                    progress.rows(summaries[i].keys.shape[1])
    finally:
        for future in waiting:  # one reader failed: the others' blocks are not wanted
            future.cancel()
            ray.cancel(refs[futures[future]][0], force=True)
    merged = await asyncio.to_thread(merge_keys, [s.keys for s in summaries])
    if not merged.keys.shape[1]:
        raise SourceError(f"{shape.relation} has no rows: there is nothing to dump")
    lengths = _lengths(shape, summaries)
    sample_keys, starts = await asyncio.to_thread(cut_whole, Table(keys=merged.keys), shape, cfg.samples)
    return SpreadRead(
        shape, [block for _, block in refs], merged, sample_keys, starts, lengths, snap.id, snap.server_version,
        sum(s.nbytes for s in summaries),
    )  # fmt: skip


def _lengths(shape: ScanShape, summaries: list[BlockSummary]) -> dict[Column, int]:
    """The array columns' element counts: one for the whole table, as the single process requires."""
    lengths: dict[Column, int] = {}
    for c in shape.columns:
        seen = {s.widths[c.name] for s in summaries if c.name in s.widths}
        if len(seen) > 1:
            raise SourceError(
                f"column {c.name} has arrays of {' and '.join(map(str, sorted(seen)))} elements in different parts "
                "of the table (scan mode needs every row's arrays to have one length)"
            )
        if seen:
            lengths[c] = seen.pop()
    return lengths


async def _ranges_for_memory(cfg: Config, snap: Snapshot, shape: ScanShape) -> int:
    """Enough page ranges that none holds more than ``[source] memory`` of the table's pages (1 for a SELECT)."""
    budget = cfg.source.memory_bytes
    if not shape.plain_table or not budget:
        return 1
    sql = "SELECT pg_relation_size($1::text::regclass)"
    size = int((await snap.fetch(sql, f"size of {shape.relation}", shape.relation))[0][0])
    return max(1, math.ceil(size / budget))


def spread_source(cfg: Config, read: SpreadRead, epoch: int) -> BatchSource:
    """Epoch ``epoch`` of a spread read: its plan and layout; its batches are cut by the parts."""
    plan = plan_scan(cfg, read.shape, read.sample_keys, epoch)
    layout = scan_layout(cfg, read.shape, read.lengths, plan)
    rows_read = read.merged.keys.shape[1] if read.epochs_cut == 0 else 0  # the first epoch of a read pays for it
    read.epochs_cut += 1

    async def fetch(batch: int, count: int) -> object:
        raise AssertionError("a spread epoch's batches are cut by its parts")

    def produce(batch: int, count: int, _: object, buffers: dict[str, np.ndarray]) -> None:
        raise AssertionError("a spread epoch's batches are cut by its parts")

    return BatchSource(
        plan, layout, read.snapshot, read.server_version, rows_read, fetch, produce, 1, spread=read
    )  # fmt: skip


def min_parts(cfg: Config, read: SpreadRead, plan: EpochPlan) -> int:
    """The fewest parts whose rows fit ``[source] memory`` each: a part holds its pieces and their join."""
    budget = cfg.source.memory_bytes
    rows = read.merged.keys.shape[1]
    if not budget or not rows:
        return 1
    per_row = read.nbytes / rows
    window = cfg.samples.rows
    parts = 1
    while parts < plan.n_batches and 2 * part_rows(-(-plan.used // parts), window, rows) * per_row > budget:
        parts *= 2
    return min(parts, plan.n_batches)


def exchange(
    cfg: Config, read: SpreadRead, plan: EpochPlan, parts: list[tuple[range, tuple[int, ...]]]
) -> list[ScanPart | None]:
    """Route each part's rows (``parts``: its owned batches, and those still to write) from the blocks.

    One :func:`split_block` task per block; a part with nothing to write gets None.
    """
    assert plan.samples is not None
    size, window = cfg.batches.size, cfg.samples.rows
    owned_starts, wanted = [], []
    for owned, pending in parts:
        first, last = owned.start * size, min(owned.stop * size, plan.used)
        starts = read.starts[plan.samples[first:last]]
        owned_starts.append(starts)
        todo = np.concatenate([starts[b * size - first : (b + 1) * size - first] for b in pending] or [starts[:0]])
        wanted.append(route(rows_of(todo, window), read.merged))
    busy = [j for j, (_, pending) in enumerate(parts) if pending]
    pieces: list[list[Any]] = []
    for b, block in enumerate(read.blocks):
        routed = [wanted[j][b] for j in busy]
        refs = split_block.options(num_returns=len(busy)).remote(block, routed)
        pieces.append(refs if isinstance(refs, list) else [refs])  # a list of refs for more than one return
    out: list[ScanPart | None] = [None] * len(parts)
    for k, j in enumerate(busy):
        out[j] = ScanPart(tuple(pieces[b][k] for b in range(len(read.blocks))), owned_starts[j])
    return out
