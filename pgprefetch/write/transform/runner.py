"""Where transforms run: in the dump's own process, or in worker processes that never fork after threads.

A :class:`Loaded` transform is its function, its set-up's state and the fields it fills, ready to :meth:`call`
on one run of samples: it builds the :class:`Context`, calls the function, and checks and packs the outputs
(:mod:`pgprefetch.write.transform.outputs`), so a worker returns arrays, not Python lists, and an error
is found where it happened. A call that raises is retried a sample at a time to name the sample that fails.

:class:`Runner` spreads a unit's samples over ``workers`` processes in equal runs and joins the results by
position, never by completion order, so an epoch's bytes do not depend on who finished first. The workers
start with ``forkserver`` (``spawn`` where there is none): a process forked after the dump's threads or a
tokenizer's Rust thread pool exist can deadlock, and Hugging Face ``tokenizers`` disables itself when it
sees a fork. Each worker runs one thread of a tokenizer's pool (``RAYON_NUM_THREADS=1``): the workers are
the parallelism, and two pools on two cores only take turns.

A random transform's ``ctx.rng(i)`` is a Philox generator keyed by (the batches' seed, the epoch, the
transform's name, the sample's key slots): the draws are the same whichever worker, unit or retry runs
the sample, and another epoch draws anew.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import multiprocessing
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import numpy as np

from pgprefetch.config.model import Config, FieldConfig, TransformConfig, callable_name
from pgprefetch.errors import ConfigError, PgprefetchError, TransformError
from pgprefetch.keys import KeyColumns, KeyValue
from pgprefetch.write.transform.loading import output_fields, resolve
from pgprefetch.write.transform.outputs import Packed, pack_outputs

Inputs = dict[str, list[Any]]  # each input column's values, one per sample
EVERY_SAMPLE_FAILS = 8  # a run of at least this many samples, all failing, is a broken function, not bad data
T = TypeVar("T")


@dataclass
class Context:
    """What a transform is handed beside its inputs (``ctx``)."""

    keys: list[tuple[KeyValue, ...]]  # each sample's key, as the database has it
    epoch: int
    state: Any  # what the set-up returned (None without one)
    options: dict[str, Any]
    outputs: tuple[str, ...]  # the fields it fills: the outputs it returns
    _seeds: np.ndarray = field(repr=False, default_factory=lambda: np.zeros((0, 2), np.uint64))

    def rng(self, i: int) -> np.random.Generator:
        """A generator for sample ``i`` drawn from its key, the epoch, the seed and the transform's name."""
        if not self._seeds.size:
            raise TransformError("ctx.rng() is for a random transform: set random = true in its [transforms] table")
        return np.random.Generator(np.random.Philox(key=[int(k) for k in self._seeds[i]]))


def rng_seeds(seed: int, epoch: int, name: str, slots: np.ndarray, source: str | None = None) -> np.ndarray:
    """Each sample's 128-bit Philox key (``(n, 2)`` uint64) from its key slots (``(width, n)`` int64).

    ``source``: a mixed epoch's source of the samples, so that equal keys of two tables draw apart.
    """
    prefix = f"pgprefetch.rng\0{seed}\0{epoch}\0{name}\0".encode()
    if source is not None:
        prefix += f"source\0{source}\0".encode()
    rows = np.ascontiguousarray(slots.T.astype("<i8"))
    out = np.empty((rows.shape[0], 2), np.uint64)
    for i, row in enumerate(rows):
        out[i] = np.frombuffer(hashlib.blake2b(prefix + row.tobytes(), digest_size=16).digest(), "<u8")
    return out


@dataclass(frozen=True)
class Spared:
    """A run's outputs less the samples it failed on: ``failed`` holds each one's position in the run and error."""

    outputs: dict[str, Packed]  # the other samples', in their order
    failed: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class Task:
    """One run of samples for one transform: its inputs, the samples' key slots, the epoch."""

    name: str
    inputs: Inputs
    slots: np.ndarray  # (width, n) int64
    epoch: int
    seed: int
    keys: KeyColumns  # how the slots read: ctx.keys, and the key an error names
    source: str | None = None  # a mixed epoch's source of the samples (None: the config's one source)

    def seeds(self) -> np.ndarray:
        """Each sample's generator key (:func:`rng_seeds`)."""
        return rng_seeds(self.seed, self.epoch, self.name, self.slots, self.source)


