"""The SMALL benchmark: the same epoch dumped in batches of 10 against batches of 1,000 (issue #13).

Target: batches of 10 dump at least half the samples/s of batches of 1,000 on the same data. A subset of
the rows dataset, the first ``SAMPLES`` ids of ``train_items`` copied into a table of their own (untimed),
is the epoch: each size is a ``pgprefetch dump`` of it as a whole process (:func:`bench.dumprun.dump`),
differing only in ``[batches] size``. Each round dumps every size once, the order reversed from one round
to the next (so that drift weighs on all alike); a size's figure is the median of its rounds. Both the
wall time around the process and the dump's own reported seconds (no interpreter start-up: the keys
query, the shuffle, fetching, decoding, writing and syncing) are given; the verdict is taken on the
latter, the stricter base, as the fixed costs of a process only bring the sizes closer together.

The first round also reads back each epoch's ``keys`` array: every size must hold the same samples in the
same order (the shuffle does not depend on the batch size), or the part fails. The base size's is read
through zarr, independently of pgprefetch; the others' through ``EpochDataset.batch_keys``, since zarr
decodes chunks one at a time in Python (about 80 µs each: 10 s for the 120,000 batches of 10).
"""

from __future__ import annotations

import asyncio
import dataclasses
import platform
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import numpy as np

from pgprefetch import EpochDataset

from . import dumprun, log
from .datasets import CONNECTIONS, ROWS, Dataset

SIZES = (1000, 100, 10)  # [batches] size of each dump; the first is the base, the last the target's
BASE, SMALL = SIZES[0], SIZES[-1]
SAMPLES = 1_200_000  # samples in the epoch at the default scale (the epoch had 1M)
QUICK_SAMPLES = 4_000
ROUNDS = 2
TABLE = "small_items"
TARGET = 0.5
BEGIN = "<!-- small batches bench: begin -->"
END = "<!-- small batches bench: end -->"


