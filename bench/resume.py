"""The RESUME benchmark: a dump killed with a fraction k of its batches written, resumed, against a fresh dump (#30).

Target: a resume with a fraction k of the batches kept takes at most (1 - k) of a fresh dump, plus a small
constant (``CONSTANT_S``: the start-up, keys query and plan a resume does again). A resume used to read
every kept batch back through zarr for its statistics, and at three quarters kept it was slower than
starting over.

One epoch of the windows dataset (or a ``fraction`` of it), dumped by ``pgprefetch dump`` as a whole
process (:mod:`bench.dumprun`'s binary). Each case: a dump started and killed (SIGKILL) once its journal
holds k of the epoch's batches, then the same command again, which resumes; its seconds against the
median of fresh dumps (``--force``) made before and after the cases, so that drift weighs on both. The
kept fraction is the one the resume reports (``resumed_batches``), not the one aimed at. The dump's own
reported seconds are the verdict's base (no interpreter start-up); wall seconds are given beside them.
Before each timed dump the page cache is synced, untimed: the dump syncs the epoch's files before it
publishes, which would otherwise also pay for writing back the killed dump's batches (the kernel does that within 30 s,
long before cron's next run).
The resumed epoch's ``keys_sha256`` and every batch's checksums must equal the fresh dump's, or the
case fails.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import zarr

from pgprefetch.store.local import LocalStore

from . import log
from .datasets import Dataset
from .dumprun import PGPREFETCH

FRACTIONS = (0.25, 0.5, 0.75)  # of the batches written when the dump is killed
CONSTANT_S = 1.0  # the target's constant: what a resume does again before its first batch
FRESH_ROUNDS = 2  # fresh dumps: one before the cases, one after
BEGIN = "<!-- resume bench: begin -->"
END = "<!-- resume bench: end -->"


@dataclass
class ResumeCase:
    """One kill point: the fraction aimed at, the batches kept, and the resume's seconds."""

    aimed: float
    kept: int
    n_batches: int
    dump_s: float  # the resume's own reported seconds
    wall_s: float  # around the process

    @property
    def k(self) -> float:
        return self.kept / self.n_batches


@dataclass
class ResumeResults:
    samples: int = 0
    n_batches: int = 0
    fresh_dump_s: list[float] = field(default_factory=list)
    fresh_wall_s: list[float] = field(default_factory=list)
    cases: list[ResumeCase] = field(default_factory=list)
    identical: bool = False
    quick: bool = False
    seconds: float = 0.0

    @property
    def fresh_s(self) -> float:
        return statistics.median(self.fresh_dump_s)

    @property
    def fresh_wall(self) -> float:
        return statistics.median(self.fresh_wall_s)

    def bound(self, case: ResumeCase) -> float:
        """The target: (1 - k) of a fresh dump, plus the constant."""
        return (1 - case.k) * self.fresh_s + CONSTANT_S

    @property
    def passed(self) -> bool:
        return self.identical and all(c.dump_s <= self.bound(c) for c in self.cases)


def _argv(config: Path, dsn: str, *extra: str) -> list[str]:
    return [str(PGPREFETCH), "dump", "--config", str(config), "--epoch", "0", "--json", "--dsn", dsn, *extra]


def _run(argv: list[str]) -> tuple[dict, float]:
    """Run a dump, its summary and wall seconds. The page cache is synced first, untimed: the dump syncs the
    epoch's files before it publishes, which would otherwise also write back what ran before it (a killed
    dump's batches, which cron's next run, a minute later, finds written back by the kernel long since)."""
    os.sync()
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"resume bench: {' '.join(argv[1:3])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1]), wall


def _journal_batches(journal: Path) -> int:
    """Batches a running dump's journal records (its header and snapshot lines left out)."""
    try:
        lines = journal.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return 0
    return sum(1 for line in lines[1:] if line and not line.startswith("#"))


