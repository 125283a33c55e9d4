"""The RAGGED benchmark: token sequences of 1..512 elements, padded to 512 (issue #11).

A table ``tokseq(id, tokens int4[])`` of ``SAMPLES`` rows, sample ``i`` holding ``1 + (i * 7919) % 512``
tokens (untimed setup). Measured, one ``pgprefetch dump`` process at a time:

- *dump*: ``[fields.tokens] max_length = 512`` (int32, pad 0), batches of 256, 8 connections; the dump's
  own seconds (no interpreter start-up) and the wall time around the process.
- *statement ceiling*: the dump's own batch statement for every batch, as binary ``COPY``, bytes thrown
  away: the server's share of the dump's work, with no client.
- *COPY ceiling*: the same batches (the dump's epoch order, read back from its ``keys``), each one binary
  ``COPY (per-sample query joined to the batch's keys) TO STDOUT``, 8 in flight, bytes thrown away: what
  the server needs to send the rows, with no decoding, padding or writing.
- *the database on a core of its own*: the dump (median of 2) and the COPY ceiling again, the embedded
  server pinned to one CPU and the clients to the other, as when the database runs on a host of its own
  (on these 2 cores the client otherwise takes CPU from the server).
- *statistics*: what the per-batch statistics cost the dump's throughput, as an A/B: the dump is run
  ``DUMPS`` times with them and as often without (``EpochStats.add`` replaced by a no-op in the dump's
  process), alternating, medians compared; and the CPU seconds they take over the epoch (``EpochStats.add``
  over the stored batches, as the writer calls it).
- *reading*: ``EpochDataset`` passes copying every batch's tokens out, untrimmed and ``trim=True``, at
  the stored size (256) and at ``batch_size=16``; samples/s, medians of ``PASSES``.

``python -m bench.ragged [--quick]`` runs it alone; ``python -m bench --ragged-only`` writes its section.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import numpy as np
import torch
import zarr

from pgprefetch import EpochDataset, load_config

from . import log
from .contenders import _copy_batches, statement_ceiling

SAMPLES = 500_000
QUICK_SAMPLES = 20_000
MAX_LENGTH = 512
SIZE = 256
CONNECTIONS = 8
PASSES = 3
DUMPS = 3  # dumps with statistics, and as many without
# The dump with the statistics switched off (the A/B's B): the same CLI, EpochStats.add a no-op.
NO_STATISTICS = (
    "import pgprefetch.write.files.stats as s; s.EpochStats.add = lambda *a: None; "
    "from pgprefetch.cli import main; main()"
)
BEGIN = "<!-- ragged bench: begin -->"
END = "<!-- ragged bench: end -->"
PGPREFETCH = Path(sys.executable).parent / "pgprefetch"
QUERY = "SELECT tokens FROM tokseq WHERE id = $1"


@dataclass
class RaggedResults:
    samples: int = 0
    tokens: int = 0
    dump_s: float = 0.0  # as the dump reports it (median)
    dump_wall_s: float = 0.0
    bare_s: float = 0.0  # the same dump without statistics (median)
    dumps: int = 0  # dumps each way
    pinned_dump_s: float = 0.0  # the database on a core of its own (0: not measured)
    pinned_ceiling_s: float = 0.0
    ceiling_s: float = 0.0
    statement_s: float = 0.0
    stats_s: float = 0.0
    read_s: dict[str, list[float]] = field(default_factory=dict)
    total_s: float = 0.0

    def rate(self, seconds: float) -> float:
        return self.samples / seconds if seconds else 0.0


async def load(dsn: str, samples: int) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("DROP TABLE IF EXISTS tokseq")
        await conn.execute("CREATE TABLE tokseq (id int PRIMARY KEY, tokens int4[] NOT NULL)")
        await conn.execute(
            "INSERT INTO tokseq SELECT i, array(SELECT ((i::int8 * 31 + g) % 50000)::int4"
            " FROM generate_series(1, 1 + (i::int8 * 7919) % $2) g) FROM generate_series(1, $1) i",
            samples,
            MAX_LENGTH,
        )
        await conn.execute("VACUUM ANALYZE tokseq")
        return int(await conn.fetchval("SELECT sum(cardinality(tokens)) FROM tokseq"))
    finally:
        await conn.close()


def config_text(store: Path) -> str:
    return f"""[source]
