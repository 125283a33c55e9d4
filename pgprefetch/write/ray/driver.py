"""The driver of a spread epoch: splits the pending batches into parts, runs them as Ray tasks, merges.

The pipeline (:mod:`pgprefetch.write.pipeline`) has already done what only one process may do: taken the
epoch's lock, exported the snapshot it holds open until the epoch is published, read and ordered the keys,
fixed the layout, opened the epoch's writer (which created the partial epoch's arrays and, on a shared
filesystem, its shard files, and verified what an interrupted dump's journals hold). :class:`RayExecutor`
then:

- splits the epoch into parts, contiguous batch ranges. On a filesystem every node mounts, any boundary
  will do: each batch is ``pwrite``-n at its own offset of a shard file the driver created. On an object
  store each part uploads whole files, so a boundary falls where every array's shard files do;
- ``ray.put``-s the ordered keys once: every part reads them from its node's object store;
- in scan mode, routes each part the rows its samples span from the blocks the readers keep
  (:mod:`pgprefetch.write.ray.scan`; :meth:`RayExecutor.read_scan` read them, before the writer was opened);
- in a mixed or packed epoch, sends each part what its source cuts for it (:mod:`pgprefetch.write.mix.parts`,
  :mod:`pgprefetch.write.pack.parts`);
- runs a task per part (:func:`~pgprefetch.write.ray.part.run_part`), retried by Ray when its worker or node
  is lost (at most ``TASK_RETRIES`` times); the first part that fails for another reason (bad data, a lost
  database connection) stops the others, and its error is the epoch's: the same one line as the single
  process, or an ``ExecutorError`` that names the part;
- shows one progress for the epoch, and merges each part's checksums and statistics in batch order, so
  the published epoch is byte for byte the single process's.

On an object store a rerun keeps the parts an interrupted dump finished, from the records they left in the
store (:mod:`pgprefetch.store.records`); ``--force`` over a published epoch has the parts stage their files and uploads
them from their nodes once the old epoch is removed, as the single process's publication does (:mod:`.staged`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import socket
import uuid
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import numpy as np
import ray

from pgprefetch.config.model import Config
from pgprefetch.errors import ConfigError
from pgprefetch.pg.session import Snapshot
from pgprefetch.store.base import ArraySpec, Store
from pgprefetch.store.objects import ObjectStore
from pgprefetch.store.records import PartRecord, usable
from pgprefetch.write.batches import BatchSource, Progress, SourcePart
from pgprefetch.write.executor import Spread
from pgprefetch.write.files.writer import EpochWriter
from pgprefetch.write.plan import EpochPlan, Vocabulary
from pgprefetch.write.ray.cluster import cluster_cpus, failure, join, line, lost_tracker, tracker
from pgprefetch.write.ray.part import PartResult, PartSpec, ScanPart, run_part
from pgprefetch.write.ray.scan import SpreadRead, exchange, min_parts, read_spread, spread_source
from pgprefetch.write.ray.secret import sealed
from pgprefetch.write.ray.staged import upload_staged

log = logging.getLogger("pgprefetch")
POLL_SECONDS = 0.5  # how often the driver asks the tracker for progress


class RayExecutor:
    """Writes an epoch's batches on a Ray cluster (see the module's docstring)."""

    name = "ray"

    def __init__(self, parts: int | None = None, address: str | None = None, env: dict[str, str] | None = None):
        if parts is not None and parts < 1:
            raise ConfigError(f"--parts must be 1 or more, got {parts}")
        self.parts = parts
        self.address = address
        self.env = env
        self._started = False
        self._id = uuid.uuid4().hex[:12]  # this dump's runs in the tracker: f"{id}/{epoch}"

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the cluster if this executor started it (a local one); a joined cluster stays."""
        if self._started:
            ray.shutdown()
            self._started = False

    def check(self, cfg: Config) -> None:
        """Every config's epoch is cut into parts, but two.

        Query mode by batch ranges, scan mode through the exchange (:mod:`pgprefetch.write.ray.scan`), a mixed
        or packed epoch by what its source sends each part (:attr:`~pgprefetch.write.batches.BatchSource.cut`).
        Refused: packing a transform's output, and windows stored as starts, whose rows are one table in the
        process that read it (a few bytes a window: there is little left to spread).
        """
        if cfg.store.windows == "starts":
            raise ConfigError(
                '--executor ray does not dump [store] windows = "starts": its epoch is the rows once and 8 bytes '
                "a window; dump it here"
            )
        if cfg.packing is not None and cfg.field(cfg.packing.field).transform is not None:
            raise ConfigError(
                "--executor ray does not dump epochs packed from a transform's output yet: dump them here "
                "(a column of tokens packs on Ray)"
            )

    async def read_scan(
        self, cfg: Config, snap: Snapshot, progress: Progress | None, vocabulary: Vocabulary | None
    ) -> SpreadRead:
        """Read a scan config's table with reader tasks on the cluster, keeping its blocks there."""
        if not ray.is_initialized():
            self._started = join(self.address) or self._started
        tracker()  # started while the table is read
        return await read_spread(cfg, snap, self.parts or cluster_cpus(), progress, vocabulary)

    def scan_source(self, cfg: Config, read: object, epoch: int) -> BatchSource:
        """Epoch ``epoch`` cut from a spread read: the plan here, the batches in the parts."""
        assert isinstance(read, SpreadRead)
        return spread_source(cfg, read, epoch)

    def driver_owns(self, store: Store) -> range | None:
        """All shard files on a shared filesystem; none on an object store (each part creates its own)."""
        return None if store.local_root is not None else range(0)  # object store: parts create their files

    def starts_over(self, store: Store) -> bool:
        """On an object store: its parts staged on other nodes cannot be verified by the driver.

        A rerun resumes there from the records finished parts left in the store instead
        (:mod:`pgprefetch.store.records`).
        """
        return store.local_root is None  # parts stage on their own nodes: the driver cannot verify them

    async def write(
        self,
        cfg: Config,
        store: Store,
        source: BatchSource,
        writer: EpochWriter,
        todo: list[int],
        progress: Progress | None,
        fresh: bool = False,
    ) -> Spread:
        """Write ``todo`` in parts on the cluster, then merge their checksums and statistics into ``writer``."""
        if not ray.is_initialized():
            self._started = join(self.address) or self._started
        plan = source.plan
        remote = store.object_store
        force = remote is not None and remote.is_complete(plan.epoch)  # staged, then uploaded (.staged)
        ranges = self._ranges(cfg, store, source, writer)
        kept, restarted = _kept(remote, writer, ranges, progress, fresh) if remote and not force else ([], None)
        pending = set(todo) - {b for r in kept for b in r.owned}
        specs = self._specs(cfg, store, source, writer, ranges, pending, force)
        results, attempts = await self._run(cfg, source, writer, specs, progress, remote if force else None)
        finished: list[PartResult | PartRecord] = [*results, *kept]
        _merge(writer, finished)
        _count_transformed(source, results)
        files = tuple(f for r in finished for f in r.files)
        retries = tuple(max(0, a - 1) for a in attempts)
        earlier = tuple(dict.fromkeys(r.snapshot for r in kept))
        return Spread(len(specs), retries, files, sum(len(r.owned) for r in kept), restarted, earlier)

    def _ranges(self, cfg: Config, store: Store, source: BatchSource, writer: EpochWriter) -> list[range]:
        """The parts' batch ranges: ``parts`` (or the cluster's CPUs, or more where a part's rows need it)."""
        plan = source.plan
        step = 1 if store.local_root is not None else _file_step(writer)
        wanted = self.parts or cluster_cpus()
        if isinstance(source.spread, SpreadRead):  # a part's rows must fit [source] memory
            wanted = max(wanted, min_parts(cfg, source.spread, plan))
        ranges = split(plan.n_batches, wanted, step)
        if self.parts and len(ranges) < self.parts:
            log.info("epoch %d: %d parts (shard files are not shared between parts on an object store)",
                     plan.epoch, len(ranges))  # fmt: skip
        return ranges

    def _specs(
        self,
        cfg: Config,
        store: Store,
        source: BatchSource,
        writer: EpochWriter,
        ranges: list[range],
        pending: set[int],
        force: bool,
    ) -> list[PartSpec]:
        """What each part is sent: its batches still to write, the plan without its keys, the arrays, the config."""
        plan = source.plan
        bare = dataclasses.replace(plan, keys=np.empty((plan.keys.shape[0], 0), dtype=np.int64))
        metadata = {}
        if store.local_root is None:
            metadata = {p.relative_to(writer.path).as_posix(): p.read_bytes() for p in writer.path.rglob("zarr.json")}
        arrays = tuple(
            ArraySpec(name, np.dtype(spec[0]), tuple(spec[1]), *spec[2:])
            for name, spec in writer.header["arrays"].items()
        )
        layout_keys = ("n_batches", "batch_size", "compression", "arrays")
        identity = {k: v for k, v in writer.header.items() if k not in layout_keys}
        run = f"{self._id}/{plan.epoch}"  # the epoch's counts in the tracker
        sent, dsn = sealed(cfg)  # the parts' config names the server without the password
        return [
            PartSpec(
                i, len(ranges), owned, tuple(b for b in owned if b in pending), sent, plan.epoch, store.location,
                source.snapshot, source.server_version, bare, source.layout, arrays, identity, metadata, force, run,
                dsn, socket.gethostname(),
            )
            for i, owned in enumerate(ranges)
        ]  # fmt: skip

    async def _run(
        self,
        cfg: Config,
        source: BatchSource,
        writer: EpochWriter,
        specs: list[PartSpec],
        progress: Progress | None,
        staged: ObjectStore | None,
    ) -> tuple[list[PartResult], list[int]]:
        """Run the parts with batches to write; their results and each part's attempts.

        ``staged`` (``--force`` on an object store): the parts staged their files, uploaded once every part is
        done and the published epoch removed; a part whose staging was lost meanwhile is written again.
        """
        plan = source.plan
        run = f"{self._id}/{plan.epoch}"  # the epoch's counts in the tracker
        track = tracker()
        options: dict[str, Any] = {"runtime_env": {"env_vars": self.env}} if self.env else {}
        scans: list[ScanPart | None] = [None] * len(specs)
        if isinstance(source.spread, SpreadRead) and any(spec.batches for spec in specs):  # (else: all kept)
            scans = exchange(cfg, source.spread, plan, [(spec.owned, spec.batches) for spec in specs])

        def start(spec: PartSpec) -> Any:
            with _part_of(source, spec) as part:  # (held here only until it is in the object store)
                sent = None if part is None else ray.put(part)
            return run_part.options(**options).remote(
                spec, _part_keys(plan, spec), track, sent, *_scan_args(scans[spec.index])
            )

        refs = {start(spec): spec for spec in specs if spec.batches}
        try:
            results = await self._wait(refs, track, progress, run, len(specs))
            if staged is not None:  # the published epoch removed only now; parts whose staging was lost
                again = upload_staged(staged, specs, results, writer.header, options)  # are written again
                redo = {start(spec): spec for spec in again}
                refs.update(redo)
                results = [r for r in results if r.index not in {spec.index for spec in again}]
                results += await self._wait(redo, track, None, run, len(specs))
            attempts = (await self._totals(track, run, len(specs)))[2] or [1] * len(specs)
        finally:
            for ref in refs:
                ray.cancel(ref, force=True)
            track.forget.remote(run)
        return results, attempts

    async def _wait(
        self, refs: dict[Any, PartSpec], track: Any, progress: Progress | None, run: str, parts: int
    ) -> list[PartResult]:
        """Each part's result, progress shown meanwhile; the first failure stops the wait (see the module)."""
        futures = {asyncio.wrap_future(ref.future()): spec for ref, spec in refs.items()}
        waiting = set(futures)
        results: list[PartResult] = []
        shown = shown_bytes = 0
        try:
            if progress:
                progress.parts(0, len(futures))
            while waiting:
                done, waiting = await asyncio.wait(waiting, timeout=POLL_SECONDS, return_when=asyncio.FIRST_COMPLETED)
                for future in done:
                    spec = futures[future]
                    results.append(_result(future, spec))
                    log.info("epoch %d: %s done (%d of %d)", spec.epoch, spec.name(), len(results), len(futures))
                if progress:
                    samples, nbytes, _ = await self._totals(track, run, parts)
                    if samples > shown:
                        # Some bytes always: samples counted with none are taken for batches an earlier run kept.
                        progress.advance(samples - shown, max(nbytes - shown_bytes, 1))
                        shown, shown_bytes = samples, nbytes
                    if done:
                        progress.parts(len(results), len(futures))
        finally:
            for future in waiting:  # the parts still running when one failed: their outcome is not wanted
                future.cancel()
        return results

    async def _totals(self, track: Any, run: str, parts: int) -> tuple[int, int, list[int]]:
        """The tracker's figures for ``run``; none if it was lost with its node (the next epoch gets a new one)."""
        try:
            totals: tuple[int, int, list[int]] = await asyncio.wrap_future(track.totals.remote(run, parts).future())
            return totals
        except ray.exceptions.RayError as e:
            log.warning("the progress tracker was lost (%s); the epoch goes on without its figures", line(e))
            lost_tracker()
            return 0, 0, []


