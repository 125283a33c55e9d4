"""The transform stage: a batch source whose units also carry their transforms' outputs, cached or computed.

It wraps the epoch's batch source (query mode or scan mode) and adds to each unit, on the event loop while
the unit's batches are fetched:

1. **Digests.** One statement on the epoch's snapshot returns, per sample, the SHA-256 of each transform's
   input values (:func:`~pgprefetch.pg.statement.inputs_statement`).
2. **Cache.** Each deterministic transform's outputs are looked up by ``(fingerprint, digest)``
   (:mod:`~pgprefetch.write.transform.cache`); a random transform has none.
3. **Inputs.** The samples with an output to compute (a miss, or any sample of a random transform) are sent
   again with their input values, decoded by asyncpg (text as ``str``, ``bytea`` as ``bytes``, arrays as
   NumPy arrays, NULL as None).
4. **Run.** The :class:`~pgprefetch.write.transform.runner.Runner` runs each transform over them, and new
   deterministic outputs go to the cache in one commit.

``produce`` then lets the wrapped source fill its column fields and puts each transform field's outputs
beside them, padded, with its lengths. Outputs are placed by the sample's position in the unit, never by
arrival; nothing of a unit reaches a batch before every transform of it has returned and been checked, so
a failure publishes nothing, and the batches already written are kept for the resume.

With ``on_error = "skip"`` the same steps run once over every sample before the epoch is planned
(:meth:`Stage.sweep`): the failing samples are recorded and left out of the plan, and the units find every
deterministic output in the cache. A mixed epoch has a stage per source (:mod:`.mixed`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np

from pgprefetch.config.model import Config, TransformConfig
from pgprefetch.errors import SampleError, TransformError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.session import BatchReader, Snapshot
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.memory.pool import Reservation
from pgprefetch.write.transform.cache import TransformCache, decode_entries, encode_entries
from pgprefetch.write.transform.inputs import check_inputs, input_columns, input_value, statement_of
from pgprefetch.write.transform.loading import fingerprint, output_fields
from pgprefetch.write.transform.outputs import Packed, fill_field
from pgprefetch.write.transform.runner import Inputs, Runner, Task

CONNECTIONS = 2  # the stage's own connections: a statement or two a unit, beside the batches'
UNIT_SECONDS = 1.0  # what a unit's fetch, transforms included, aims at: enough work to hand to the workers
SWEEP_SAMPLES = 1024  # samples a sweep's step takes at once
SWEEPS_IN_FLIGHT = 4  # its steps under way at once: the workers kept busy while the next inputs arrive
LEFT_OUT_SHOWN = 1000  # keys of the samples left out that the manifest lists (it counts them all)


@dataclass(frozen=True)
class _Transform:
    config: TransformConfig
    fingerprint: str
    fields: tuple[str, ...]
    dtypes: tuple[np.dtype, ...]
    digest: int  # its digest's place among the statement's digests


@dataclass(frozen=True)
class _Unit:
    """A unit's samples as its transforms see them: keys, digests, and the inputs of those sent with them."""

    keys: np.ndarray  # (width, n)
    wanted: np.ndarray  # the positions whose input values were sent (sorted)
    inputs: Inputs  # their values, in that order
    digests: list[list[bytes]]  # per transform, each sample's digest (empty: no cache to look in)