connections = {CONNECTIONS}
[samples]
keys = "SELECT id FROM tokseq"
query = "{QUERY}"
[fields.tokens]
columns = ["tokens"]
dtype = "int32"
max_length = {MAX_LENGTH}
[batches]
size = {SIZE}
drop_last = false
[store]
path = "{store}"
"""


def dump(dsn: str, folder: Path, *, with_statistics: bool = True) -> tuple[float, float]:
    """(the dump's seconds, wall seconds) of epoch 0 into ``folder / "store"``."""
    config = folder / "tokens.toml"
    config.write_text(config_text(folder / "store"), encoding="utf-8")
    command = [str(PGPREFETCH)] if with_statistics else [sys.executable, "-c", NO_STATISTICS]
    argv = [*command, "dump", "--config", str(config), "--epoch", "0", "--force", "--json", "--dsn", dsn]
    started = time.perf_counter()
    p = subprocess.run(argv, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if p.returncode:
        raise RuntimeError(f"pgprefetch dump failed: {p.stderr.strip()[-2000:]}")
    return float(json.loads(p.stdout.strip().splitlines()[-1])["seconds"]), wall


def ceiling(dsn: str, store: Path) -> float:
    keys = zarr.open_array(store / "epoch-00000" / "keys", mode="r")[:].reshape(-1)
    keys = keys[keys > 0].reshape(1, -1)  # the epoch order; the last batch's padding left out

    def statement(batch: np.ndarray) -> str:
        ids = ",".join(map(str, batch[0].tolist()))
        return (
            f"SELECT q.tokens FROM unnest('{{{ids}}}'::int8[]) WITH ORDINALITY AS k(id, ord) "
            f"CROSS JOIN LATERAL ({QUERY.replace('$1', 'k.id')}) AS q"
        )

    return asyncio.run(_copy_batches(dsn, keys, SIZE, statement, connections=CONNECTIONS)).seconds


@contextlib.contextmanager
def database_on_its_own_core(dsn: str) -> Iterator[bool]:
    """The embedded server on CPU 0 and this process (the COPY ceiling's client, the dumps it starts) on CPU 1.

    Where the database runs on a host of its own, the client's work does not take the server's CPU; on
    these 2 cores they otherwise share both. Yields False (nothing pinned) for a server given by
    ``PGPREFETCH_BENCH_DSN``, with fewer than 2 CPUs or without ``taskset`` and ``pgrep``.
    """
    host = dsn.partition("host=")[2].partition("&")[0]
    pid_file = Path(host, "postmaster.pid")
    mine = os.sched_getaffinity(0)
    tools = shutil.which("taskset") and shutil.which("pgrep")
    if os.environ.get("PGPREFETCH_BENCH_DSN") or len(mine) < 2 or not pid_file.exists() or not tools:
        yield False
        return
    server_cpu, client_cpu = sorted(mine)[:2]
    postmaster = pid_file.read_text().split()[0]
    every = ",".join(map(str, sorted(mine)))

    def pin(cpus: str) -> None:  # the postmaster (whose new backends inherit it) and its running processes
        children = subprocess.run(["pgrep", "-P", postmaster], capture_output=True, text=True).stdout.split()
        for pid in [postmaster, *children]:
            subprocess.run(["taskset", "-a", "-p", "-c", cpus, pid], capture_output=True, check=False)

    pin(str(server_cpu))
    os.sched_setaffinity(0, {client_cpu})
    try:
        yield True
    finally:
        os.sched_setaffinity(0, mine)
        pin(every)


def stats_seconds(store: Path) -> float:
    """CPU seconds of the statistics over every stored batch, computed as the writer does."""
    from pgprefetch.write.files.stats import EpochStats, FieldStats

    group = zarr.open_group(store / "epoch-00000", mode="r")
    tokens, lengths = group["tokens"], group["tokens_length"]
    n_batches = tokens.shape[0]
    field = FieldStats("tokens", ("tokens",), 1, MAX_LENGTH, None, "tokens_length", None)
    stats = EpochStats((field,), n_batches, SIZE, int(group.attrs["pgprefetch"]["n_samples"]))
    arrays = [(b, {"tokens": tokens[b], "tokens_length": lengths[b]}) for b in range(n_batches)]
    started = time.process_time()
    for b, batch in arrays:
        stats.add(b, 1, batch)
    return time.process_time() - started


def read_pass(store: Path, *, trim: bool, batch_size: int | None) -> float:
    started = time.perf_counter()
    ds = EpochDataset(store, 0, consumer=None, trim=trim, batch_size=batch_size)
    out = torch.empty((batch_size or SIZE, MAX_LENGTH), dtype=torch.int32)
    for batch in ds:
        t = batch["tokens"]
        out[: t.shape[0], : t.shape[1]].copy_(t)
    return time.perf_counter() - started


def run(samples: int = SAMPLES, passes: int = PASSES, dumps: int = DUMPS) -> RaggedResults:
    from .postgres import database, server

    results = RaggedResults()
    started = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="pgpf-bench-ragged-"))
    try:
        with server() as admin, database(admin) as dsn:
            t0 = time.perf_counter()
            results.tokens = asyncio.run(load(dsn, samples))
            results.samples = samples
            log(f"ragged: {samples:,} sequences, {results.tokens:,} tokens loaded in {time.perf_counter() - t0:.0f} s")
            runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
            results.dumps = dumps
            for i in range(dumps):  # in turns, each first every other time: drifting load hits both alike
                for with_statistics in (True, False) if i % 2 == 0 else (False, True):
                    runs[with_statistics].append(dump(dsn, folder, with_statistics=with_statistics))
            results.dump_s = statistics.median(s for s, _ in runs[True])
            results.dump_wall_s = statistics.median(w for _, w in runs[True])
            results.bare_s = statistics.median(s for s, _ in runs[False])
            log(f"  dump {results.rate(results.dump_s):,.0f} samples/s ({results.dump_s:.1f} s)")
            log(f"  without statistics {results.rate(results.bare_s):,.0f} samples/s")
            results.ceiling_s = ceiling(dsn, folder / "store")
            log(f"  COPY ceiling {results.rate(results.ceiling_s):,.0f} samples/s ({results.ceiling_s:.1f} s)")
            cfg = load_config(folder / "tokens.toml", dsn=dsn)
            results.statement_s = asyncio.run(statement_ceiling(cfg, connections=CONNECTIONS))[0].seconds
            log(f"  statement ceiling {results.rate(results.statement_s):,.0f} samples/s")
            with database_on_its_own_core(dsn) as pinned:
                if pinned:
                    results.pinned_dump_s = statistics.median(dump(dsn, folder)[0] for _ in range(2))
                    results.pinned_ceiling_s = ceiling(dsn, folder / "store")
                    log(
                        f"  database on a core of its own: dump {results.rate(results.pinned_dump_s):,.0f} samples/s,"
                        f" COPY ceiling {results.rate(results.pinned_ceiling_s):,.0f} samples/s"
                    )
        store = folder / "store"
        results.stats_s = stats_seconds(store)
        log(f"  statistics {results.stats_s:.2f} CPU s over the epoch")
        variants = {
            "256": dict(trim=False, batch_size=None),
            "256, trim": dict(trim=True, batch_size=None),
            "16": dict(trim=False, batch_size=16),
            "16, trim": dict(trim=True, batch_size=16),
        }
        read_pass(store, trim=False, batch_size=None)  # warm the page cache
        results.read_s = {name: [] for name in variants}
        for p in range(passes):
            names = list(variants)
            for name in names[p % len(names) :] + names[: p % len(names)]:
                results.read_s[name].append(read_pass(store, **variants[name]))  # type: ignore[arg-type]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    results.total_s = time.perf_counter() - started
    log(summary(results))
    return results