def _kept(
    store: ObjectStore, writer: EpochWriter, ranges: list[range], progress: Progress | None, fresh: bool
) -> tuple[list[PartRecord], str | None]:
    """The parts an interrupted dump finished and recorded in the object store, kept; why others were not.

    ``fresh`` (``--force``): none kept, and their records deleted: a rerun must not keep them either.
    """
    epoch, size, n_samples = writer.epoch, writer.header["batch_size"], writer.header.get("n_keys", 0)
    kept, restarted = usable(store, epoch, writer.header, [] if fresh else ranges)
    restarted = None if fresh else restarted
    if restarted:
        log.warning("epoch %d: an interrupted dump was started over: %s", epoch, restarted)
    if kept:
        batches = sum(len(r.owned) for r in kept)
        log.info("epoch %d: resuming: %d of %d batches kept from the parts an interrupted dump recorded", epoch,
                 batches, len(writer.done))  # fmt: skip
        if progress:
            samples = sum(min(n_samples, r.owned.stop * size) - r.owned.start * size for r in kept)
            progress.advance(max(0, samples), 0)
    return kept, restarted


def _result(future: asyncio.Future[PartResult], spec: PartSpec) -> PartResult:
    """A part's result, or its failure as the epoch's one-line error."""
    try:
        return future.result()
    except ray.exceptions.RayError as e:
        raise failure(e, spec.name()) from None