def _kill_at(config: Path, dsn: str, journal: Path, batches: int) -> None:
    """Start a dump and SIGKILL it once its journal holds ``batches`` batches (or it ends first: an error)."""
    proc = subprocess.Popen(_argv(config, dsn), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while _journal_batches(journal) < batches:
            if proc.poll() is not None:
                raise RuntimeError(f"resume bench: the dump ended before {batches} batches; use a larger epoch")
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def _epoch_digest(store: Path) -> tuple[str, list[int]]:
    """The published epoch's keys hash and every batch's checksums (what a resume must reproduce)."""
    group = zarr.open_group(store / "epoch-00000", mode="r")
    manifest = dict(group.attrs)["pgprefetch"]
    sums = zarr.open_array(store / "epoch-00000" / manifest["checksums"]["array"], mode="r")[:]
    return manifest["keys_sha256"], [int(x) for x in sums.ravel()]


def run(ds: Dataset, dsn: str, *, fraction: float = 1.0, quick: bool = False) -> ResumeResults:
    """Fresh dumps around a kill-and-resume per fraction of ``FRACTIONS``."""
    started = time.perf_counter()
    results = ResumeResults(quick=quick)
    workdir = Path(tempfile.mkdtemp(prefix="pgpf-bench-resume-"))
    store = workdir / "store"
    config = workdir / "resume.toml"
    config.write_text(ds.config(store, fraction), encoding="utf-8")
    journal = LocalStore(store).journal_path(0)
    try:
        summary, wall = _run(_argv(config, dsn, "--force"))
        results.samples, results.n_batches = summary["n_samples"], summary["n_batches"]
        results.fresh_dump_s.append(summary["seconds"])
        results.fresh_wall_s.append(wall)
        fresh = _epoch_digest(store)
        log(f"  fresh: {results.samples:,} samples, {results.n_batches:,} batches in {summary['seconds']:.2f} s")
        same = True
        for aimed in FRACTIONS:
            shutil.rmtree(store, ignore_errors=True)
            _kill_at(config, dsn, journal, max(1, round(aimed * results.n_batches)))
            summary, wall = _run(_argv(config, dsn))
            case = ResumeCase(aimed, summary.get("resumed_batches", 0), summary["n_batches"], summary["seconds"], wall)
            results.cases.append(case)
            same = same and _epoch_digest(store) == fresh
            log(
                f"  killed at {aimed:.0%}: {case.kept:,} of {case.n_batches:,} batches kept, resumed in "
                f"{case.dump_s:.2f} s ({wall:.2f} s wall)"
            )
        for _ in range(FRESH_ROUNDS - 1):
            summary, wall = _run(_argv(config, dsn, "--force"))
            results.fresh_dump_s.append(summary["seconds"])
            results.fresh_wall_s.append(wall)
            log(f"  fresh again: {summary['seconds']:.2f} s")
        results.identical = same
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results.seconds = time.perf_counter() - started
    return results


def render(results: ResumeResults, *, revision: str = "") -> str:
    """The resume section, between markers so that ``--resume-only`` can replace it in RESULTS.md."""
    from .machine import code_revision, cpu_model

    out = [BEGIN, "## Resume: a dump killed with k of its batches written, against a fresh dump", ""]
    if results.quick:
        out += ["**`--quick` smoke run: an epoch too small to be representative.**", ""]
    out += [
        f"One epoch of the windows dataset ({results.samples:,} windows of 64 rows, {results.n_batches:,} "
        "batches, uncompressed), dumped by `pgprefetch dump` as a whole process. Each row: a dump killed "
        "(SIGKILL) once its journal held about k of the batches, then the same command again, which resumes; "
        f"k is the fraction it reports kept. The page cache is synced, untimed, before each timed dump (its "
        "sync of the epoch's files would otherwise also write back the killed dump's batches, which the kernel "
        f"does within 30 s, long before cron's next run). *fresh*: the median of {len(results.fresh_dump_s)} "
        "`--force` dumps, one before the cases and one after. Seconds are the dumps' own (no interpreter "
        f"start-up); wall seconds beside them. Target: resume <= (1 - k) x fresh + {CONSTANT_S:g} s. Every "
        f"resumed epoch's keys hash and batch checksums {'equal' if results.identical else 'DIFFER FROM'} the "
        "fresh dump's.",
        "",
        "| k kept | batches kept | resume s | wall s | (1 - k) x fresh + c | resume / fresh | target |",
        "|--:|--:|--:|--:|--:|--:|---|",
    ]
    for c in results.cases:
        bound = results.bound(c)
        out.append(
            f"| {c.k:.2f} | {c.kept:,} of {c.n_batches:,} | {c.dump_s:.2f} | {c.wall_s:.2f} | {bound:.2f} "
            f"| {c.dump_s / results.fresh_s:.2f} | {'PASS' if c.dump_s <= bound else 'FAIL'} |"
        )
    out += [
        "",
        f"Fresh dump: {results.fresh_s:.2f} s ({results.fresh_wall:.2f} s wall). "
        f"Resume target: {'PASS' if results.passed else 'FAIL'}.",
        "",
        f"Resume bench: {cpu_model()}, Python {platform.python_version()}, pgprefetch {revision or code_revision()}; "
        f"{results.seconds:.0f} s.",
        END,
    ]
    return "\n".join(out)