def summary(r: RaggedResults) -> str:
    reads = ", ".join(f"{k} {r.rate(statistics.median(v)):,.0f}/s" for k, v in r.read_s.items())
    return (
        f"  ragged: dump {r.rate(r.dump_s):,.0f}/s = {r.ceiling_s / r.dump_s:.2f}x the COPY ceiling "
        f"({r.rate(r.ceiling_s):,.0f}/s); statistics cost {1 - r.bare_s / r.dump_s:.1%} of its throughput; "
        f"reads {reads}"
    )


def render(r: RaggedResults, *, revision: str = "") -> str:
    ratio = r.ceiling_s / r.dump_s
    cost = 1 - r.bare_s / r.dump_s  # throughput lost: 1 - (samples/s with) / (samples/s without)
    read = {k: r.rate(statistics.median(v)) for k, v in r.read_s.items()}
    lines = [
        BEGIN,
        f"## Variable-length token sequences ({r.samples:,} samples of 1..{MAX_LENGTH} int32, max_length {MAX_LENGTH})",
        "",
        f"`python -m bench.ragged`{f' at {revision}' if revision else ''}; {r.tokens:,} tokens, batches of {SIZE}, "
        f"{CONNECTIONS} connections, {r.total_s:.0f} s in all.",
        "",
        "| measure | samples/s | ratio |",
        "|---|--:|---|",
        f"| dump (its own seconds; {r.dump_wall_s:.1f} s wall) | {r.rate(r.dump_s):,.0f} | "
        f"{ratio:.2f}x the COPY ceiling (target >= 0.8x: {'met' if ratio >= 0.8 else '**not met**'}) |",
        f"| per-batch COPY ceiling of the same query | {r.rate(r.ceiling_s):,.0f} | baseline |",
        f"| the dump's batch statement alone, as COPY | {r.rate(r.statement_s):,.0f} | "
        f"{r.ceiling_s / r.statement_s:.2f}x the COPY ceiling; the dump is {r.statement_s / r.dump_s:.2f}x it |",
        f"| the dump without statistics (A/B, medians of {r.dumps}) | {r.rate(r.bare_s):,.0f} | statistics cost "
        f"{cost:.1%} of the throughput (target <= 5%: {'met' if cost <= 0.05 else '**not met**'}) |",
        *(
            [
                f"| dump, the database on a core of its own (server on CPU 0, client on CPU 1; median of 2) | "
                f"{r.rate(r.pinned_dump_s):,.0f} | {r.pinned_ceiling_s / r.pinned_dump_s:.2f}x the COPY ceiling "
                f"pinned alike ({r.rate(r.pinned_ceiling_s):,.0f}/s; target >= 0.8x: "
                f"{'met' if r.pinned_ceiling_s >= 0.8 * r.pinned_dump_s else '**not met**'}) |"
            ]
            if r.pinned_dump_s
            else []
        ),
        f"| statistics (CPU s over the epoch) | {r.stats_s:.2f} s | {r.stats_s / r.dump_s:.1%} of the dump's seconds |",
    ]
    for size in ("256", "16"):
        lines.append(
            f"| read, batches of {size}: untrimmed / `trim=True` | {read[size]:,.0f} / {read[size + ', trim']:,.0f} | "
            f"{read[size + ', trim'] / read[size]:.2f}x |"
        )
    lines += [
        "",
        f"Lengths are uniform over 1..{MAX_LENGTH}, so a batch's longest sample is near {MAX_LENGTH} and trimming "
        "saves little here; it pays where lengths cluster below the maximum. Reads copy each batch's tokens out.",
        END,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="variable-length token sequences against the COPY ceiling")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_SAMPLES:,} samples, 1 read pass")
    args = parser.parse_args(argv)
    quick = args.quick
    print(render(run(QUICK_SAMPLES if quick else SAMPLES, 1 if quick else PASSES, 1 if quick else DUMPS)))


if __name__ == "__main__":
    main()
