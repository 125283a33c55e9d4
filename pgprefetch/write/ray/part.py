"""One part of a spread epoch: a Ray task that writes a range of batches under the driver's snapshot.

The task gets the plan and layout the driver made (without the keys), and the ordered keys of its own
batches as a separate argument: ``ray.put`` once by the driver (a part at a time, from disk when the keys
outgrew memory) and read zero-copy from the node's object store, not shipped with each retry. It imports
the snapshot on its own connections (``SET TRANSACTION SNAPSHOT``), then
runs the single-process dump's own scheduler and writer over its batches (:func:`~pgprefetch.write.query.served`,
:func:`~pgprefetch.write.schedule.write_batches`, :class:`~pgprefetch.write.files.writer.EpochWriter` as a part,
with a journal of its own), and returns each batch's checksums and statistics for the driver to publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray

from pgprefetch.config.model import Config
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.errors import StoreError
from pgprefetch.pg.session import BatchReader
from pgprefetch.store.base import ArraySpec, Store
from pgprefetch.store.open import open_store
from pgprefetch.store.records import PartRecord, put_record
from pgprefetch.store.uploads import Uploads
from pgprefetch.write.batches import BatchSource, SourcePart
from pgprefetch.write.files.stats import EpochStats
from pgprefetch.write.files.writer import EpochWriter
from pgprefetch.write.mix.parts import MixedPart
from pgprefetch.write.plan import EpochPlan, KeyWindow
from pgprefetch.write.query import served
from pgprefetch.write.ray.cluster import TASK_RETRIES
from pgprefetch.write.ray.secret import opened
from pgprefetch.write.scan.exchange import Piece, join_pieces
from pgprefetch.write.scan.whole import cut_source
from pgprefetch.write.schedule import write_batches
from pgprefetch.write.transform.cache import transforms_folder
from pgprefetch.write.transform.mixed import mixed_stages_over
from pgprefetch.write.transform.stage import stage_over


@dataclass(frozen=True)
class PartSpec:
    """What one part writes, and all it needs to, apart from the keys."""

    index: int
    of: int
    owned: range  # the part's batch range (the files it creates, on an object store)
    batches: tuple[int, ...]  # the batches in ``owned`` still to write (a resumed epoch has fewer)
    cfg: Config
    epoch: int
    location: str  # the store
    snapshot: str
    server_version: str
    plan: EpochPlan  # keys left out: they come from the object store
    layout: BatchLayout
    arrays: tuple[ArraySpec, ...]
    identity: dict[str, Any]
    metadata: dict[str, bytes]  # the epoch's zarr.json files, for an object store staged on another node
    defer: bool = False  # object store, --force: stage only; the driver has the files uploaded (.staged)
    run: str = ""  # the epoch's counts in the driver's tracker
    dsn: tuple[Any, ...] = ()  # ``cfg``'s DSN carries no password: the whole one is in the object store (.secret)
    host: str = ""  # the driver's machine: a part on it shares the store's transform cache, others their own

    def name(self) -> str:
        """The part, in messages."""
        return f"part {self.index + 1} of {self.of} (batches {self.owned.start}-{self.owned.stop - 1})"


@dataclass(frozen=True)
class PartResult:
    """What a part hands back: per batch written, its checksums and statistics; the files it uploaded."""

    index: int
    batches: np.ndarray
    checksums: np.ndarray  # (n_arrays, len(batches))
    figures: tuple[np.ndarray, dict[str, np.ndarray]]
    files: tuple[str, ...]
    node: str
    node_id: str = ""  # the Ray node that staged the files (--force on an object store uploads them there)
    transformed: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)  # per transform: computed, cached


@dataclass(frozen=True)
class ScanPart:
    """A scan mode part's rows: a piece from each read block (object refs), and where its samples start.

    The pieces go to :func:`run_part` as arguments of their own, so Ray starts the part only once they are
    ready: a part waiting for them would hold a CPU the tasks that cut them need.
    """

    pieces: tuple[Any, ...]  # ObjectRefs of :class:`~pgprefetch.write.scan.exchange.Piece`, one per block
    starts: np.ndarray  # per sample of the part's ``owned`` range, in epoch order: its first row's sorted place


@ray.remote(num_cpus=1, max_retries=TASK_RETRIES)
def run_part(
    spec: PartSpec,
    keys: np.ndarray,
    tracker: Any,
    sent: SourcePart | None = None,
    starts: np.ndarray | None = None,
    *pieces: Piece,
) -> PartResult:
    """The Ray task: write ``spec``'s batches (``keys``: those of its ``owned`` batches, from the object store).

    Query mode fetches them under the snapshot; scan mode cuts them from the rows routed to it: ``pieces``
    (resolved by Ray before the task starts) and each sample's first row, ``starts`` (see :class:`ScanPart`);
    a mixed or packed epoch serves them from what the driver ``sent`` (:class:`~pgprefetch.write.batches.SourcePart`).
    """
    with contextlib.suppress(ray.exceptions.RayError):  # progress is never worth failing a part for
        # Received before any work, so a kill from here on counts as a retry. (Sent and not awaited, a call
        # still queued for a tracker that was starting died with the part, and the retry went uncounted.)
        ray.get(tracker.started.remote(spec.run, spec.index))
    return asyncio.run(_write_part(spec, keys, tracker, None if starts is None else (starts, pieces), sent))


class _Progress:
    """The scheduler's progress calls, sent on to the driver's tracker (without waiting for it)."""

    def __init__(self, tracker: Any, run: str, part: int) -> None:
        self.tracker, self.run, self.part = tracker, run, part

    def advance(self, samples: int, nbytes: int) -> None:
        self.tracker.advance.remote(self.run, self.part, samples, nbytes)


async def _write_part(
    spec: PartSpec,
    keys: np.ndarray,
    tracker: Any,
    scan: tuple[np.ndarray, tuple[Piece, ...]] | None,
    sent: SourcePart | None,
) -> PartResult:
    store = open_store(spec.location)
    partial = store.partial_path(spec.epoch)
    node = ray.util.get_node_ip_address()
    if store.local_root is not None:
        if not (partial / "zarr.json").is_file():
            raise StoreError(
                f"{spec.name()}: node {node} cannot see the partial epoch {partial}: a local store must be on a "
                "filesystem every Ray node mounts (or use an s3:// store)"
            )
    else:
        with store.place(partial).open(create=True) as staged:  # no link followed (store.folders)
            for relative, data in spec.metadata.items():  # staged on this node: the driver's may be elsewhere
                if staged.kind(relative) != "file":
                    staged.write(relative, data)
    cfg, size = spec.cfg, spec.cfg.batches.size
    plan = dataclasses.replace(spec.plan, keys=KeyWindow(keys, spec.owned.start * size))
    stats = EpochStats.of(spec.layout, plan.n_batches, size, plan.used)
    async with _source(spec, plan, scan, sent) as source, _transformed(spec, store, source, sent) as source:
        bucket = store.object_store if not spec.defer else None  # (an object store's parts upload their files)
        # Up to the object store (unless --force stages), or back to the shared disk, as each file is finished.
        if store.local_root is not None:
            sending: Any = store.uploader(spec.epoch)
        else:
            sending = Uploads(bucket, spec.epoch) if bucket is not None else contextlib.nullcontext()
        with sending as uploads:
            writer = EpochWriter(
                store, spec.epoch, n_batches=plan.n_batches, batch_size=size, arrays=list(spec.arrays),
                compression=cfg.store.compression, identity=spec.identity, uploader=uploads, stats=stats,
                owned=spec.owned, part=spec.index,
            )  # fmt: skip
            with writer:
                progress = _Progress(tracker, spec.run, spec.index)
                await write_batches(source, writer, list(spec.batches), size, progress)
                files = writer.finish_part()
    done = np.array(spec.batches, dtype=np.int64)
    here = ray.get_runtime_context().get_node_id()
    counted = {
        name: {k: v for k, v in s.items() if k in ("computed", "cached")} for name, s in _summary(source).items()
    }
    result = PartResult(
        spec.index, done, writer.checksums[:, done], stats.taken(done), tuple(files), node, here, counted
    )
    if bucket is not None and spec.batches == tuple(spec.owned):  # all files up: a rerun after the driver died keeps it
        put_record(bucket, spec.epoch, record(spec, writer.header, result, partial))
    return result


def record(spec: PartSpec, header: dict[str, Any], result: PartResult, partial: Path) -> PartRecord:
    """The record of a finished part (:mod:`pgprefetch.store.records`); ``partial``: where its files are staged."""
    files = {f: (partial / f).stat().st_size for f in result.files}
    return PartRecord(spec.index, spec.owned, header, spec.snapshot, result.batches, result.checksums, result.figures,
                      files)  # fmt: skip


@contextlib.asynccontextmanager
async def _transformed(
    spec: PartSpec, store: Store, source: BatchSource, sent: SourcePart | None
) -> AsyncIterator[BatchSource]:
    """The part's source with its transforms' outputs, run on this node (the driver checked the inputs).

    A part on the driver's machine shares the store's cache with it; one on another node keeps its own, on
    that node's disk: SQLite is not to be shared over a network filesystem.
    """
    if not spec.cfg.transforms:
        yield source
        return
    cfg = opened(spec.cfg, spec.dsn)
    folder = transforms_folder(cfg, store, local=socket.gethostname() != spec.host)
    if isinstance(sent, MixedPart):
        async with mixed_stages_over(cfg, spec.snapshot, spec.epoch, folder, sent.key_columns) as stages:
            yield await stages.serve(source, first=False)
        return
    async with stage_over(cfg, spec.snapshot, source, spec.epoch, folder, first=False) as staged:
        yield staged


def _summary(source: BatchSource) -> dict[str, dict[str, Any]]:
    """What the source's transforms did (:attr:`~pgprefetch.write.transform.stage.Stage.summary`), if any."""
    return dict((source.records or {}).get("transforms", {}))


@contextlib.asynccontextmanager
async def _source(
    spec: PartSpec, plan: EpochPlan, scan: tuple[np.ndarray, tuple[Piece, ...]] | None, sent: SourcePart | None
) -> AsyncIterator[BatchSource]:
    """The part's batches: fetched on the snapshot (query mode), cut from its pieces (scan mode), or ``sent``."""
    if sent is not None:
        cfg = opened(spec.cfg, spec.dsn)
        async with sent.served(cfg, plan, spec.snapshot, spec.server_version) as source:
            yield source
        return
    if scan is None:
        cfg = opened(spec.cfg, spec.dsn)  # the password, in this process's memory only
        async with BatchReader.open(cfg.source, spec.snapshot, plan.sql, plan.params, row_wise=plan.row_wise) as reader:
            yield served(plan, spec.layout, reader, spec.snapshot, spec.server_version, cfg.batches.size)
        return
    table, rows = join_pieces(list(scan[1]))
    starts = np.searchsorted(rows, scan[0])  # each sample's first row in the part's table
    first = spec.owned.start * spec.cfg.batches.size
    yield cut_source(spec.cfg, plan, spec.layout, table, starts, spec.snapshot, spec.server_version, None, first)
