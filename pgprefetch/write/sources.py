"""The one choice of where an epoch's batches come from, for the dump and for ``pgprefetch check`` alike.

- **a mixed epoch**: every source on the epoch's snapshot, interleaved by weight (:mod:`pgprefetch.write.mix`);
- **a packed epoch**: documents packed into token sequences (:mod:`pgprefetch.write.pack`);
- **query mode**: the per-sample query, one statement per unit of batches (:mod:`pgprefetch.write.query`);
- **scan mode on a cluster**: an executor's readers hold the table; its parts cut the epoch from it;
- **scan mode, cached**: an earlier epoch of this run read the table whole; this one is cut from it;
- **scan mode**: the table read by the strategy its size calls for (:mod:`pgprefetch.write.scan.strategy`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from pgprefetch.config.model import Config
from pgprefetch.decode.layout import UnknownCategoryError
from pgprefetch.pg.session import Snapshot
from pgprefetch.write.batches import BatchSource, Progress
from pgprefetch.write.executor import Executor
from pgprefetch.write.mix.source import mixed_source
from pgprefetch.write.pack.mixed import mixed_packed_source
from pgprefetch.write.pack.source import packed_source
from pgprefetch.write.plan import EpochPlan, Vocabulary, name_unknown_category
from pgprefetch.write.query import query_source
from pgprefetch.write.scan.shape import sample_text
from pgprefetch.write.scan.strategy import open_scan
from pgprefetch.write.scan.whole import ScanRead, scan_source
from pgprefetch.write.spill.folder import SpillFolder
from pgprefetch.write.transform.inputs import check_inputs, sample_key_columns, sample_keys
from pgprefetch.write.transform.mixed import mixed_stages
from pgprefetch.write.transform.stage import stage_for


class ReadCache:
    """A scan mode table read on one snapshot, kept so that the next epochs of one run are cut from it."""

    def __init__(self) -> None:
        self.read: ScanRead | None = None  # held by this process
        self.spread: object | None = None  # held by an executor's cluster (its blocks in the object store)

    def covers(self, cfg: Config) -> bool:
        """Whether an epoch of ``cfg`` can be cut from what is cached (no snapshot needed)."""
        cached = self.read is not None or self.spread is not None
        # (a transform reads its inputs on the epoch's snapshot: no epoch of a config with one goes without)
        return cfg.mix is None and cfg.mode == "scan" and cached and not cfg.transforms


@asynccontextmanager
async def open_source(
    cfg: Config,
    epoch: int,
    snap: Snapshot | None,
    cache: ReadCache,
    *,
    spill: SpillFolder,
    write: bool = True,
    progress: Progress | None = None,
    vocabulary: Vocabulary | None = None,
    executor: Executor | None = None,
    transforms_cache: Path | None = None,
) -> AsyncIterator[BatchSource | EpochPlan]:
    """The batch source of ``epoch``, in the way its config and the table's size call for.

    ``snap`` may be None only when ``cache`` covers the config. Whatever does not fit ``[source] memory``
    (keys, a scan's rows) goes to files in ``spill``, which the caller owns and removes; without ``write``
    (a check, which writes nothing) a scan yields only the epoch's plan, made from the keys.
    ``vocabulary`` is the store the ``"auto"`` categories extend (:func:`~pgprefetch.write.plan.resolve_categories`).
    ``executor``: a scan is read and cut on its cluster (:meth:`~pgprefetch.write.executor.Executor.read_scan`).
    A scan's value outside a category list is named by value (:func:`_values_named`), whichever way it is read.
    ``[transforms]`` add their outputs to the batches (:mod:`pgprefetch.write.transform`), their cache in
    ``transforms_cache`` (None: every output computed).
    """
    if cfg.packing is not None:  # documents packed into sequences (a tokenizing transform's too; mixed by tokens)
        assert snap is not None, "a packed epoch is planned on its own snapshot"
        opened = (
            mixed_packed_source(cfg, snap, epoch, vocabulary)
            if cfg.mix is not None
            else packed_source(cfg, snap, epoch, vocabulary, spill, transforms_cache)
        )
        async with opened as packed:
            yield packed
        return
    if not cfg.transforms:
        async with _opened(cfg, epoch, snap, cache, spill, write, progress, vocabulary, executor) as source:
            yield source
        return
    assert snap is not None, "an epoch with transforms has its snapshot (ReadCache.covers)"
    if cfg.mix is not None:
        async with mixed_stages(cfg, snap, epoch, transforms_cache) as stages:
            if stages.skips and write:  # each source's failing samples left out before the mix is planned
                cfg = await stages.sweep(cfg, snap)
            async with _opened(cfg, epoch, snap, cache, spill, write, progress, vocabulary, executor) as source:
                yield await stages.serve(source, first=write) if isinstance(source, BatchSource) else source
        return
    keys = await sample_key_columns(cfg, snap)
    await check_inputs(cfg, snap)
    async with stage_for(cfg, snap.id, keys, epoch, transforms_cache) as stage:
        if stage.skips and write:  # the samples a transform fails on, found first, left out of the plan
            cfg = dataclasses.replace(cfg, left_out=await stage.sweep(sample_keys(cfg, snap, keys)))
        async with _opened(cfg, epoch, snap, cache, spill, write, progress, vocabulary, executor) as source:
            yield await stage.serve(source, first=write) if isinstance(source, BatchSource) else source


@asynccontextmanager
async def _opened(
    cfg: Config,
    epoch: int,
    snap: Snapshot | None,
    cache: ReadCache,
    spill: SpillFolder,
    write: bool,
    progress: Progress | None,
    vocabulary: Vocabulary | None,
    executor: Executor | None,
) -> AsyncIterator[BatchSource | EpochPlan]:
    """The batch source of the epoch's columns, chosen as :func:`open_source` says."""
    async with _values_named(cfg, snap):
        if cfg.mix is not None:  # every source read on this epoch's snapshot (a scan source's table too)
            assert snap is not None, "a mixed epoch is read on its own snapshot"
            async with mixed_source(cfg, snap, epoch, spill, vocabulary) as mixed:
                yield mixed
            return
        if cfg.mode == "scan" and executor is not None:
            if cache.spread is None or cfg.transforms:  # (a transform's inputs: on this epoch's snapshot)
                assert snap is not None, "a snapshot is needed unless the table read is cached"
                if progress:
                    progress.reading(epoch)
                cache.spread = await executor.read_scan(cfg, snap, progress, vocabulary)
            yield executor.scan_source(cfg, cache.spread, epoch)
            return
        if cache.covers(cfg):
            assert cache.read is not None
            yield scan_source(cfg, cache.read, epoch)
            return
        assert snap is not None, "a snapshot is needed unless the table read is cached"
        if cfg.mode == "query":
            async with query_source(cfg, snap, epoch, vocabulary, spill) as source:
                yield source
            return
        if progress:
            progress.reading(epoch)
        kept: list[ScanRead] = []  # a table read whole: kept for the run's next epochs
        on_rows = progress.rows if progress else None
        async with open_scan(
            cfg, snap, epoch, spill, write=write, keep=kept, vocabulary=vocabulary, on_rows=on_rows
        ) as source:
            cache.read = kept[0] if kept else cache.read
            yield source


@asynccontextmanager
async def _values_named(cfg: Config, snap: Snapshot | None) -> AsyncIterator[None]:
    """Name, once, on the epoch's snapshot, a scan's value outside a category list met in the block.

    The COPY hands the client only the value's code (-1), in any of the scan's ways (a Ray part's included),
    so the value is looked up here (query mode names its own: :func:`~pgprefetch.write.query.query_source`).
    An epoch cut from a table cached by an earlier epoch has no snapshot open: its error names the sample.
    """
    try:
        yield
    except UnknownCategoryError as e:
        if cfg.mode != "scan" or cfg.mix is not None or snap is None:
            raise
        raise await name_unknown_category(cfg, snap, e, sample_text(cfg, snap)) from None