class Stage:
    """One epoch's transforms: the statement, the cache, the runner; :meth:`unit` computes a unit's outputs."""

    def __init__(
        self,
        cfg: Config,
        reader: BatchReader,
        cache: TransformCache | None,
        runner: Runner,
        keys: KeyColumns,
        inputs: tuple[str, ...],
        epoch: int,
        source: str | None = None,
    ) -> None:
        self.cfg, self._reader, self._cache, self._runner, self._keys, self._epoch = (
            cfg,
            reader,
            cache,
            runner,
            keys,
            epoch,
        )
        self._inputs = inputs
        self.source = source  # a mixed epoch's source this stage serves (None: the config's one source)
        self._transforms = [
            _Transform(
                t,
                fingerprint(cfg, t),
                tuple(f.name for f in output_fields(cfg, t.name)),
                tuple(np.dtype(f.dtype) for f in output_fields(cfg, t.name)),
                i,
            )
            for i, t in enumerate(cfg.transforms)
        ]
        self._first: tuple[np.ndarray, dict[str, Packed]] | None = None  # the first batch's, computed ahead
        self._swept = False  # every sample's deterministic outputs found or computed before the plan
        # What the manifest records of each transform, counted as the units go (this run's units: a resumed
        # epoch counts what it wrote).
        self.summary: dict[str, dict[str, Any]] = {
            t.config.name: {"fingerprint": t.fingerprint, "random": t.config.random, "computed": 0, "cached": 0}
            for t in self._transforms
        }

    @property
    def keys(self) -> KeyColumns:
        """How its samples' key slots read."""
        return self._keys

    @property
    def connections(self) -> int:
        """The connections its statement runs on (units whose inputs are read at once)."""
        return self._reader.size

    @property
    def skips(self) -> bool:
        """Whether a transform leaves out the samples it fails on: the epoch is swept before it is planned."""
        return any(t.config.on_error == "skip" for t in self._transforms)

    async def serve(self, source: BatchSource, *, first: bool = True) -> BatchSource:
        """``source`` whose units carry the transforms' outputs.

        ``first``: the first batch's outputs computed now: a function that fails on every sample, or returns
        what its fields cannot hold, stops the dump here, before any batch is written, not midway.
        """
        if first:
            await self.first_batch(source.plan.batch_keys(0, self.cfg.batches.size))
        return wrapped(self.cfg, source, lambda batch, keys, _: self.unit(batch, keys), self.summary)

    async def first_batch(self, keys: np.ndarray) -> None:
        """Compute the first batch's outputs now, before any batch is written; the unit that holds it takes them."""
        self._first = (keys, await self.unit(0, keys))

    async def unit(self, batch: int, keys: np.ndarray) -> dict[str, Packed]:
        """Every transform field's outputs for the unit's samples ``keys`` (``(width, n)``), in their order."""
        first, self._first = self._first, None
        if batch == 0 and first is not None and np.array_equal(keys[:, : first[0].shape[1]], first[0]):
            taken = first[0].shape[1]
            rest = await self.unit(1, keys[:, taken:]) if keys.shape[1] > taken else {}
            return {f: Packed.join([p, rest[f]]) if rest else p for f, p in first[1].items()}
        return (await self._computed(batch, keys))[0]

    async def sweep(self, chunks: AsyncIterator[np.ndarray]) -> np.ndarray:
        """Every sample's deterministic outputs computed or found, before the epoch is planned: the keys left out.

        ``chunks``: every sample key of the source (``(width, m)`` each). A sample an ``on_error = "skip"``
        transform fails on is recorded in the cache as failing (later epochs find it there, and run nothing on
        it) and returned, sorted, for the plan to leave out (``Config.left_out``); its outputs, and every other
        sample's, are in the cache for the epoch's units to find.
        """
        left: list[np.ndarray] = []
        running: set[asyncio.Task[np.ndarray]] = set()
        try:
            async for chunk in chunks:
                for start in range(0, chunk.shape[1], SWEEP_SAMPLES):
                    part = np.ascontiguousarray(chunk[:, start : start + SWEEP_SAMPLES])
                    running.add(asyncio.ensure_future(self._sweep_part(part)))
                    if len(running) >= SWEEPS_IN_FLIGHT:
                        done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                        left += _results(done)
            left += await asyncio.gather(*running)
            running = set()
        finally:
            for task in running:
                task.cancel()
        out = np.concatenate(left, axis=1) if left else np.zeros((self._keys.width, 0), np.int64)
        out = out[:, np.lexsort(out[::-1])] if out.size else out
        for t in self._transforms:
            if t.config.on_error == "skip":
                self.summary[t.config.name]["left_out"] = int(out.shape[1])
                shown = [self._keys.show(out[:, i]) for i in range(min(out.shape[1], LEFT_OUT_SHOWN))]
                self.summary[t.config.name]["left_out_keys"] = shown
        self._swept = True
        return out

    async def _sweep_part(self, keys: np.ndarray) -> np.ndarray:
        _, failed = await self._computed(-1, keys, sweeping=True)
        return keys[:, failed]

    async def _computed(
        self, batch: int, keys: np.ndarray, *, sweeping: bool = False
    ) -> tuple[dict[str, Packed], np.ndarray]:
        """The unit's outputs, and the positions of the samples a skipping transform failed on.

        ``sweeping``: only the deterministic transforms run, for the cache and the failures (no outputs).
        """
        n = keys.shape[1]
        transforms = [t for t in self._transforms if not (sweeping and t.config.random)]
        cached = [t for t in transforms if not t.config.random]
        found: dict[str, tuple[dict[bytes, bytes], dict[bytes, str]]] = {}
        digests: list[list[bytes]] = []
        if cached and self._cache is not None:
            rows = await self._rows(batch, keys, np.zeros(n, np.int64))
            digests = [cast("list[bytes]", list(column)) for column in rows[1 : 1 + len(self._transforms)]]
            cache = self._cache
            found = {
                t.config.name: await asyncio.to_thread(cache.lookup, t.fingerprint, digests[t.digest]) for t in cached
            }
        missing = {t.config.name: _missing(t, n, digests, found) for t in transforms}
        wanted = np.unique(np.concatenate([*missing.values(), np.zeros(0, np.int64)]))
        outputs: dict[str, Packed] = {}
        failed = np.zeros(0, np.int64)
        with memory.current().reserve("transform inputs") as held:  # a unit's, while its transforms run
            inputs = await self._inputs_of(batch, keys, wanted, held) if wanted.size else {}
            for t in transforms:
                lookup = found.get(t.config.name, ({}, {}))
                try:
                    unit = _Unit(keys, wanted, inputs, digests)
                    own, failing = await self._outputs(t, unit, missing[t.config.name], lookup, sweeping)
                except TransformError as e:
                    raise self._rerun_hint(t.config, e) from None
                outputs |= own
                failed = np.union1d(failed, failing)
        return outputs, failed

    def _rerun_hint(self, t: TransformConfig, e: TransformError) -> TransformError:
        """``e`` with the command that reruns ``t`` on the failed sample alone (a config from a file only)."""
        if self.cfg.file is None or e.sample is None:
            return e
        command = ["pgprefetch", "transform", "--config", str(self.cfg.file), "--transform", t.name, "--key", e.sample]
        command += ["--epoch", str(self._epoch)] if t.random else []
        command += ["--source", self.source] if self.source is not None else []
        command += ["--split", self.cfg.split] if self.cfg.split is not None else []
        return TransformError(f"{e}; rerun it alone: {shlex.join(command)}", e.traceback, e.sample, t.name)

    async def _outputs(
        self,
        t: _Transform,
        unit: _Unit,
        missing: np.ndarray,
        lookup: tuple[dict[bytes, bytes], dict[bytes, str]],
        sweeping: bool,
    ) -> tuple[dict[str, Packed], np.ndarray]:
        """``t``'s outputs for every sample, found ones decoded and missing ones computed; and where it fails.

        Where it fails: a skipping transform's failures, recorded in the cache now, or found there. Serving a
        unit, a sample that fails is an error (the plan left out every failing one: this one failed since, or
        is a check's); sweeping, the outputs are only cached, not returned.
        """
        keys, digests = unit.keys, unit.digests
        n = keys.shape[1]
        name = t.config.name
        found, failures = lookup
        known = [i for i in range(n) if digests[t.digest][i] in failures] if failures else []
        computed: dict[str, Packed] = {}
        failed: dict[int, str] = {i: failures[digests[t.digest][i]] for i in known}
        if missing.size:
            computed, newly = await self._compute(t, unit, missing)
            failed |= newly
        hits = np.setdiff1d(np.setdiff1d(np.arange(n), missing, assume_unique=True), known, assume_unique=True)
        if sweeping or not self._swept or t.config.random:  # a swept epoch's figures are its sweep's
            self.summary[name]["computed"] += int(missing.size)
            self.summary[name]["cached"] += int(hits.size + len(known))
        if failed and not sweeping:
            first = min(failed)
            shown = self._keys.show(keys[:, first])
            raise TransformError(
                f'{failed[first]} (on_error = "skip" leaves out the samples found failing before the epoch is '
                "planned; this one was not)",
                sample=shown,
                transform=name,
            )
        if sweeping:
            return {}, np.array(sorted(failed), np.int64)
        if not hits.size:
            return computed, np.zeros(0, np.int64)
        decoded = decode_entries(t.fields, t.dtypes, [found[digests[t.digest][i]] for i in hits.tolist()])
        if not missing.size:
            return decoded, np.zeros(0, np.int64)
        order = np.argsort(np.concatenate([hits, missing]), kind="stable")
        return {f: Packed.join([decoded[f], computed[f]]).take(order) for f in t.fields}, np.zeros(0, np.int64)

    async def _compute(
        self, t: _Transform, unit: _Unit, missing: np.ndarray
    ) -> tuple[dict[str, Packed], dict[int, str]]:
        """Run ``t`` on the samples at ``missing``: their outputs (the failed ones' left out) cached; the failed.

        A transform that stops on errors raises; a skipping one has its failures recorded in the cache.
        """
        name, digests = t.config.name, unit.digests
        at = np.searchsorted(unit.wanted, missing)
        own = {c: [unit.inputs[c][i] for i in at.tolist()] for c in t.config.inputs}
        slots = np.ascontiguousarray(unit.keys[:, missing])
        task = Task(name, own, slots, self._epoch, self.cfg.batches.seed, self._keys, self.source)
        failed: dict[int, str] = {}
        if t.config.on_error != "skip":
            computed = await self._runner.call(task)
        else:
            spared = await self._runner.call_sparing(task)
            computed, failed = spared.outputs, {int(missing[i]): e for i, e in spared.failed}
            if self._cache is not None and spared.failed:
                errors = [(digests[t.digest][int(missing[i])], e) for i, e in spared.failed]
                await asyncio.to_thread(self._cache.put_failures, name, t.fingerprint, errors)
        if not t.config.random and self._cache is not None:
            done = np.setdiff1d(missing, np.array(list(failed), np.int64), assume_unique=True)
            entries = encode_entries(t.fields, computed, np.arange(done.size))
            pairs = [(digests[t.digest][i], e) for i, e in zip(done.tolist(), entries, strict=True)]
            await asyncio.to_thread(self._cache.put, name, t.fingerprint, pairs)
        return computed, failed

    async def _inputs_of(self, batch: int, keys: np.ndarray, wanted: np.ndarray, held: Reservation) -> Inputs:
        """The input values of the samples at positions ``wanted`` (sorted), in that order (``held``: their bytes)."""
        rows = await self._rows(batch, keys[:, wanted], np.ones(wanted.size, np.int64))
        first = 1 + len(self._transforms)
        inputs = {c: [input_value(v) for v in rows[first + j]] for j, c in enumerate(self._inputs)}
        held.grow(sum(_size(v) for values in inputs.values() for v in values))
        return inputs

    async def _rows(self, batch: int, keys: np.ndarray, want: np.ndarray) -> list[Sequence[Any]]:
        """The statement's columns for ``keys``, one row per key in the keys' order; a key without one is named."""
        n = keys.shape[1]
        columns = cast("Sequence[Sequence[Any]]", await self._reader.fetch(batch, np.vstack([keys, want[None, :]])))
        ordinals = np.asarray(columns[0] if columns else (), np.int64)
        counts = np.bincount(ordinals - 1, minlength=n)[:n] if ordinals.size else np.zeros(n, np.int64)
        wrong = np.flatnonzero(counts != 1)
        if wrong.size or ordinals.size != n:
            i = int(wrong[0]) if wrong.size else 0
            got = "no row" if counts[i] == 0 else "more than one row"
            raise SampleError(
                f"sample ({self._keys.show(keys[:, i])}): the transforms' inputs ({', '.join(self._inputs)}) "
                f"came as {got}; a transform takes one row per sample"
            )
        order = np.argsort(ordinals)
        return [[column[i] for i in order.tolist()] for column in columns]


