"""A mixed epoch's batch source: the plan of every slot, then each unit filled from every source.

Planning (:func:`mixed_source`): each source is read (:mod:`.reading`), placed at its start
(:mod:`.positions`), and takes its quota from there (:mod:`.passes`); the apportionment
(:mod:`.apportion`) says how many samples of each source each batch holds. Within a batch the sources'
samples are shuffled by a hash of the slot, so that they interleave. The slots' source codes and their
places in their source's run are held for the epoch (9 bytes a sample), as are the keys.

Serving (:mod:`.serving`): each unit draws a run of every source's samples, fetched or decoded in the way the
source was read, and scatters them into their slots. The writer sees an ordinary
:class:`~pgprefetch.write.batches.BatchSource`, which a cluster's executor can cut into parts (:mod:`.parts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

from pgprefetch.config.model import MIX_VERSION, SOURCE_ARRAY, Config
from pgprefetch.pg.session import BatchReader, Snapshot
from pgprefetch.pg.statement import BatchStatement
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.mix.apportion import shares
from pgprefetch.write.mix.parts import cut
from pgprefetch.write.mix.passes import Chosen, by_hash, slot_hash
from pgprefetch.write.mix.positions import apportionment, epoch_samples, find_record, needed, starts, weights_at
from pgprefetch.write.mix.reading import (
    Share,
    SourceRead,
    check_same_arrays,
    describe_table,
    held_bytes,
    prefixed,
    read_query_source,
    read_scan_source,
    source_config,
    widest,
)
from pgprefetch.write.mix.serving import Served, Slots, batch_source
from pgprefetch.write.plan import EpochPlan, Vocabulary
from pgprefetch.write.query import layout_from, query_statement
from pgprefetch.write.scan.table import array_lengths
from pgprefetch.write.scan.whole import scan_layout
from pgprefetch.write.spill.folder import SpillFolder


def _slots(per_batch: np.ndarray, seed: int, epoch: int, size: int) -> Slots:
    """Each slot's source code and its place in that source's run, batch by batch, shuffled within batches."""
    n = int(per_batch.sum())
    n_sources = per_batch.shape[1]
    runs = per_batch.ravel()  # (batch, source) runs, batch-major: each a source's samples of a batch
    codes = np.repeat(np.tile(np.arange(n_sources, dtype=np.int8), per_batch.shape[0]), runs)
    # a sample's place in its source's run of the epoch: its place in the batches' concatenation, less
    # where its (batch, source) run starts there, plus the source's samples in the batches before
    before = (np.cumsum(per_batch, axis=0) - per_batch).ravel()
    index = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(runs) - runs - before, runs)
    h = slot_hash(seed, "", epoch, 0, n)
    full = n // size
    order = np.empty(n, dtype=np.int64)
    blocks = h[: full * size].reshape(full, size)
    order[: full * size] = (by_hash(blocks) + np.arange(full)[:, None] * size).ravel()
    order[full * size :] = by_hash(h[full * size :]) + full * size
    return Slots(codes[order], index[order], per_batch)


async def _read_sources(
    cfg: Config,
    snap: Snapshot,
    vocabulary: Vocabulary | None,
    names: list[str],
    counts: dict[str, Any],
    spill: SpillFolder,
    stack: contextlib.AsyncExitStack,
) -> list[SourceRead]:
    """Every source the epoch draws on, in ``[samples]`` order: query sources first, scan sources after them.

    The budget is shared by what each needs: the query sources' keys are read and held first (each
    reserved in the pool); then the scan sources, the smallest table first (as the planner estimates
    them), each sharing what those before it left equally with those after it, so that a small table
    takes what it holds and the largest what is left. A scan source whose table does not fit its share
    spills to a folder of its own (:mod:`.spilled`), removed when the epoch is written; what its gather
    will hold counts against the shares of the sources read after it.
    """
    assert cfg.mix is not None
    pool = memory.current()
    sources = [(code, s) for code, s in enumerate(cfg.mix.sources) if s.name in names]
    queries = [(code, s) for code, s in sources if hasattr(s.samples, "query")]
    scans = [(code, s) for code, s in sources if not hasattr(s.samples, "query")]
    budget = cfg.source.memory_bytes
    reads: dict[int, SourceRead] = {}
    held = 0
    for code, s in queries:
        async with prefixed(s.name):
            own = source_config(cfg, s.name, budget // max(1, len(sources)), len(queries))
            reads[code] = read = await read_query_source(own, s.name, code, snap)
            pool.reserve(f"keys of {s.name}", held_bytes(read))  # held for the epoch
            held += held_bytes(read)
    tables = []
    for code, s in scans:
        async with prefixed(s.name):
            own = source_config(cfg, s.name, budget, len(queries))
            tables.append((code, s, await describe_table(own, snap, vocabulary)))
    tables.sort(key=lambda t: t[2].size_order)  # each takes what it needs of what those before it left
    for i, (code, s, table) in enumerate(tables):
        share = Share(budget, held, len(tables) - i)
        async with prefixed(s.name):
            own = source_config(cfg, s.name, share.own_budget, len(queries))
            reads[code] = read = await read_scan_source(own, s.name, code, table, share, spill.sub(f"{code}"), stack)
        counts["rows_read"] = counts.get("rows_read", 0) + read.rows_read
        if read.spilled is not None:
            held += read.spilled.working_bytes  # reserved by its gather, after the sources read after it
        else:
            assert read.scan is not None, "a scan source is read whole or into buckets"
            pool.reserve(f"table of {s.name}", read.scan.table.nbytes + held_bytes(read))  # held for the epoch
            held += read.scan.table.nbytes + held_bytes(read)
    return [reads[code] for code, _ in sources]


@asynccontextmanager
async def mixed_source(
    cfg: Config, snap: Snapshot, epoch: int, spill: SpillFolder, vocabulary: Vocabulary | None = None
) -> AsyncIterator[BatchSource]:
    """The batch source of mixed epoch ``epoch`` on ``snap`` (see the module's docstring).

    ``spill``: the dump's spill folder, for a scan source beyond its share. ``vocabulary``: the store the
    ``"auto"`` categories extend, whose records of earlier epochs say where each source stands
    (:mod:`.positions`); None: a fresh store's.
    """
    assert cfg.mix is not None
    store = vocabulary.store if vocabulary is not None else None
    where = f"{store.location}/epoch {epoch}" if store is not None else f"epoch {epoch}"
    record = find_record(cfg, store, epoch)
    names = needed(cfg, epoch, record)
    counts: dict[str, Any] = {}
    async with contextlib.AsyncExitStack() as stack:
        reads = await _read_sources(cfg, snap, vocabulary, names, counts, spill, stack)
        passes = {r.name: r.passes for r in reads}
        begun = starts(cfg, epoch, passes, record, where)
        sizes = {r.name: r.chosen.m for r in reads}
        n = epoch_samples(cfg, epoch, sizes)
        size = cfg.batches.size
        weights = weights_at(cfg, epoch)
        per_batch = apportionment(weights).per_batch(n, size)
        quota = per_batch.sum(axis=0)
        slots = _slots(per_batch, cfg.batches.seed, epoch, size)
        categories = await _categories(cfg, reads, snap, vocabulary)
        served: dict[int, Served] = {}
        ends = {}
        for r in reads:
            taken, ends[r.name] = await asyncio.to_thread(r.passes.take, begun.positions[r.name], int(quota[r.code]))
            async with prefixed(r.name):
                served[r.code] = await _serve(r, taken, snap, categories, stack)
        check_same_arrays([(s.name, s.layout.arrays()) for s in served.values()])
        plan = _plan(cfg, epoch, reads, served, slots, categories)
        records = {"sources": [s.name for s in cfg.mix.sources], "source_array": SOURCE_ARRAY,
                   "mix": _record(cfg, epoch, reads, begun, ends, quota, weights, n, record)}  # fmt: skip
        parts = functools.partial(cut, size, served, slots)  # a cluster's part of the epoch (:mod:`.parts`)
        snapshot = (snap.id, snap.server_version)
        yield batch_source(cfg, plan, served, slots, snapshot, counts.get("rows_read"), records, parts)


async def _categories(
    cfg: Config, reads: list[SourceRead], snap: Snapshot, vocabulary: Vocabulary | None
) -> dict[str, list[str]]:
    """Each categorical field's list over every source: the longest of theirs (each extends the store's)."""
    lists: dict[str, list[str]] = {}
    for r in reads:
        async with prefixed(r.name):
            scan = r.scan_shape
            if scan is not None:
                found = scan.categories
            else:
                assert r.shape is not None
                found = (await query_statement(r.cfg, snap, r.shape, vocabulary))["categories"]
        for name, values in found.items():
            if len(values) > len(lists.get(name, [])):
                lists[name] = values
    return lists


async def _serve(
    r: SourceRead, taken: np.ndarray, snap: Snapshot, categories: dict[str, list[str]], stack: contextlib.AsyncExitStack
) -> Served:
    """Source ``r`` ready to give the samples ``taken`` (its passes' handles on them): layout and reader."""
    if r.spilled is not None:
        keys, buckets, rows = await asyncio.to_thread(r.spilled.index.pick, taken)
        memory.current().reserve(f"run of {r.name}", keys.nbytes + buckets.nbytes + rows.nbytes)  # for the epoch
        layout = scan_layout(r.cfg, r.spilled.shape, r.spilled.lengths, _source_plan(r, keys))
        run = await asyncio.to_thread(r.spilled.gather, layout, keys, buckets, rows)
        return Served(r.name, r.code, layout, keys, r.key_columns, run=run)
    assert isinstance(r.chosen, Chosen), "a source read in memory"
    keys = np.ascontiguousarray(r.chosen.keys[:, taken])
    plan = _source_plan(r, keys)
    if r.scan is not None:
        layout = scan_layout(r.cfg, r.scan.shape, array_lengths(r.scan.table), plan)
        starts = r.scan.starts[r.chosen.index[taken]]
        return Served(r.name, r.code, layout, keys, r.key_columns, table=r.scan.table, starts=starts)
    assert r.shape is not None
    statement = await query_statement(r.cfg, snap, r.shape, None, categories)
    plan = dataclasses.replace(plan, **statement)
    opened = BatchReader.open(r.cfg.source, snap.id, plan.sql, plan.params, row_wise=plan.row_wise)
    reader = await stack.enter_async_context(opened)
    # The first sample's array lengths fix the shapes; one that gives this epoch nothing uses any key of its own.
    first = keys[:, :1] if keys.shape[1] else r.chosen.keys[:, :1]
    layout = layout_from(r.cfg, plan, await reader.fetch(0, first))
    sent = BatchStatement(plan.sql, plan.params, plan.row_wise)
    return Served(r.name, r.code, layout, keys, r.key_columns, reader, sent)


def _source_plan(r: SourceRead, keys: np.ndarray) -> EpochPlan:
    """A plan of the source's run alone, for the layout builders of its mode."""
    n = keys.shape[1]
    shape = r.scan_shape
    return EpochPlan(
        epoch=0,
        keys=keys,
        key_columns=r.key_columns,
        n_keys=n,
        duplicates_dropped=0,
        used=n,
        n_batches=n,
        keys_sha256="",
        columns=shape.columns if shape else (),
        by_field=shape.by_field if shape else {},
        categories=shape.categories if shape else {},
        sql="",
        params=(),
    )


def _plan(
    cfg: Config,
    epoch: int,
    reads: list[SourceRead],
    served: dict[int, Served],
    slots: Slots,
    categories: dict[str, list[str]],
) -> EpochPlan:
    """The mixed epoch's plan: every slot's key (zero slots past a narrower source's), and their hash."""
    key_columns = widest(reads)
    # every source's run side by side (a narrower key zero-padded), then one gather by each slot's place in it
    runs = np.zeros((key_columns.width, sum(s.keys.shape[1] for s in served.values())), dtype=np.int64)
    offset = np.zeros(max(served) + 1, dtype=np.int64)
    at = 0
    for code, s in sorted(served.items()):
        runs[: s.keys.shape[0], at : at + s.keys.shape[1]] = s.keys
        offset[code], at = at, at + s.keys.shape[1]
    keys = runs[:, offset[slots.codes] + slots.index]
    digest = hashlib.sha256(b"pgprefetch-mix")
    digest.update(np.ascontiguousarray(slots.codes).data)
    for column in keys:
        digest.update(np.ascontiguousarray(column).data)
    size = cfg.batches.size
    first = next(iter(served.values()))
    return EpochPlan(
        epoch=epoch,
        keys=keys,
        key_columns=key_columns,
        n_keys=sum(r.chosen.n_keys for r in reads),
        duplicates_dropped=sum(r.chosen.repeats for r in reads),
        used=int(slots.codes.size),
        n_batches=-(-slots.codes.size // size),
        keys_sha256=digest.hexdigest(),
        columns=first.layout.columns,
        by_field={f.name: f.columns for f in first.layout.fields},
        categories=categories,
        sql="",
        params=(),
    )


def _record(
    cfg: Config,
    epoch: int,
    reads: list[SourceRead],
    begun: Any,
    ends: dict[str, Any],
    quota: np.ndarray,
    weights: tuple[Any, ...],
    n: int,
    record: tuple[int, dict[str, Any]] | None,
) -> dict[str, Any]:
    """What the manifest records of the mix: per source its counts, weight, share and positions.

    A source not read (weight 0 here and in every epoch counted) keeps the position of the record
    continued, so that a later epoch that gives it weight again continues it there.
    """
    assert cfg.mix is not None
    by_name = {r.name: r for r in reads}
    earlier = {e.get("name"): e for e in (record[1].get("sources", []) if record else []) if isinstance(e, dict)}
    exact = shares(weights)
    out = []
    for code, s in enumerate(cfg.mix.sources):
        entry: dict[str, Any] = {
            "name": s.name,
            "code": code,
            "mode": "query" if hasattr(s.samples, "query") else "scan",
            "weight": weights[code],
            "share": float(exact[code]),
            "samples": int(quota[code]),
        }
        r = by_name.get(s.name)
        if r is None:
            end = earlier.get(s.name, {}).get("end", {"pass": 0, "index": 0, "after": None})
            entry.update(start=end, end=end)
        else:
            at, to = begun.positions[s.name], ends[s.name]
            after = r.passes.after(to)
            entry.update(
                n_keys=r.chosen.n_keys,
                keys=r.chosen.m,
                duplicates_dropped=r.chosen.repeats,
                passes=round(int(quota[code]) / r.chosen.m, 6),
                start={"pass": at.pass_, "index": at.index},
                end={
                    "pass": to.pass_,
                    "index": to.index,
                    "after": None if after is None else [str(after[0]), after[1]],
                },
                **r.key_columns.manifest(),
            )
        out.append(entry)
    return {
        "version": MIX_VERSION,
        "samples": n,
        "continues": begun.record,  # the epoch whose record this one continues (None: counted from 0)
        "counted": begun.counted,  # epochs counted in between (none written, or none recorded)
        "sources": out,
    }