class Loaded:
    """A transform ready to call: its function, its set-up's state, the fields it fills, how keys read."""

    def __init__(self, t: TransformConfig, fields: tuple[FieldConfig, ...], where: str) -> None:
        self.config, self.fields = t, fields
        self.function = resolve(t.function, t.folder, where)
        setup = resolve(t.setup, t.folder, where) if t.setup is not None else None
        try:
            self.state = setup(t.option_values) if setup is not None else None
        except Exception as e:
            raise TransformError(f"transform {t.name}: its setup raised {_shown(e)}", _traceback(e)) from None

    def call(self, task: Task) -> dict[str, Packed]:
        """Run the function on ``task``'s samples and pack its outputs; an error names the sample."""
        n = task.slots.shape[1]
        seeds = task.seeds() if self.config.random else None
        try:
            result = self.function(task.inputs, self._context(task, range(n), seeds))
        except Exception as e:
            raise self._failed(task, e) from None
        return pack_outputs(task.name, self.fields, result, n, lambda i: task.keys.show(task.slots[:, i]))

    def call_sparing(self, task: Task) -> Spared:
        """:meth:`call`, but a sample it fails on (raising, or returning what its fields cannot hold) is left out.

        The run is called whole first; only when that fails is each sample called alone, to tell the ones that
        fail from the rest (``on_error = "skip"``).
        """
        try:
            return Spared(self.call(task), ())
        except TransformError as e:
            if e.sample is None:  # the whole return value is wrong (not a dict, an output missing): no sample's fault
                raise
        kept: list[dict[str, Packed]] = []
        failed: list[tuple[int, str]] = []
        n = task.slots.shape[1]
        for i in range(n):
            try:
                kept.append(self.call(_part(task, np.array([i]))))
            except TransformError as e:
                if e.sample is None:
                    raise
                failed.append((i, str(e)))
        if n >= EVERY_SAMPLE_FAILS and len(failed) == n:  # a broken function, not bad samples: stop, do not skip all
            raise TransformError(
                f"transform {task.name} failed on every one of the {n} samples it was given, e.g. {failed[0][1]}; "
                'on_error = "skip" leaves out samples a transform fails on, not a transform that fails',
                transform=task.name,
            )
        fields = [f.name for f in self.fields]
        empty = {f.name: Packed(np.zeros(0, np.dtype(f.dtype)), np.zeros(0, np.int64)) for f in self.fields}
        return Spared({f: Packed.join([k[f] for k in kept]) for f in fields} if kept else empty, tuple(failed))

    def _context(self, task: Task, samples: Sequence[int], seeds: np.ndarray | None) -> Context:
        keys = [task.keys.values(task.slots[:, i]) for i in samples]
        own = seeds[list(samples)] if seeds is not None else np.zeros((0, 2), np.uint64)
        outputs = tuple(f.name for f in self.fields)
        return Context(keys, task.epoch, self.state, self.config.option_values, outputs, own)

    def _failed(self, task: Task, error: Exception) -> TransformError:
        """The error of a call: the first sample that raises alone names it (else the run's first sample)."""
        n = task.slots.shape[1]
        seeds = task.seeds() if self.config.random else None
        for i in range(n) if n > 1 else ():
            alone = {c: v[i : i + 1] for c, v in task.inputs.items()}
            try:
                self.function(alone, self._context(task, [i], seeds))
            except Exception as e:
                return self._error(task, i, e)
        if n == 1:
            return self._error(task, 0, error)
        named = f"samples ({task.keys.show(task.slots[:, 0])}) and the {n - 1} after it (none fails alone)"
        return TransformError(f"{named}: transform {task.name} raised {_shown(error)}", _traceback(error))

    def _error(self, task: Task, i: int, e: Exception) -> TransformError:
        shown = task.keys.show(task.slots[:, i])
        of = f" of source {task.source}" if task.source is not None else ""
        message = f"sample ({shown}){of}: transform {task.name} raised {_shown(e)}"
        return TransformError(message, _traceback(e), shown, task.name)


def _traceback(e: BaseException) -> str:
    return "".join(traceback.format_exception(e))


