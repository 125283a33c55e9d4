"""The KEYS benchmark (issue #27): query-mode dumps whose keys outgrow ``--memory``, and 10^9 keys on paper.

Every dump is ``pgprefetch dump`` as a whole process, its peak RSS taken by :data:`bench.dumprun.RSS_WRAPPER`
and the disk its ordered keys take (``<partial>/epoch-N.keys``) sampled every 50 ms. The keys come from
``generate_series`` in the keys query itself (nothing to load) and the per-sample query is about the
cheapest there is (``SELECT $1 % 1000``, one int64 field), so the keys are as large a share of the dump
as they get: the rate ratio is a worst case.

- **RSS.** ``N`` keys (1x) and ``8N`` (8x), both under ``--memory 64MiB`` (both beyond it: ordered on
  disk), and the same under ``--memory 8GiB`` (the in-memory path, what every dump did before): the
  growth of the peak per extra key. Target: under 8 bytes a key with one key column (29 before). Then
  ``16N`` once under the budget: how the peak grows past 8x.
- **Rate.** The 8x dumps: samples/s of the whole process with the keys on disk against in memory, per
  round (the two dumps back to back), the median of the rounds; the dump's CPU seconds beside it; and the
  keys phase alone (read and ordered) from the dump's log line. Target: at least 0.8x.
- **10^9 keys**, extrapolated from the 8x and 16x dumps: peak RSS, temporary disk, time.
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import dumprun, log

BUDGET = "64MiB"
IN_MEMORY = "8GiB"
KEYS = 2_000_000  # 1x: beyond 64 MiB of keys' budget (1.68 million one-column keys)
QUICK_KEYS = 100_000  # with --quick, under QUICK_BUDGET
QUICK_BUDGET = "1MiB"
FACTOR = 8
ROUNDS = 3  # each dump once a round, bounded and in memory in turn first
PLATEAU = 16  # bounded: 16x once more, to see where the peak goes past 8x
BILLION = 10**9
KINDS = {  # key columns -> (keys query, per-sample query)
    1: ("SELECT i FROM generate_series(1, {n}) i", "SELECT $1 % 1000 AS v"),
    2: ("SELECT i / 1000 AS a, i % 1000 AS b FROM generate_series(1, {n}) i", "SELECT ($1::int8 + $2) % 1000 AS v"),
}
TARGET_BYTES = 8.0
TARGET_RATE = 0.8
BEGIN = "<!-- keys bench: begin -->"
END = "<!-- keys bench: end -->"
_SPILL = re.compile(r"ordered on disk in (\d+) runs and (\d+) buckets, ([\d.]+) s")
# bench.dumprun's wrapper, also giving the dump's CPU seconds (user + system): steadier than wall time on a
# shared machine.
WRAPPER = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:]).returncode\n"
    "u = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
    "print(f'MAXRSS_KIB {u.ru_maxrss} CPU_S {u.ru_utime + u.ru_stime} RC {rc}', flush=True)\n"
)


@dataclass(frozen=True)
class KeysRun:
    """One dump: its keys, budget, wall time, peak RSS and keys' disk; the keys phase when they spilled."""

    keys: int
    memory: str
    samples: int
    seconds: float
    max_rss: int
    cpu_s: float  # the dump process's user + system seconds
    max_disk: int
    keys_s: float | None = None  # keys read and ordered (only logged when they went to disk)
    runs: int = 0
    buckets: int = 0

    @property
    def rate(self) -> float:
        return self.samples / self.seconds


@dataclass
class KeysCase:
    """One key width: 1x and 8x, bounded and in memory, each dumped once a round."""

    columns: int
    bounded: dict[int, list[KeysRun]] = field(default_factory=dict)  # keys -> runs under the budget
    in_memory: dict[int, list[KeysRun]] = field(default_factory=dict)

    @staticmethod
    def best(runs: list[KeysRun]) -> KeysRun:
        """The round with the best rate (the others were slowed by something else on the machine)."""
        return max(runs, key=lambda r: r.rate)

    @staticmethod
    def peak(runs: list[KeysRun]) -> int:
        """The highest peak RSS of the rounds."""
        return max(r.max_rss for r in runs)

    def per_key(self, runs: dict[int, list[KeysRun]], beyond: bool = False) -> float:
        """Peak RSS growth per extra key (the highest peak of each), 1x to 8x; ``beyond``: the last two sizes."""
        sizes = sorted(runs)
        small, large = sizes[-2:] if beyond else sizes[:2]
        return (self.peak(runs[large]) - self.peak(runs[small])) / (large - small)

    def ratios(self) -> list[float]:
        """Per round, 8x: the bounded dump's samples/s over the in-memory one's (run back to back)."""
        n = max(self.in_memory)
        return [b.rate / m.rate for b, m in zip(self.bounded[n], self.in_memory[n], strict=True)]

    def cpu_ratios(self) -> list[float]:
        """Per round, 8x: the in-memory dump's CPU seconds over the bounded one's (as a rate: above 1 is slower)."""
        n = max(self.in_memory)
        return [m.cpu_s / b.cpu_s for b, m in zip(self.bounded[n], self.in_memory[n], strict=True)]

    @property
    def rate_ratio(self) -> float:
        """The median of the rounds' ratios: each pair of dumps ran back to back, under the same load."""
        return statistics.median(self.ratios())


