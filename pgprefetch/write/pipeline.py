"""The dump: keys -> shuffle -> one statement per batch -> decode -> Zarr, overlapped and bounded.

``connections`` workers each own one database connection. A worker takes the next batch index, fetches
the batch in one round trip, then decodes and writes it on a thread (CPU work stays off the event loop)
while the other workers' statements run. Each worker reuses one set of batch buffers, so at most
``connections`` batches are in memory whatever the epoch's size. Batches land in their own chunk files,
so they can finish in any order; the epoch is published only when all of them are on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pgprefetch.config.model import Config, config_change
from pgprefetch.errors import ConfigError, SourceError
from pgprefetch.pg.retry import RetryPolicy, count
from pgprefetch.pg.session import Snapshot
from pgprefetch.store.base import KEYS_ARRAY, ArraySpec, Store
from pgprefetch.store.maintenance import source_counts
from pgprefetch.store.open import config_store
from pgprefetch.store.splits import create_store, remove_unused, served_epoch
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource, Progress
from pgprefetch.write.executor import Executor, Spread
from pgprefetch.write.files.stats import EpochStats
from pgprefetch.write.files.writer import EpochWriter
from pgprefetch.write.manifest import epoch_manifest
from pgprefetch.write.memory import heap
from pgprefetch.write.memory.policy import LEAST_BUDGET, heap_bytes
from pgprefetch.write.plan import EpochPlan, Vocabulary
from pgprefetch.write.schedule import write_batches
from pgprefetch.write.sources import ReadCache, open_source
from pgprefetch.write.spill.folder import SpillFolder
from pgprefetch.write.tasks import finish_in_thread
from pgprefetch.write.transform.cache import transforms_folder

log = logging.getLogger("pgprefetch")


@dataclass(frozen=True)
class DumpResult:
    """The outcome of dumping one epoch."""

    epoch: int
    path: Path | str  # the epoch's folder, or its URL in an object store
    status: str = "written"  # written | skipped (already complete) | busy (another dump is writing it)
    n_batches: int = 0
    n_samples: int = 0
    bytes: int = 0
    seconds: float = 0.0
    resumed: int = 0  # batches kept from an interrupted dump
    retries: int = 0  # lost connections survived
    retry_causes: dict[str, int] = dataclasses.field(default_factory=dict)  # the same, by cause (retry.CAUSES)
    restarted: str | None = None  # why an interrupted dump's partial epoch was discarded
    duplicates_dropped: int = 0  # repeated keys kept once ([samples] duplicates = "drop")
    last_dropped: int = 0  # samples of the short last batch left out (drop_last): a different few each epoch
    rows_read: int | None = None  # scan mode: table rows this epoch read (0 when cut from an earlier read)
    holder: str | None = None  # who holds the epoch's lock, when busy
    executor: str | None = None  # "ray": the batches were written by a cluster's workers
    parts: int = 0  # the epoch's parts, with an executor
    part_retries: tuple[int, ...] = ()  # per part: its task's reruns (a worker or node lost)
    sources: dict[str, int] | None = None  # a mixed epoch: each source's samples (skipped: from the manifest)
    peak_rss: int = 0  # this process's peak resident memory so far, bytes (the budget's promise: docs/operations.md)

    @property
    def samples_per_s(self) -> float:
        """Throughput of the whole dump, keys query included."""
        return self.n_samples / self.seconds if self.seconds else 0.0

    def to_json(self) -> dict[str, Any]:
        """The summary ``--json`` prints."""
        out: dict[str, Any] = {
            "epoch": self.epoch,
            "status": self.status,
            "path": str(self.path),
            "n_batches": self.n_batches,
            "n_samples": self.n_samples,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "samples_per_s": round(self.samples_per_s, 1),
        }
        if self.resumed:
            out["resumed_batches"] = self.resumed
        if self.restarted:
            out["restarted"] = self.restarted
        if self.retries:
            out["retries"] = self.retries
            out["retry_causes"] = self.retry_causes
        if self.duplicates_dropped:
            out["duplicates_dropped"] = self.duplicates_dropped
        if self.last_dropped:
            out["last_dropped"] = self.last_dropped
        if self.rows_read is not None:
            out["rows_read"] = self.rows_read
        if self.sources is not None:
            out["sources"] = self.sources
        if self.executor:
            out.update(executor=self.executor, parts=self.parts, part_retries=list(self.part_retries))
        if self.peak_rss:
            out["peak_rss"] = self.peak_rss
        return out


RETRIES = RetryPolicy().retries  # lost connections survived per epoch; the waits double from 0.5 s up to 8 s


async def dump_epochs(
    cfg: Config,
    epochs: Iterable[int],
    *,
    force: bool = False,
    progress: Progress | None = None,
    retries: int | RetryPolicy = RETRIES,
    executor: Executor | None = None,
    parents: bool = False,
) -> list[DumpResult]:
    """Dump several epochs in turn; see :func:`dump_epoch`.

    In query mode each epoch has its own snapshot. In scan mode the table is read once, on one snapshot,
    and every epoch is cut from that read (each manifest records the snapshot).
    """
    cache = ReadCache()
    return [
        await dump_epoch(
            cfg, e, force=force, progress=progress, retries=retries, cache=cache, executor=executor, parents=parents
        )
        for e in epochs
    ]


async def dump_epoch(
    cfg: Config,
    epoch: int,
    *,
    force: bool = False,
    progress: Progress | None = None,
    retries: int | RetryPolicy = RETRIES,
    cache: ReadCache | None = None,
    executor: Executor | None = None,
    parents: bool = False,
) -> DumpResult:
    """Write epoch ``epoch`` of ``cfg`` to its store, unless it is already there (``force`` rewrites it).

    One dump writes an epoch at a time: if another holds the epoch's lock this returns ``status="busy"``
    at once. A partial epoch left by an interrupted dump is resumed when its keys are unchanged, and
    started over (``restarted`` says why) when they are not. On any failure, Ctrl-C included, the partial
    epoch is kept for the next run and nothing is published; but a store this dump created, that holds
    no batch yet (a Ray cluster it could not join, a wrong DSN), is removed again: a failed first dump
    leaves nothing behind (:meth:`~pgprefetch.store.base.Store.remove_if_unused`).

    A connection lost mid-dump (a terminated backend, a server restart, a stalled route) is retried up to
    ``retries`` times (a number, or a :class:`~pgprefetch.pg.retry.RetryPolicy` with the waits) with backoff.
    The exported snapshot dies with its transaction, so a retry takes a new snapshot
    and reads the keys again; the batches already written are kept only if the new key list is provably
    the same (its sha256 matches), otherwise the epoch starts over.

    ``cache`` carries a scan mode table read from one epoch to the next (see :func:`dump_epochs`).
    ``executor`` writes the batches elsewhere (``pgprefetch.write.ray``: a Ray cluster's workers); by
    default this process does. A new local store's folder is created, not its parents, unless ``parents``:
    a mistyped path is refused rather than made (with ``--ahead``, a fresh store dumped from epoch 0).

    Raises:
        ConfigError: the queries do not fit the config, or the store holds another config's epochs.
        SourceError: the database failed, or a sample does not fit its fields (SampleError).
        StoreError: the store cannot be written.
    """
    if epoch < 0:
        raise ConfigError(f"epoch must be 0 or more, got {epoch}")
    if executor is not None:
        executor.check(cfg)
    store = config_store(cfg)
    epoch = served_epoch(store, epoch)  # an evaluation split's one epoch serves every epoch number
    if not force:  # first: another config's epoch is not "already complete"
        check_same_config(store, cfg, epoch)
    if store.is_complete(epoch) and not force:
        return _skipped(store, epoch)
    created = not store.exists()
    root_created = store.parent is not None and not store.parent.exists()  # a split's, in a store made now
    create_store(store, cfg.splits, parents)
    try:
        policy = retries if isinstance(retries, RetryPolicy) else RetryPolicy(retries=retries)
        return await _dump_with_retries(cfg, store, epoch, force, progress, policy, cache or ReadCache(), executor)
    except BaseException:
        if created:  # a dump that wrote no batch leaves no trace (a wrong DSN, RAY_ADDRESS)
            remove_unused(store, root_created)
        raise


def _skipped(store: Store, epoch: int) -> DumpResult:
    """The result for an epoch that is already complete, with its real counts."""
    m = store.manifest(epoch)
    return DumpResult(
        epoch=epoch,
        path=store.epoch_location(epoch),
        status="skipped",
        n_batches=m["n_batches"],
        n_samples=m["n_samples"],
        bytes=m.get("bytes", 0),
        sources=source_counts(m),
    )


async def _dump_with_retries(
    cfg: Config,
    store: Store,
    epoch: int,
    force: bool,
    progress: Progress | None,
    policy: RetryPolicy,
    cache: ReadCache,
    executor: Executor | None = None,
) -> DumpResult:
    """Hold the epoch's lock and dump it, retrying lost connections (see :func:`dump_epoch`)."""
    with store.writer_lock(epoch) as held:
        if not held:
            return DumpResult(epoch, store.epoch_location(epoch), status="busy", holder=store.lock_holder(epoch))
        if store.is_complete(epoch) and not force:  # finished by the dump we waited on
            return _skipped(store, epoch)
        started = time.monotonic()
        connected = False  # once any attempt got a snapshot, lost connections and refusals are retried
        causes: dict[str, int] = {}
        for attempt in range(policy.retries + 1):
            try:
                # --force: a fresh epoch on one snapshot (the first attempt discards any partial one).
                fresh = force and attempt == 0
                result = await _dump_locked(cfg, store, epoch, progress, fresh=fresh, cache=cache, executor=executor)
                return dataclasses.replace(
                    result, retries=attempt, retry_causes=causes, seconds=time.monotonic() - started
                )
            except SourceError as e:
                connected = connected or e.connected
                # Only once the dump got going: a server that refuses the very first connection is an error.
                if not (e.transient and connected):
                    raise
                if attempt == policy.retries:
                    raise SourceError(f"{e} (gave up after {policy.retries} retries)") from None
                causes = count(causes, e)
                wait = policy.wait(attempt)
                log.warning("epoch %d: %s; retrying in %.1f s", epoch, e, wait)
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")


def epoch_pool(cfg: Config) -> memory.MemoryPool:
    """The memory pool of an epoch's dump: ``[source] memory`` (at least the policy's :data:`LEAST_BUDGET`).

    The heap's kept memory is reserved from the start.
    """
    budget = cfg.source.memory_bytes
    pool = memory.MemoryPool(max(budget, LEAST_BUDGET) if budget else 0)  # the policy's floors, under a tiny one
    if budget:
        pool.reserve("heap", heap_bytes(budget))  # held for the dump: never freed
    return pool


def spill_folder(cfg: Config, store: Store, epoch: int) -> SpillFolder:
    """Where a dump's files beyond ``[source] memory`` go: beside the partial epoch, or in ``[source] scratch``.

    In a scratch folder the name holds the store's (hashed) location as well as the epoch, so that dumps of
    several stores can share one; a dump killed there leaves its files to the next dump of the epoch. Beside
    the partial epoch it is a place of the store's, reached with no link followed (:meth:`Store.place`), and
    removed with the partial epoch.
    """
    if cfg.source.scratch is None:
        return SpillFolder(store.place(store.spill_path(epoch)))
    return SpillFolder.in_scratch(cfg.source.scratch, str(store.location), epoch)


def check_same_config(store: Store, cfg: Config, epoch: int | None = None) -> None:
    """Refuse to add epochs of one config to a store holding another config's epochs, or to call them done.

    ``epoch``, when complete, is judged by its own manifest: an epoch of another config with the same
    number is not "already complete" for this one. Otherwise by the newest epoch (``--ahead`` asks before
    planning, with no epoch).
    """
    mine = cfg.sha256()
    if epoch is not None and store.is_complete(epoch):
        against = epoch
    else:
        epochs = store.epochs()
        if not epochs:
            return
        against = epochs[-1]
    manifest = store.manifest(against)
    theirs = manifest.get("config_sha256")
    if theirs != mine:  # named by the keys that differ, where the epoch recorded its config's settings
        change = config_change(manifest.get("config_content"), theirs, cfg)
        raise ConfigError(
            f"{store.location} holds epochs of another config (epoch {against}: {change}); use another [store] "
            "path, or --force to write there anyway"
        )


async def _dump_locked(
    cfg: Config,
    store: Store,
    epoch: int,
    progress: Progress | None,
    *,
    fresh: bool,
    cache: ReadCache,
    executor: Executor | None = None,
) -> DumpResult:
    """One attempt at the epoch; an error raised after the snapshot was taken carries ``connected = True``.

    Planning records new ``"auto"`` category values in the store's vocabulary before a batch is written.
    """
    started = time.monotonic()
    vocabulary = Vocabulary(store, record=True)
    connected = False
    try:
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(memory.using(epoch_pool(cfg)))  # every large allocation of the epoch reserves here
            snap = None if cache.covers(cfg) else await stack.enter_async_context(Snapshot.open(cfg.source))
            connected = True
            spill = stack.enter_context(spill_folder(cfg, store, epoch))  # removed when the epoch is written
            opened = open_source(
                cfg,
                epoch,
                snap,
                cache,
                spill=spill,
                progress=progress,
                vocabulary=vocabulary,
                executor=executor,
                transforms_cache=transforms_folder(cfg, store),
            )
            source = await stack.enter_async_context(opened)
            assert isinstance(source, BatchSource)  # (a plan alone comes only without a spool)
            return await _write_epoch(cfg, store, epoch, source, progress, started, fresh, executor)
    except SourceError as e:
        e.connected = connected or e.connected
        raise


async def _write_epoch(
    cfg: Config,
    store: Store,
    epoch: int,
    source: BatchSource,
    progress: Progress | None,
    started: float,
    fresh: bool,
    executor: Executor | None = None,
) -> DumpResult:
    """Write every batch of ``source`` not yet on disk (resuming a partial epoch), then publish."""
    size = cfg.batches.size
    plan = source.plan
    specs = source.specs()
    specs.append(ArraySpec(KEYS_ARRAY, np.dtype(np.int64), (plan.key_columns.width,)))
    stats = source.stats or EpochStats.of(source.layout, plan.n_batches, size, plan.used)
    owned = executor.driver_owns(store) if executor else None
    discard = fresh or bool(executor and executor.starts_over(store))  # (fresh: --force's first attempt)
    with store.uploader(epoch) as uploader:  # an object store: files go up while the dump runs
        writer = await finish_in_thread(
            EpochWriter, store, epoch, n_batches=plan.n_batches, batch_size=size, arrays=specs,
            compression=cfg.store.compression, identity=_identity(cfg, plan) | source.identity, fresh=discard,
            uploader=uploader, stats=stats, owned=owned,
        )  # fmt: skip
        with writer:  # a failure keeps the partial epoch: the next dump resumes it
            _announce(writer, source, epoch)
            todo = [b for b in range(plan.n_batches) if not writer.done[b]]
            spread = await _write_todo(cfg, store, source, writer, todo, progress, executor, fresh=fresh)
            manifest = _manifest(cfg, source, stats, writer, spread, executor, started)
            path = await finish_in_thread(writer.publish, manifest, spread.elsewhere if spread else ())
    return DumpResult(
        epoch=epoch,
        path=path,
        n_batches=plan.n_batches,
        n_samples=plan.used,
        bytes=manifest["bytes"],
        seconds=time.monotonic() - started,
        resumed=manifest["resumed_batches"],
        restarted=writer.restarted or (spread.restarted if spread else None),
        duplicates_dropped=plan.duplicates_dropped,
        last_dropped=plan.last_dropped,
        rows_read=source.rows_read,
        executor=executor.name if executor else None,
        parts=spread.parts if spread else 0,
        part_retries=spread.retries if spread else (),
        sources=source_counts(manifest),
        peak_rss=heap.peak_rss(),
    )


def _identity(cfg: Config, plan: EpochPlan) -> dict[str, Any]:
    """What a partial epoch's journal must match for its batches to be resumed: the config and the key list."""
    identity: dict[str, Any] = {"config_sha256": cfg.sha256(), "n_keys": plan.used, "keys_sha256": plan.keys_sha256}
    if plan.categories:  # batches coded with other lists are not resumed (the store's vocabulary grew meanwhile)
        identity["categories"] = plan.categories
    return identity


def _announce(writer: EpochWriter, source: BatchSource, epoch: int) -> None:
    """Say, once before the long part, what the writer kept or started over, and what planning found."""
    if writer.restarted:
        log.warning("epoch %d: an interrupted dump was started over: %s", epoch, writer.restarted)
    if writer.resumed:
        log.info("epoch %d: resuming: %d of %d batches kept from an interrupted dump", epoch, writer.resumed,
                 source.plan.n_batches)  # fmt: skip
    writer.begin(source.snapshot)
    for warning in source.warnings:
        log.warning("epoch %d: %s", epoch, warning)


async def _write_todo(
    cfg: Config,
    store: Store,
    source: BatchSource,
    writer: EpochWriter,
    todo: list[int],
    progress: Progress | None,
    executor: Executor | None,
    *,
    fresh: bool,
) -> Spread | None:
    """Write the batches ``todo`` in this process, or spread over ``executor``'s cluster (its parts' account)."""
    size, plan = cfg.batches.size, source.plan
    if progress:
        progress.start(plan.epoch, plan.used)
        progress.advance(min(plan.used, writer.resumed * size), 0)
    try:
        if executor is None:
            await write_batches(source, writer, todo, size, progress)
            return None
        return await executor.write(cfg, store, source, writer, todo, progress, fresh=fresh)
    finally:
        if progress:
            progress.close()


def _manifest(
    cfg: Config,
    source: BatchSource,
    stats: EpochStats,
    writer: EpochWriter,
    spread: Spread | None,
    executor: Executor | None,
    started: float,
) -> dict[str, Any]:
    """The published epoch's manifest: the plan, the statistics, what was resumed, every snapshot read."""
    manifest = epoch_manifest(cfg, source, source.epoch_bytes(cfg.batches.size), time.monotonic() - started)
    manifest["stats"] = stats.result()
    manifest["resumed_batches"] = writer.resumed + (spread.kept if spread else 0)
    # More than one when batches were kept from an earlier dump (its journal, or its parts' records).
    earlier = [s for s in (spread.snapshots if spread else ()) if s not in writer.snapshots]
    manifest["snapshots"] = [*earlier, *writer.snapshots]
    if spread is not None and executor is not None:
        manifest.update(executor=executor.name, parts=spread.parts)
    return manifest