def _results(done: set[asyncio.Task[np.ndarray]]) -> list[np.ndarray]:
    """The finished tasks' results; the first one's error after every error is retrieved (none logged as lost)."""
    errors = [e for e in (d.exception() for d in done) if e is not None]
    if errors:
        raise errors[0]
    return [d.result() for d in done]


def _missing(
    t: _Transform, n: int, digests: list[list[bytes]], found: dict[str, tuple[dict[bytes, bytes], dict[bytes, str]]]
) -> np.ndarray:
    """The positions of the samples ``t`` must compute: every one (random), or those the cache has nothing of."""
    if t.config.random or not digests:
        return np.arange(n, dtype=np.int64)
    outputs, failures = found[t.config.name]
    own = digests[t.digest]
    return np.array([i for i in range(n) if own[i] not in outputs and own[i] not in failures], np.int64)


def _size(v: Any) -> int:
    """About what an input value holds: its bytes (text, bytea, an array), or a word."""
    if isinstance(v, str | bytes):
        return len(v)
    return int(v.nbytes) if isinstance(v, np.ndarray) else 8


@asynccontextmanager
async def transformed(
    cfg: Config, snap: Snapshot, source: BatchSource, epoch: int, cache_folder: Path | None, *, first: bool = True
) -> AsyncIterator[BatchSource]:
    """``source`` with its transforms' outputs: the stage's statement, cache and workers open while it serves.

    ``cache_folder``: where the deterministic transforms' cache lives (None: no cache, every output computed).
    ``first``: the first batch computed before it serves (:meth:`Stage.serve`; a check's batches are its own).
    """
    await check_inputs(cfg, snap)
    async with stage_over(cfg, snap.id, source, epoch, cache_folder, first=first) as staged:
        yield staged