@dataclass
class SmallCase:
    """One batch size: its dumps, one per round."""

    size: int
    runs: list[dumprun.DumpRun] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return self.runs[0].samples

    @property
    def batches(self) -> int:
        return -(-self.samples // self.size)

    @property
    def wall_s(self) -> float:
        """Median seconds around the process."""
        return statistics.median(r.seconds for r in self.runs)

    @property
    def dump_s(self) -> float:
        """Median seconds the dump reported."""
        return statistics.median(r.dump_seconds for r in self.runs)

    @property
    def wall_rate(self) -> float:
        return self.samples / self.wall_s

    @property
    def dump_rate(self) -> float:
        return self.samples / self.dump_s


@dataclass
class SmallResults:
    """Every size's dumps, whether the keys were compared, and how long the part took."""

    cases: list[SmallCase] = field(default_factory=list)
    table_rows: int = 0
    keys_checked: bool = False
    quick: bool = False
    seconds: float = 0.0

    def case(self, size: int) -> SmallCase:
        return next(c for c in self.cases if c.size == size)

    def times(self, size: int = SMALL, *, wall: bool = False) -> float:
        """Samples/s of batches of ``size`` over those of batches of ``BASE`` (dump's seconds, or wall)."""
        what = "wall_rate" if wall else "dump_rate"
        return getattr(self.case(size), what) / getattr(self.case(BASE), what)

    @property
    def passed(self) -> bool:
        return self.times() >= TARGET


async def prepare(dsn: str, samples: int) -> int:
    """(Re)create ``TABLE``: the first ``samples`` ids of ``train_items``; return its row count."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        await conn.execute(f"CREATE TABLE {TABLE} AS SELECT id FROM train_items ORDER BY id LIMIT {int(samples)}")
        await conn.execute(f"VACUUM (FREEZE, ANALYZE) {TABLE}")
        return int(await conn.fetchval(f"SELECT count(*) FROM {TABLE}"))
    finally:
        await conn.close()


def dataset(size: int) -> Dataset:
    """The rows dataset over ``TABLE``, in batches of ``size``."""
    return dataclasses.replace(ROWS, name=f"rows-b{size}", keys=f"SELECT id FROM {TABLE}", batch_size=size)


def reader_keys(store: Path) -> np.ndarray:
    """The keys of epoch 0 in ``store`` through pgprefetch's reader, batch after batch: ``(samples, k)``."""
    ds = EpochDataset(store, 0, consumer=None)
    return np.concatenate([ds.batch_keys(i).numpy() for i in range(len(ds))])


def check_keys(keys: dict[int, np.ndarray], samples: int) -> None:
    """Every size's epoch holds the base size's samples in the same order, or raise."""
    base = keys[BASE]
    if base.shape != (1, samples):
        raise RuntimeError(f"small batches: the size-{BASE} epoch's keys array has shape {base.shape}")
    for size, other in keys.items():
        if other.shape != base.shape or not np.array_equal(other, base):
            differ = f", {np.count_nonzero(other != base):,} positions differ" if other.shape == base.shape else ""
            raise RuntimeError(
                f"small batches: the size-{size} epoch does not hold the size-{BASE} epoch's samples in its order "
                f"(keys {other.shape} against {base.shape}{differ})"
            )


def run(dsn: str, *, samples: int = SAMPLES, rounds: int = ROUNDS, workdir: Path | None = None) -> SmallResults:
    """Make the subset table, dump it ``rounds`` times at each size, compare the first round's keys."""
    started = time.perf_counter()
    results = SmallResults(cases=[SmallCase(s) for s in SIZES], quick=samples < SAMPLES)
    results.table_rows = asyncio.run(prepare(dsn, samples))
    if results.table_rows < samples:
        log(f"small batches: warning: only {results.table_rows:,} train rows loaded, fewer than {samples:,}")
    own = workdir is None
    workdir = workdir or Path(tempfile.mkdtemp(prefix="pgpf-bench-small-"))
    try:
        keys: dict[int, np.ndarray] = {}
        for r in range(rounds):
            for case in results.cases if r % 2 == 0 else results.cases[::-1]:
                ds = dataset(case.size)
                read = None if case.size == BASE else reader_keys
                got = dumprun.dump(ds, dsn, workdir, keep_keys=r == 0, read_keys=read)
                if got.samples != results.table_rows:
                    raise RuntimeError(f"small batches: size {case.size} wrote {got.samples:,} samples")
                if got.keys is not None:
                    keys[case.size] = got.keys
                case.runs.append(dataclasses.replace(got, keys=None))
                log(
                    f"  size {case.size:>5}: {got.samples:,} samples in {got.seconds:.1f} s "
                    f"({got.dump_seconds:.1f} s reported) = {got.rate:,.0f}/s"
                )
            if r == 0:
                check_keys(keys, results.table_rows)
                results.keys_checked = True
                log(f"  keys: every size's epoch holds the same {results.table_rows:,} samples in the same order")
                keys.clear()
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    results.seconds = time.perf_counter() - started
    return results


def render(results: SmallResults, *, revision: str = "") -> str:
    """The small batches section, between markers so that ``--small-only`` can replace it in RESULTS.md."""
    from .machine import code_revision, cpu_model, times

    base = results.case(BASE)
    runs = len(base.runs)
    out = [BEGIN, "## Small batches: the same epoch in batches of 10 and of 1,000", ""]
    if results.quick:
        out += ["**`--quick` smoke run: sizes too small to be representative.**", ""]
    out += [
        f"One epoch of {results.table_rows:,} samples of the rows dataset (the first ids of `train_items`, "
        f"copied into `{TABLE}` untimed; one row per sample, float32 `emb` of 16, `features`, `day`, `label`), "
        "dumped by `pgprefetch dump` as a whole process at each `[batches] size`, nothing else changed "
        f"({CONNECTIONS} connections, uncompressed). {runs} rounds, each dumping every size once, the order "
        "reversed from one round to the next; the median of the rounds. *dump s*: the dump's own reported "
        "seconds (the keys query, shuffle, fetching, decoding, writing and syncing; no interpreter start-up), "
        "the base of the verdict; *wall s*: around the process. "
        f"*keys*: the first round's epochs' `keys` arrays, flattened (the {BASE:,} one read through zarr, the "
        "others through `EpochDataset.batch_keys`: zarr decodes chunks one by one, ~80 µs each), "
        f"{'are equal: the same samples in the same order' if results.keys_checked else 'were not compared'}.",
        "",
        f"| batch size | batches | samples | samples/s | dump s | wall samples/s | wall s | vs {BASE:,} "
        f"| vs {BASE:,} (wall) |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for c in results.cases:
        out.append(
            f"| {c.size:,} | {c.batches:,} | {c.samples:,} | {c.dump_rate:,.0f} | {c.dump_s:.2f} "
            f"| {c.wall_rate:,.0f} | {c.wall_s:.2f} | {times(results.times(c.size))} "
            f"| {times(results.times(c.size, wall=True))} |"
        )
    ratio = results.times()
    out += [
        "",
        "Targets (not meaningful at `--quick` sizes):" if results.quick else "Targets:",
        "",
        f"- batches of {SMALL} / batches of {BASE:,}: {times(ratio)} of the samples/s (dump's seconds; "
        f"{times(results.times(wall=True))} on wall time) >= {TARGET:g}x: {'PASS' if results.passed else 'FAIL'}",
        "",
        f"Small batches bench: {cpu_model()}, Python {platform.python_version()}, "
        f"pgprefetch {revision or code_revision()}; {results.seconds:.0f} s including making the table.",
        END,
    ]
    return "\n".join(out)