def _scan_args(scan: ScanPart | None) -> tuple[Any, ...]:
    """A scan part's last arguments: its samples' starts, then each of its pieces (none in query mode)."""
    return () if scan is None else (scan.starts, *scan.pieces)


@contextlib.contextmanager
def _part_of(source: BatchSource, spec: PartSpec) -> Iterator[SourcePart | None]:
    """What a part of a mixed or packed epoch is sent (:attr:`BatchSource.cut`); None where its plan does."""
    if source.cut is None:
        yield None
        return
    with source.cut(spec.owned) as part:
        yield part


def _part_keys(plan: EpochPlan, spec: PartSpec) -> Any:
    """The keys of a part's batches, put in the object store once (and read from disk a part at a time)."""
    size = spec.cfg.batches.size
    first, last = spec.owned.start * size, min(spec.owned.stop * size, plan.used)
    keys = plan.keys[:, first:last] if isinstance(plan.keys, np.ndarray) else plan.keys.columns(first, last)
    return ray.put(np.ascontiguousarray(keys))


def split(n_batches: int, parts: int, step: int = 1) -> list[range]:
    """``n_batches`` in at most ``parts`` contiguous ranges of about equal size, bounded at multiples of ``step``."""
    blocks = -(-n_batches // step)
    parts = max(1, min(parts, blocks))
    bounds = [min(n_batches, (blocks * i // parts) * step) for i in range(parts + 1)]
    return [range(a, b) for a, b in pairwise(bounds)]


def _file_step(writer: EpochWriter) -> int:
    """The least number of batches that ends a shard file of every array (file boundaries they all share)."""
    return math.lcm(*(layout.per_file for layout in writer.layouts.values()), 1)


__all__ = ["RayExecutor", "split"]


def _count_transformed(source: BatchSource, results: list[PartResult]) -> None:
    """The epoch's figures (the manifest's) are what the parts' transforms computed and found cached.

    The driver's own trial of the first batch (:func:`~pgprefetch.write.transform.stage.stage_over`) wrote
    nothing: the part holding that batch computed or found it again, and counts it.
    """
    summary = (source.records or {}).get("transforms", {})
    for counts in summary.values():
        counts["computed"] = counts["cached"] = 0
    for r in results:
        for name, counts in r.transformed.items():
            for what, n in counts.items():
                summary[name][what] += n


def _merge(writer: EpochWriter, finished: list[PartResult | PartRecord]) -> None:
    """Every finished part's checksums and statistics into the driver's writer, in part order."""
    for result in sorted(finished, key=lambda r: r.index):
        writer.checksums[:, result.batches] = result.checksums
        writer.done[result.batches] = True
        if writer.stats is not None:
            writer.stats.put(result.batches, result.figures)