@asynccontextmanager
async def stage_over(
    cfg: Config, snapshot: str, source: BatchSource, epoch: int, cache_folder: Path | None, *, first: bool = True
) -> AsyncIterator[BatchSource]:
    """:func:`transformed` on the exported ``snapshot``, its inputs checked already (a Ray part's way).

    ``first``: compute the first batch's outputs before yielding (the dump's driver does; its parts do not).
    """
    async with stage_for(cfg, snapshot, source.plan.key_columns, epoch, cache_folder) as stage:
        yield await stage.serve(source, first=first)


@asynccontextmanager
async def stage_for(
    cfg: Config, snapshot: str, keys: KeyColumns, epoch: int, cache_folder: Path | None
) -> AsyncIterator[Stage]:
    """The epoch's :class:`Stage` on the exported ``snapshot``: its statement's connections, cache and workers."""
    async with (
        transform_tools(cfg, cache_folder) as (runner, cache),
        source_stage(cfg, snapshot, keys, epoch, runner, cache) as stage,
    ):
        yield stage


@asynccontextmanager
async def transform_tools(
    cfg: Config, cache_folder: Path | None
) -> AsyncIterator[tuple[Runner, TransformCache | None]]:
    """The workers and the cache the epoch's stages share (a mixed epoch has a stage per source)."""
    runner = Runner(cfg)
    with _open_cache(cfg, cache_folder) as cache:
        try:
            runner.start()
            yield runner, cache
        finally:
            runner.close()