def _shown(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


# A worker process's transforms, loaded once by its initializer (or why one could not be).
_LOADED: dict[str, Loaded | PgprefetchError] = {}


def _start(transforms: list[tuple[TransformConfig, tuple[FieldConfig, ...], str]]) -> None:
    os.environ["RAYON_NUM_THREADS"] = "1"  # read by a tokenizer's thread pool at its first use
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the dump's to handle: it stops the pool
    for t, fields, where in transforms:
        try:
            _LOADED[t.name] = Loaded(t, fields, where)
        except PgprefetchError as e:  # raised by its first task: an initializer that raises breaks the pool
            _LOADED[t.name] = e
        except Exception as e:  # the user's module failed at import (a SyntaxError, a NameError at top level)
            _LOADED[t.name] = TransformError(f"{where}: cannot be loaded: {_shown(e)}", _traceback(e), None, t.name)


def _run(task: Task) -> dict[str, Packed]:
    return _loaded(task.name).call(task)


def _run_sparing(task: Task) -> Spared:
    return _loaded(task.name).call_sparing(task)


def _loaded(name: str) -> Loaded:
    loaded = _LOADED[name]
    if isinstance(loaded, PgprefetchError):
        raise loaded
    return loaded


class Runner:
    """Calls transforms on runs of samples: in this process (``workers = 0``) or over worker processes."""

    def __init__(self, cfg: Config) -> None:
        where = f"{cfg.file}: " if cfg.file else ""
        self._specs = [(t, output_fields(cfg, t.name), f"{where}[transforms.{t.name}]") for t in cfg.transforms]
        self._local: dict[str, Loaded] = {}
        self._one_at_a_time = threading.Lock()  # in-process calls: a function need not be thread-safe
        self._pools: dict[str, ProcessPoolExecutor] = {}
        self.workers = {t.name: _workers(t) for t in cfg.transforms}

    def start(self) -> None:
        """Load the in-process transforms and start the worker processes (each loads its own)."""
        for spec in self._specs:
            t = spec[0]
            for function in (t.function, t.setup):
                if self.workers[t.name] and _unimportable(function):
                    raise ConfigError(
                        f"{spec[2]}: {callable_name(function)} is defined where worker processes cannot import it "
                        "(a notebook's cell): set workers = 0, or put it in a module"
                    )
            if self.workers[t.name] == 0:
                self._local[t.name] = Loaded(*spec)
            else:
                self._pools[t.name] = _pool(self.workers[t.name], spec)

    def close(self) -> None:
        """Stop the workers: the runs not started are cancelled, the ones running (a unit's share) finish first."""
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        self._pools.clear()

    async def call(self, task: Task) -> dict[str, Packed]:
        """``task``'s outputs, in its samples' order, from equal runs over the transform's workers."""
        if task.name in self._local:
            return await asyncio.to_thread(self._in_process, self._local[task.name].call, task)
        outputs = [p for _, p in await self._runs(task, _run)]
        return {f: Packed.join([o[f] for o in outputs]) for f in outputs[0]} if outputs else {}

    async def call_sparing(self, task: Task) -> Spared:
        """:meth:`call`, leaving out the samples it fails on (:meth:`Loaded.call_sparing`); positions in ``task``."""
        if task.name in self._local:
            return await asyncio.to_thread(self._in_process, self._local[task.name].call_sparing, task)
        parts = await self._runs(task, _run_sparing)
        failed = tuple((start + i, error) for start, p in parts for i, error in p.failed)
        fields = parts[0][1].outputs if parts else {}
        return Spared({f: Packed.join([p.outputs[f] for _, p in parts]) for f in fields}, failed)

    def _in_process(self, call: Callable[[Task], T], task: Task) -> T:
        with self._one_at_a_time:
            return call(task)

    async def _runs(self, task: Task, run: Callable[[Task], T]) -> list[tuple[int, T]]:
        """``run`` over equal runs of ``task`` on its transform's workers: each run's start, and its result."""
        n = task.slots.shape[1]
        pool = self._pools[task.name]
        runs = [r for r in np.array_split(np.arange(n), max(1, min(self.workers[task.name], n))) if r.size]
        loop = asyncio.get_running_loop()
        parts = await asyncio.gather(
            *(loop.run_in_executor(pool, run, _part(task, r)) for r in runs), return_exceptions=True
        )
        for p in parts:
            if isinstance(p, BaseException):
                if isinstance(p, PgprefetchError):
                    raise p
                raise TransformError(f"transform {task.name}: a worker process failed ({_shown(p)})") from None
        return [(int(r[0]), cast("T", p)) for r, p in zip(runs, parts, strict=True)]


def _part(task: Task, run: np.ndarray) -> Task:
    lo, hi = int(run[0]), int(run[-1]) + 1
    inputs = {c: v[lo:hi] for c, v in task.inputs.items()}
    return dataclasses.replace(task, inputs=inputs, slots=task.slots[:, lo:hi])


def _unimportable(function: object) -> bool:
    """A function object of a ``__main__`` with no file (a notebook, ``python -c``): no worker can import it."""
    if function is None or isinstance(function, str):
        return False
    module = sys.modules.get(getattr(function, "__module__", "") or "")
    return getattr(module, "__name__", "") == "__main__" and not getattr(module, "__file__", None)


def _workers(t: TransformConfig) -> int:
    return t.workers if t.workers is not None else (os.cpu_count() or 1)


def _pool(workers: int, spec: tuple[TransformConfig, tuple[FieldConfig, ...], str]) -> ProcessPoolExecutor:
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    return ProcessPoolExecutor(workers, mp_context=context, initializer=_start, initargs=([spec],))