@dataclass
class KeysResults:
    """What the keys bench measured."""

    budget: str
    cases: list[KeysCase] = field(default_factory=list)
    quick: bool = False
    rounds: int = ROUNDS
    seconds: float = 0.0


def _disk(folder: Path) -> int:
    try:
        return sum(p.stat().st_blocks * 512 for p in folder.iterdir() if p.is_file())
    except OSError:  # not there (yet, or any more)
        return 0


def dump(dsn: str, workdir: Path, columns: int, n: int, memory: str) -> KeysRun:
    """Dump epoch 0 of ``n`` keys of ``columns`` columns under ``memory`` in a process of its own."""
    keys, query = KINDS[columns]
    store = workdir / f"keys-{columns}-{n}-{memory}.zarr"
    config = workdir / f"keys-{columns}.toml"
    config.write_text(
        f"[source]\nconnections = 4\n\n[samples]\nkeys = {json.dumps(keys.format(n=n))}\n"
        f"query = {json.dumps(query)}\n\n"
        '[fields.v]\ncolumns = ["v"]\ndtype = "int64"\n\n'
        f'[batches]\nsize = 1024\nseed = 0\n\n[store]\npath = "{store}"\n',
        encoding="utf-8",
    )
    argv = [sys.executable, "-c", WRAPPER, str(dumprun.PGPREFETCH), "dump", "--config", str(config)]
    argv += ["--epoch", "0", "--force", "--json", "--dsn", dsn, "--memory", memory]
    spill = store / ".pgprefetch" / "partial" / "epoch-00000.keys"
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], _disk(spill))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        started = time.perf_counter()
        p = subprocess.run(argv, capture_output=True, text=True, check=False)
        seconds = time.perf_counter() - started
    finally:
        done.set()
        watcher.join()
        shutil.rmtree(store, ignore_errors=True)
    *lines, last = p.stdout.strip().splitlines() or ["MAXRSS_KIB 0 CPU_S 0 RC -1"]
    _, kib, _, cpu, _, rc = last.split()
    if int(rc) != 0 or not lines:
        raise RuntimeError(f"pgprefetch dump of {n:,} keys failed ({rc}): {(p.stderr + p.stdout).strip()[-2000:]}")
    summary = json.loads(lines[-1])
    found = _SPILL.search(p.stderr)
    return KeysRun(
        keys=n,
        memory=memory,
        samples=int(summary["n_samples"]),
        seconds=seconds,
        max_rss=int(kib) * 1024,
        cpu_s=float(cpu),
        max_disk=peak[0],
        keys_s=float(found[3]) if found else None,
        runs=int(found[1]) if found else 0,
        buckets=int(found[2]) if found else 0,
    )


def run(dsn: str, *, quick: bool = False, columns: tuple[int, ...] = (1, 2), rounds: int = ROUNDS) -> KeysResults:
    """Dump 1x and 8x the keys of each width under the budget and in memory, ``rounds`` times, order alternating."""
    budget, base = (QUICK_BUDGET, QUICK_KEYS) if quick else (BUDGET, KEYS)
    results = KeysResults(budget=budget, quick=quick, rounds=rounds)
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="pgpf-bench-keys-"))
    try:
        for k in columns:
            case = KeysCase(k)
            for n in (base, base * FACTOR):
                pairs = [(budget, case.bounded.setdefault(n, [])), (IN_MEMORY, case.in_memory.setdefault(n, []))]
                for r in range(rounds):
                    for memory, runs in pairs if r % 2 == 0 else pairs[::-1]:
                        runs.append(d := dump(dsn, workdir, k, n, memory))
                        spilled = f", keys on disk: {d.runs} runs, {d.buckets} buckets, {d.keys_s} s" if d.runs else ""
                        log(
                            f"keys: {k} column(s), {n:,} keys, --memory {memory}: {d.rate:,.0f} samples/s, "
                            f"peak RSS {d.max_rss / 2**20:,.1f} MiB, keys' disk {d.max_disk / 2**20:,.1f} MiB{spilled}"
                        )
            if not quick:
                n = base * PLATEAU
                runs = case.bounded[n] = [dump(dsn, workdir, k, n, budget)]
                log(f"keys: {k} column(s), {n:,} keys, --memory {budget}: peak RSS {runs[0].max_rss / 2**20:,.1f} MiB")
            results.cases.append(case)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results.seconds = time.perf_counter() - started
    return results


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:,.1f} GB"