@asynccontextmanager
async def source_stage(
    cfg: Config,
    snapshot: str,
    keys: KeyColumns,
    epoch: int,
    runner: Runner,
    cache: TransformCache | None,
    source: str | None = None,
) -> AsyncIterator[Stage]:
    """The stage of one source (``cfg``: its config) over shared workers and cache: its statement's connections."""
    inputs = input_columns(cfg)
    sql = statement_of(cfg, keys, inputs)
    stage_source = dataclasses.replace(cfg.source, connections=min(CONNECTIONS, cfg.source.connections))
    async with BatchReader.open(stage_source, snapshot, sql, row_wise=True) as reader:
        yield Stage(cfg, reader, cache, runner, keys, inputs, epoch, source)


def _open_cache(cfg: Config, folder: Path | None) -> AbstractContextManager[TransformCache | None]:
    if folder is None or all(t.random for t in cfg.transforms):
        return nullcontext(None)
    return TransformCache.open(folder)


UnitOutputs = Callable[[int, np.ndarray, np.ndarray | None], Awaitable[dict[str, Packed]]]
"""A unit's outputs from its first batch, its keys and (a mixed epoch) each sample's source code."""


def wrapped(cfg: Config, source: BatchSource, outputs_of: UnitOutputs, summary: dict[str, Any]) -> BatchSource:
    """``source`` whose ``fetch`` also computes the unit's outputs, and whose ``produce`` also places them.

    ``summary``: what the manifest records of the transforms (``transforms``), filled as the units go.
    """
    size = cfg.batches.size
    fields = {f.name: f for f in cfg.fields if f.transform is not None}

    async def fetch(batch: int, count: int) -> object:
        keys = source.plan.batch_keys(batch, size, count)
        codes = source.sources_at(batch * size, keys.shape[1])
        inner, outputs = await asyncio.gather(source.fetch(batch, count), outputs_of(batch, keys, codes))
        held = memory.current().reserve("transform outputs")  # a unit's, from its fetch until it is produced
        held.grow(sum(p.values.nbytes + p.lengths.nbytes for p in outputs.values()))
        return inner, outputs, held

    def produce(batch: int, count: int, fetched: object, buffers: dict[str, np.ndarray]) -> None:
        inner, outputs, held = cast("tuple[object, dict[str, Packed], Reservation]", fetched)
        with held:
            source.produce(batch, count, inner, buffers)
            for name, packed in outputs.items():
                f = fields[name]
                fill_field(f, packed, buffers[name], buffers[f.length_array] if f.length_array else None)

    # (the summary's counts grow as units are written: the manifest, written last, has the final ones)
    records = (source.records or {}) | {"transforms": summary}
    return dataclasses.replace(source, fetch=fetch, produce=produce, records=records, unit_seconds=UNIT_SECONDS)