def billion(case: KeysCase, budget: str) -> list[str]:
    """The 8x dumps' figures carried to 10^9 keys, on paper."""
    n = max(case.in_memory)  # 8x
    bounded = case.best(case.bounded[n])
    last = max(case.bounded)  # 16x where measured: the growth past 8x
    growth = max(0.0, case.per_key(case.bounded, beyond=True))
    rss = case.peak(case.bounded[last]) + growth * (BILLION - last)
    old = case.peak(case.in_memory[n]) + case.per_key(case.in_memory) * (BILLION - n)
    disk = max(r.max_disk for r in case.bounded[n]) / n
    keys_rate = n / bounded.keys_s if bounded.keys_s else 0.0
    runs, buckets = bounded.runs * BILLION / n, bounded.buckets * BILLION / n
    return [
        f"- **{case.columns} key column(s), 10^9 keys:** peak RSS about {_gb(rss)} under `--memory {budget}` "
        f"({case.peak(case.bounded[last]) / 2**20:,.0f} MiB at {last:,} keys plus {growth:.2f} B a key, the growth "
        f"from {sorted(case.bounded)[-2]:,}), against "
        f"{_gb(old)} in memory; temporary disk {_gb(disk * BILLION)} at the peak ({disk:.1f} B a key measured: "
        f"spill and ordered file), {_gb(8 * case.columns * BILLION)} while the batches are written; the keys "
        f"read and ordered in {BILLION / keys_rate / 60:,.0f} min at the measured {keys_rate:,.0f} keys/s "
        f"(about {runs:,.0f} runs and {buckets:,.0f} buckets), the whole dump of this query in "
        f"{BILLION / bounded.rate / 3600:,.1f} h at {bounded.rate:,.0f} samples/s."
    ]


def render(results: KeysResults, *, revision: str = "") -> str:
    """The keys section, between markers so that ``--keys-only`` can replace it in RESULTS.md."""
    from .machine import code_revision, cpu_model, times

    out = [BEGIN, "## Keys beyond `--memory`: bounded RSS, the same bytes", ""]
    if results.quick:
        out += [f"**`--quick` smoke run: {QUICK_KEYS:,} keys under `--memory {QUICK_BUDGET}`.**", ""]
    out += [
        "Query-mode dumps of keys from `generate_series`, per-sample query `SELECT $1 % 1000` (one int64 "
        "field, 4 connections, batches of 1,024), each `pgprefetch dump` as a whole process: peak RSS, the "
        "keys' temporary disk (sampled every 50 ms), wall samples/s. *bounded*: `--memory "
        f"{results.budget}`, the keys ordered on disk; *in memory*: `--memory {IN_MEMORY}` (the path every "
        f"dump took before). {results.rounds} round(s), each dumping every line once, bounded and in memory "
        "first in turn: the highest peak RSS and disk of the rounds, the best rate (and its *keys s*: the keys "
        "read and ordered, from the dump's log). The rate ratio is the median of the rounds' ratios, the two "
        "dumps of a round having run back to back (this machine is shared: wall rates move by 30%).",
        "",
        "| key columns | keys | memory | peak RSS MiB | keys' disk MiB | runs | buckets | keys s | samples/s |",
        "|--:|--:|---|--:|--:|--:|--:|--:|--:|",
    ]
    for case in results.cases:
        for runs in (case.bounded, case.in_memory):
            for n, rounds in sorted(runs.items()):
                r = case.best(rounds)
                keys_s = f"{r.keys_s:.1f}" if r.keys_s is not None else ""
                out.append(
                    f"| {case.columns} | {n:,} | {r.memory} | {case.peak(rounds) / 2**20:,.1f} "
                    f"| {max(x.max_disk for x in rounds) / 2**20:,.1f} | {r.runs or ''} | {r.buckets or ''} | {keys_s} "
                    f"| {r.rate:,.0f} |"
                )
    out += ["", "Targets (not meaningful at `--quick` sizes):" if results.quick else "Targets:", ""]
    for case in results.cases:
        per_key, before = case.per_key(case.bounded), case.per_key(case.in_memory)
        target = f" < {TARGET_BYTES:g}: {'PASS' if per_key < TARGET_BYTES else 'FAIL'}" if case.columns == 1 else ""
        if len(case.bounded) > 2:
            target += f" ({case.per_key(case.bounded, beyond=True):.2f} B from {FACTOR}x to {PLATEAU}x)"
        ratio = case.rate_ratio
        rounds = ", ".join(times(r) for r in case.ratios())
        cpu = statistics.median(case.cpu_ratios())
        out += [
            f"- {case.columns} key column(s): peak RSS {per_key:.2f} B per extra key bounded, 1x to {FACTOR}x "
            f"({before:.1f} in memory){target}; samples/s with the keys on disk {times(ratio)} of in memory "
            f"(median of the rounds: {rounds}; {times(cpu)} on the dump's CPU seconds) >= {TARGET_RATE:g}x: "
            f"{'PASS' if ratio >= TARGET_RATE else 'FAIL'}",
        ]
    out += ["", "On paper (a run and a bucket are a budget's worth whatever the count; disk and time linear):", ""]
    for case in results.cases:
        out += billion(case, results.budget)
    out += [
        "",
        f"Keys bench: {cpu_model()}, Python {platform.python_version()}, pgprefetch {revision or code_revision()}; "
        f"{results.seconds:.0f} s.",
        END,
    ]
    return "\n".join(out)
