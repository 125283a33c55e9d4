"""``python -m bench``: load the demo data; blog / ceiling / dump, casts, scan (three shapes), RSS, proxy, reader,
opening, small, S3; keys (query-mode keys, and scan mode's keys pass, beyond ``--memory``); resume (a killed dump
resumed against a fresh one)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import numpy as np

from . import casts, contenders, dumprun, frameworks, log, opening, reader, s3, scan, scankeys, stop_child
from . import keys as keys_bench  # `keys` is a variable in several functions here
from . import ragged as ragged_bench
from . import resume as resume_bench
from . import small as small_bench  # `small` is a flag in several functions here
from . import stream as stream_bench  # `stream` reads better as the bench module here too
from .datasets import CONNECTIONS, ROWS, WINDOWS, Dataset
from .machine import code_revision
from .mixed import MIXED
from .postgres import database, server
from .report import LOCAL, Results, Row, render, render_reader, splice, splice_reader

HERE = Path(__file__).resolve().parent
# Windows: 3,200 series -> 616,960 train windows (the ceiling takes ~10 s on 2 cores);
# rows: 2.4M items -> 2.16M train rows.
DEFAULT_SCALE_SEQ = 16.0
DEFAULT_SCALE_ROWS = 24.0
# Mixed (the scan section's second windows shape): 300 series of 256 x scale steps -> 1,214,700 windows at 16.
DEFAULT_SCALE_MIXED = 16.0
QUICK_SCALE_SEQ = 0.1
QUICK_SCALE_ROWS = 0.05
QUICK_SCALE_MIXED = 0.1
MIN_WINDOWS = 200_000
MIN_ROWS = 1_000_000


def utc_now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())


def proxy_target(dsn: str) -> str:
    """What the proxy forwards to: the server's unix socket file, or ``host:port``."""
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    host = query.get("host") or parts.hostname or ""
    port = query.get("port") or parts.port or 5432
    if not host:
        raise SystemExit("the proxy needs a DSN that names its host (a socket folder or host:port)")
    return f"{host}/.s.PGSQL.{port}" if host.startswith("/") else f"{host}:{port}"


def proxied_dsn(dsn: str, port: int) -> str:
    """``dsn`` with its host replaced by the proxy on 127.0.0.1:``port``."""
    parts = urlsplit(dsn)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("host", "port", "sslmode")]
    query.append(("sslmode", "disable"))
    user = parts.username or ""
    auth = f"{user}:{parts.password}@" if parts.password else f"{user}@" if user else ""
    return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{port}", query=urlencode(query)))


@contextlib.contextmanager
def proxy(dsn: str, delay_ms: float) -> Iterator[str]:
    """A delaying proxy in its own process; yields the DSN through it. It exits when its stdin closes."""
    p = subprocess.Popen(
        [sys.executable, "-m", "bench.proxy", "--to", proxy_target(dsn), "--delay-ms", str(delay_ms)],
        cwd=HERE.parent,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None
        line = p.stdout.readline().split()
        if len(line) != 4 or line[0] != "PORT":
            raise RuntimeError(f"the proxy did not start (said {line!r})")
        log(f"proxy on 127.0.0.1:{line[1]}, +{delay_ms:g} ms each way (time.sleep overshoot {line[3]} us corrected)")
        yield proxied_dsn(dsn, int(line[1]))
    finally:
        stop_child(p, timeout=5)


TABLES = {
    "windows": "ticks, train_samples",
    "rows": "items, train_items",
    "mixed": "sensors, sensor_samples",
}  # what each dataset's load writes


async def load(
    dsn: str, scales: dict[str, float], datasets: tuple[Dataset, ...] = (WINDOWS, ROWS)
) -> tuple[dict[str, int], str]:
    """Load the datasets, freeze and checkpoint them; return their train sample counts and the server version."""
    conn = await asyncpg.connect(dsn)
    try:
        counts = {}
        for ds in datasets:
            t = time.perf_counter()
            counts[ds.name] = await ds.load(conn, scales[ds.name])
            log(f"loaded {ds.name}: {counts[ds.name]:,} train samples in {time.perf_counter() - t:.1f} s")
        # Set hint bits and the visibility map now, so that no contender pays for the first read of a page.
        await conn.execute(f"VACUUM (FREEZE, ANALYZE) {', '.join(TABLES[ds.name] for ds in datasets)}")
        with contextlib.suppress(asyncpg.PostgresError):
            await conn.execute("CHECKPOINT")
        version = await conn.fetchval("SELECT version()")
    finally:
        await conn.close()
    os.sync()  # the load's dirty pages must not compete with the first dump's write-back
    return counts, version


async def read_keys(dsn: str, ds: Dataset) -> np.ndarray:
    conn = await asyncpg.connect(dsn)
    try:
        return await ds.epoch_keys(conn)
    finally:
        await conn.close()


def measure(ds: Dataset, dsn: str, workdir: Path, budget_s: float, transport: str, with_ceiling: bool = True) -> Row:
    """Blog, then both ceilings (unless told not to), then dump, for one dataset over one DSN.

    The ceilings' batches are checked against the ``keys`` array the dump wrote: the same samples, in the
    same order, cut into the same batches.
    """
    log(f"{ds.name} ({transport}): blog, {budget_s:g} s budget")
    blog = asyncio.run(contenders.blog(dsn, ds, connections=CONNECTIONS, budget_s=budget_s))
    log(f"  blog: {blog.samples:,} samples in {blog.seconds:.1f} s = {blog.rate:,.0f}/s")
    ceiling = statement = None
    sent: dict[str, np.ndarray] = {}
    if with_ceiling:
        sent["row ceiling"] = asyncio.run(read_keys(dsn, ds))
        ceiling = asyncio.run(contenders.ceiling(dsn, ds, sent["row ceiling"], connections=CONNECTIONS))
        log(f"  row ceiling: {ceiling.samples:,} samples in {ceiling.seconds:.1f} s = {ceiling.rate:,.0f}/s")
        cfg = casts.config(ds, dsn, connections=CONNECTIONS)
        statement, sent["statement ceiling"] = asyncio.run(contenders.statement_ceiling(cfg, connections=CONNECTIONS))
        log(
            f"  statement ceiling: {statement.samples:,} samples in {statement.seconds:.1f} s = {statement.rate:,.0f}/s"
        )
    dump = dumprun.dump(ds, dsn, workdir, keep_keys=with_ceiling)
    log(f"  dump: {dump.samples:,} samples in {dump.seconds:.1f} s = {dump.rate:,.0f}/s")
    for name, keys in sent.items():
        if dump.keys is None or keys.shape != dump.keys.shape or not np.array_equal(keys, dump.keys):
            raise RuntimeError(f"{ds.name}: the {name}'s batches are not the dump's (its keys array differs)")
    if sent:
        log(f"  both ceilings sent the dump's batches: its keys array, {dump.samples:,} samples, equal")
    dump = dataclasses.replace(dump, keys=None)
    return Row(ds.name, transport, dump.samples, blog, dump, ceiling, statement, keys_checked=bool(sent))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute: a smoke test")
    parser.add_argument("--scale-seq", type=float, help=f"windows dataset scale (default {DEFAULT_SCALE_SEQ})")
    parser.add_argument("--scale-rows", type=float, help=f"rows dataset scale (default {DEFAULT_SCALE_ROWS})")
    parser.add_argument(
        "--scale-mixed",
        type=float,
        help=f"scale of the scan section's mixed windows (default {DEFAULT_SCALE_MIXED}: 300 series of 4,096 rows)",
    )
    parser.add_argument("--blog-seconds", type=float, help="time budget of each blog run (default 12, quick 2)")
    parser.add_argument("--delay-ms", type=float, default=0.5, help="proxy delay each way (default 0.5)")
    parser.add_argument("--no-proxy", action="store_true", help="skip the runs through the delaying proxy")
    parser.add_argument(
        "--proxy-ceiling",
        action="store_true",
        help="also run the COPY ceiling through the proxy (its many small chunks cost the Python proxy CPU)",
    )
    parser.add_argument("--reader-only", action="store_true", help="only the reader bench (no PostgreSQL)")
    parser.add_argument(
        "--scan-only",
        action="store_true",
        help="only the scan mode's section (scan, bare COPY, rows read, RSS; the query dump and row ceiling too)",
    )
    parser.add_argument("--no-scan", action="store_true", help="skip the scan mode's section")
    parser.add_argument("--no-reader", action="store_true", help="skip the reader bench")
    parser.add_argument(
        "--opening-only",
        action="store_true",
        help="only the opening bench (EpochDataset and ls on 10^5 batches against 100; no PostgreSQL)",
    )
    parser.add_argument("--no-opening", action="store_true", help="skip the opening bench")
    parser.add_argument(
        "--stream-only",
        action="store_true",
        help="only the EpochStream bench (against EpochDataset and preadv, micro-batches, hand-over; no PostgreSQL)",
    )
    parser.add_argument("--no-stream", action="store_true", help="skip the EpochStream bench")
    parser.add_argument(
        "--frameworks-only",
        action="store_true",
        help="only the NumPy/JAX/Grain bench (EpochArrays against preadv, EpochDataset against the commit before "
        "the NumPy core, device_batches, Grain; no PostgreSQL)",
    )
    parser.add_argument("--no-frameworks", action="store_true", help="skip the NumPy/JAX/Grain bench")
    parser.add_argument(
        "--ragged-only",
        action="store_true",
        help=f"only the variable-length bench ({ragged_bench.SAMPLES:,} token sequences of 1..512 against the "
        "COPY ceiling, the statistics' cost, trimmed reads; a server of its own)",
    )
    parser.add_argument("--no-ragged", action="store_true", help="skip the variable-length bench")
    parser.add_argument(
        "--small-only",
        action="store_true",
        help=f"only the small batches bench (one epoch of {small_bench.SAMPLES:,} rows dumped in batches of "
        f"{', '.join(map(str, small_bench.SIZES))}; loads only the rows dataset)",
    )
    parser.add_argument("--no-small", action="store_true", help="skip the small batches bench")
    parser.add_argument(
        "--s3-only",
        action="store_true",
        help=f"only the S3 bench (dump to moto's S3 server against a local dump and a plain upload; EpochDataset "
        f"over S3 against plain ranged GETs; bytes per rank; {s3.SAMPLES:,} windows, loads only that dataset)",
    )
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 bench")
    parser.add_argument(
        "--keys-only",
        action="store_true",
        help=f"only the keys bench (query-mode dumps of {keys_bench.KEYS:,} keys and {keys_bench.FACTOR}x and "
        f"{keys_bench.PLATEAU}x as many under --memory {keys_bench.BUDGET} and in memory: peak RSS per key, rate, "
        "10^9 on paper; then scan-mode tables of 1M and 8M rows under 64MiB, bench.scankeys; no dataset; "
        "about 35 minutes)",
    )
    parser.add_argument("--no-keys", action="store_true", help="skip the keys bench")
    parser.add_argument(
        "--s3-samples",
        type=int,
        help=f"windows in the S3 bench's epoch (default {s3.SAMPLES:,}, quick {s3.QUICK_SAMPLES:,})",
    )
    parser.add_argument(
        "--resume-only",
        action="store_true",
        help="only the resume bench (a dump killed at 25, 50 and 75%% of its batches and resumed, against fresh "
        "dumps; loads only the windows dataset)",
    )
    parser.add_argument("--no-resume", action="store_true", help="skip the resume bench")
    parser.add_argument(
        "--casts-only",
        action="store_true",
        help="only the cast checks' cost against a dump of each dataset (quick sizes unless scales are given); "
        "prints, writes no results",
    )
    parser.add_argument(
        "--reader-gb",
        type=float,
        help=f"bytes of each reader bench epoch, in GiB (default {reader.EPOCH_BYTES / 2**30:g}, "
        f"quick {reader.QUICK_EPOCH_BYTES / 2**30:g})",
    )
    parser.add_argument(
        "--results", type=Path, help="where to write the markdown (default bench/RESULTS.md; none with --quick)"
    )
    args = parser.parse_args(argv)
    small = args.quick or args.casts_only
    args.scale_seq = args.scale_seq or (QUICK_SCALE_SEQ if small else DEFAULT_SCALE_SEQ)
    args.scale_rows = args.scale_rows or (QUICK_SCALE_ROWS if small else DEFAULT_SCALE_ROWS)
    args.scale_mixed = args.scale_mixed or (QUICK_SCALE_MIXED if small else DEFAULT_SCALE_MIXED)
    args.blog_seconds = args.blog_seconds or (2.0 if args.quick else 12.0)
    if args.casts_only and (args.reader_only or args.results):
        parser.error("--casts-only prints only: not with --reader-only or --results")
    if args.results is None and not small:
        args.results = HERE / "RESULTS.md"
    if args.reader_only and args.no_reader:
        parser.error("--reader-only and --no-reader exclude each other")
    if args.opening_only and (
        args.no_opening or args.reader_only or args.casts_only or args.scan_only or args.small_only
    ):
        parser.error("--opening-only runs the opening bench alone: not with --no-opening or another --*-only")
    if args.small_only and (args.no_small or args.reader_only or args.casts_only or args.scan_only):
        parser.error("--small-only runs the small batches bench alone: not with --no-small or another --*-only")
    others = (args.reader_only, args.casts_only, args.scan_only, args.small_only, args.opening_only)
    if args.ragged_only and (args.no_ragged or args.stream_only or any(others)):
        parser.error("--ragged-only runs the variable-length bench alone: not with --no-ragged or another --*-only")
    if args.frameworks_only and (args.no_frameworks or args.stream_only or args.ragged_only or any(others)):
        parser.error(
            "--frameworks-only runs the NumPy/JAX/Grain bench alone: not with --no-frameworks or another --*-only"
        )
    if args.stream_only and (args.no_stream or any(others)):
        parser.error("--stream-only runs the EpochStream bench alone: not with --no-stream or another --*-only")
    if args.s3_only and (args.no_s3 or any(others)):
        parser.error("--s3-only runs the S3 bench alone: not with --no-s3 or another --*-only")
    if args.keys_only and (args.no_keys or args.s3_only or args.stream_only or args.ragged_only or any(others)):
        parser.error("--keys-only runs the keys bench alone: not with --no-keys or another --*-only")
    args.s3_samples = args.s3_samples or (s3.QUICK_SAMPLES if args.quick else s3.SAMPLES)
    default = reader.QUICK_EPOCH_BYTES if args.quick else reader.EPOCH_BYTES
    args.reader_bytes = int(args.reader_gb * 2**30) if args.reader_gb else default
    return args


def measure_reader(results: Results, epoch_bytes: int) -> None:
    log(f"reader: two epochs of {epoch_bytes / 2**30:g} GiB (small and large batches), page cache warm")
    started = time.perf_counter()
    results.reader = reader.run(epoch_bytes)
    results.reader_s = time.perf_counter() - started


def reader_only(args: argparse.Namespace) -> None:
    """``--reader-only``: print the reader section; with ``--results``, replace that section of the file."""
    results = Results(quick=args.quick, scales={}, revision=code_revision())
    measure_reader(results, args.reader_bytes)
    section = render_reader(results.reader, quick=args.quick, seconds=results.reader_s, revision=results.revision)
    print(section)
    if args.results:
        old = args.results.read_text(encoding="utf-8") if args.results.exists() else "# pgprefetch bench\n"
        args.results.write_text(splice_reader(old, section), encoding="utf-8")
        log(f"wrote the reader section of {args.results}")


def measure_opening(results: Results) -> None:
    sizes = " and ".join(f"{n:,}" for n in opening.SIZES.values())
    log(f"opening: EpochDataset(...), list_epochs and ls on epochs of {sizes} batches")
    results.opening = opening.run()
    ratios = ", ".join(f"{k.removesuffix('_s')} {v:.2f}x" for k, v in results.opening.ratios().items())
    log(f"  opening: 10^5/100 {ratios} in {results.opening.seconds:.0f} s")


def opening_only(args: argparse.Namespace) -> None:
    """``--opening-only``: print the opening section; with ``--results``, replace that section of the file."""
    results = Results(quick=args.quick, scales={}, revision=code_revision())
    measure_opening(results)
    assert results.opening is not None
    section = opening.render(results.opening, revision=results.revision)
    print(section)
    if args.results:
        old = args.results.read_text(encoding="utf-8") if args.results.exists() else "# pgprefetch bench\n"
        args.results.write_text(splice(old, section, opening.BEGIN, opening.END), encoding="utf-8")
        log(f"wrote the opening section of {args.results}")


def measure_stream(quick: bool) -> stream_bench.StreamResults:
    epoch_bytes = stream_bench.QUICK_EPOCH_BYTES if quick else stream_bench.EPOCH_BYTES
    log(f"stream: EpochStream over {stream_bench.EPOCHS} epochs of {epoch_bytes >> 20} MiB, page cache warm")
    return stream_bench.run(epoch_bytes, 2 if quick else stream_bench.PASSES)


def stream_only(args: argparse.Namespace) -> None:
    """``--stream-only``: print the EpochStream section; with ``--results``, replace that section of the file."""
    section = stream_bench.render(measure_stream(args.quick), revision=code_revision())
    print(section)
    if args.results:
        old = args.results.read_text(encoding="utf-8") if args.results.exists() else "# pgprefetch bench\n"
        args.results.write_text(splice(old, section, stream_bench.BEGIN, stream_bench.END), encoding="utf-8")
        log(f"wrote the EpochStream section of {args.results}")


def measure_frameworks(quick: bool) -> frameworks.FrameworkResults:
    log("frameworks: EpochArrays, EpochDataset now and before, device_batches, Grain; page cache warm")
    sizes = frameworks.QUICK_EPOCH_BYTES if quick else frameworks.EPOCH_BYTES
    return frameworks.run(sizes, 2 if quick else frameworks.PASSES)


def frameworks_only(args: argparse.Namespace) -> None:
    """``--frameworks-only``: print the NumPy/JAX/Grain section; with ``--results``, replace that section."""
    section = frameworks.render(measure_frameworks(args.quick), revision=code_revision())
    print(section)
    if args.results:
        old = args.results.read_text(encoding="utf-8") if args.results.exists() else "# pgprefetch bench\n"
        args.results.write_text(splice(old, section, frameworks.BEGIN, frameworks.END), encoding="utf-8")
        log(f"wrote the NumPy/JAX/Grain section of {args.results}")


def _ragged_sizes(quick: bool) -> tuple[int, int, int]:
    if quick:
        return ragged_bench.QUICK_SAMPLES, 1, 1
    return ragged_bench.SAMPLES, ragged_bench.PASSES, ragged_bench.DUMPS


def ragged_only(args: argparse.Namespace) -> None:
    """``--ragged-only``: print the variable-length section; with ``--results``, replace that section."""
    section = ragged_bench.render(ragged_bench.run(*_ragged_sizes(args.quick)), revision=code_revision())
    print(section)
    if args.results:
        old = args.results.read_text(encoding="utf-8") if args.results.exists() else "# pgprefetch bench\n"
        args.results.write_text(splice(old, section, ragged_bench.BEGIN, ragged_bench.END), encoding="utf-8")
        log(f"wrote the variable-length section of {args.results}")


def measure_small(results: Results, dsn: str, quick: bool) -> None:
    samples = small_bench.QUICK_SAMPLES if quick else small_bench.SAMPLES
    sizes = ", ".join(f"{n:,}" for n in small_bench.SIZES)
    log(f"small batches: {samples:,} rows dumped in batches of {sizes}, {small_bench.ROUNDS} rounds")
    results.small = small_bench.run(dsn, samples=samples)
    ratio, wall = results.small.times(), results.small.times(wall=True)
    seconds = results.small.seconds
    log(f"  small batches: {small_bench.SMALL}/{small_bench.BASE:,} {ratio:.2f}x ({wall:.2f}x wall) in {seconds:.0f} s")


def small_only(args: argparse.Namespace) -> None:
    """``--small-only``: load the rows dataset alone, print the small batches section; with ``--results``, splice it."""
    results = Results(quick=args.quick, scales={"rows": args.scale_rows}, revision=code_revision())
    with server() as admin_dsn, database(admin_dsn) as dsn:
        asyncio.run(load(dsn, results.scales, (ROWS,)))
        measure_small(results, dsn, args.quick)
    assert results.small is not None
    section = small_bench.render(results.small, revision=results.revision)
    print(section)
    if args.results:
        old = args.results.read_text(encoding="utf-8") if args.results.exists() else "# pgprefetch bench\n"
        args.results.write_text(splice(old, section, small_bench.BEGIN, small_bench.END), encoding="utf-8")
        log(f"wrote the small batches section of {args.results}")


def measure_s3(results: Results, dsn: str, args: argparse.Namespace) -> None:
    rounds = s3.QUICK_ROUNDS if args.quick else s3.ROUNDS
    plural = "" if rounds == 1 else "s"
    log(f"s3: {args.s3_samples:,} windows dumped to moto's S3 and to a folder, uploaded, read; {rounds} round{plural}")
    results.s3 = s3.run(dsn, samples=args.s3_samples, rounds=rounds, quick=args.quick)
    r = results.s3
    readers = ", ".join(f"prefetch {p} {r.reader_ratio(p):.2f}x" for p in s3.PREFETCHES)
    log(f"  s3: dump {r.dump_ratio():.2f}x of max(local, upload); reader {readers} of plain GETs; {r.seconds:.0f} s")


def s3_only(args: argparse.Namespace) -> None:
    """``--s3-only``: load the windows dataset alone, print the S3 section; with ``--results``, splice it."""
    scale = s3.QUICK_SCALE if args.quick else max(s3.SCALE, s3.SCALE * args.s3_samples / s3.SAMPLES)
    results = Results(quick=args.quick, scales={"windows": scale}, revision=code_revision())
    with server() as admin_dsn, database(admin_dsn) as dsn:
        asyncio.run(load(dsn, results.scales, (WINDOWS,)))
        measure_s3(results, dsn, args)
    assert results.s3 is not None
    section = s3.render(results.s3, revision=results.revision)
    print(section)
    if args.results:
        old = args.results.read_text(encoding="utf-8") if args.results.exists() else "# pgprefetch bench\n"
        args.results.write_text(splice(old, section, s3.BEGIN, s3.END), encoding="utf-8")
        log(f"wrote the S3 section of {args.results}")


def measure_keys(dsn: str, quick: bool) -> keys_bench.KeysResults:
    n = keys_bench.QUICK_KEYS if quick else keys_bench.KEYS
    budget = keys_bench.QUICK_BUDGET if quick else keys_bench.BUDGET
    log(f"keys: {n:,} and {n * keys_bench.FACTOR:,} keys, under --memory {budget} and in memory")
    return keys_bench.run(dsn, quick=quick, rounds=1 if quick else keys_bench.ROUNDS)


def keys_only(args: argparse.Namespace) -> None:
    """``--keys-only``: an empty database (the keys are generated), the keys section; with ``--results``, splice it."""
    with server() as admin_dsn, database(admin_dsn) as dsn:
        measured = measure_keys(dsn, args.quick)
        scanned = scankeys.run(dsn, quick=args.quick, before=None)
    section = keys_bench.render(measured, revision=code_revision())
    memory = scankeys.QUICK_BUDGET if args.quick else scankeys.BUDGET
    scan_section_text = scankeys.render(scanned, memory, code_revision())
    print(scan_section_text)
    print(section)
    if args.results:
        old = args.results.read_text(encoding="utf-8") if args.results.exists() else "# pgprefetch bench\n"
        text = splice(
            splice(old, section, keys_bench.BEGIN, keys_bench.END), scan_section_text, scankeys.BEGIN, scankeys.END
        )
        args.results.write_text(text, encoding="utf-8")
        log(f"wrote the keys section of {args.results}")


RESUME_SHARE = 0.5  # of the windows dataset: about the epoch (443k windows) at the default scale


def measure_resume(dsn: str, quick: bool) -> resume_bench.ResumeResults:
    share = 1.0 if quick else RESUME_SHARE
    points = ", ".join(f"{k:.0%}" for k in resume_bench.FRACTIONS)
    log(f"resume: {share:.0%} of the windows dumped fresh, and killed at {points} of its batches then resumed")
    return resume_bench.run(WINDOWS, dsn, fraction=share, quick=quick)


def resume_only(args: argparse.Namespace) -> None:
    """``--resume-only``: load the windows dataset alone, print the resume section; with ``--results``, splice it."""
    with server() as admin_dsn, database(admin_dsn) as dsn:
        asyncio.run(load(dsn, {"windows": args.scale_seq}, (WINDOWS,)))
        measured = measure_resume(dsn, args.quick)
    section = resume_bench.render(measured, revision=code_revision())
    print(section)
    if args.results:
        old = args.results.read_text(encoding="utf-8") if args.results.exists() else "# pgprefetch bench\n"
        args.results.write_text(splice(old, section, resume_bench.BEGIN, resume_bench.END), encoding="utf-8")
        log(f"wrote the resume section of {args.results}")


def measure_casts(ds: Dataset, dsn: str, dump: dumprun.DumpRun) -> casts.CastRun:
    log(f"{ds.name}: cast checks, safe against unsafe decodes, {casts.BUDGET_S:g} s budget")
    run = casts.measure(ds, dsn, dump)
    log(f"  {run.line()}")
    return run


def casts_only(args: argparse.Namespace) -> None:
    """``--casts-only``: load, dump each dataset once for the baseline, time the cast checks; print."""
    scales = {"windows": args.scale_seq, "rows": args.scale_rows}
    runs = []
    workdir = Path(tempfile.mkdtemp(prefix="pgpf-bench-stores-"))
    try:
        with server() as admin_dsn, database(admin_dsn) as dsn:
            asyncio.run(load(dsn, scales))
            for ds in (WINDOWS, ROWS):
                dump = dumprun.dump(ds, dsn, workdir)
                log(f"{ds.name} dump: {dump.samples:,} samples in {dump.seconds:.1f} s = {dump.rate:,.0f}/s")
                runs.append(measure_casts(ds, dsn, dump))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    small = WINDOWS.expected(args.scale_seq) < MIN_WINDOWS or ROWS.expected(args.scale_rows) < MIN_ROWS
    print(casts.render_casts(runs, quick=small))


SCANNED = (WINDOWS, MIXED, ROWS)  # the scan section's datasets: two windows shapes and the rows


def measure_scan(dsn: str, workdir: Path, rows: list[Row]) -> scan.ScanResults:
    """The scan mode's figures, beside the query mode's dumps of the same datasets in ``rows``."""
    out = scan.ScanResults()
    for ds in SCANNED:
        query = next((r.dump for r in rows if r.dataset == ds.name and r.transport == LOCAL), None)
        out.rows.append(scan.measure(ds, dsn, workdir, query))
    out.rss = scan.measure_rss(dsn, workdir)
    return out


def scan_section(results: scan.ScanResults, rows: list[Row]) -> list[str]:
    rates = {r.dataset: (r.dump.rate, r.ceiling.rate if r.ceiling else 0.0) for r in rows if r.transport == LOCAL}
    return scan.render(results, rates)


def scan_only(args: argparse.Namespace) -> None:
    """Load the datasets, measure the query dump and row ceiling, then the scan mode; print the section."""
    scales = {"windows": args.scale_seq, "rows": args.scale_rows, "mixed": args.scale_mixed}
    workdir = Path(tempfile.mkdtemp(prefix="pgpf-bench-stores-"))
    try:
        with server() as admin_dsn, database(admin_dsn) as dsn:
            asyncio.run(load(dsn, scales, SCANNED))
            rows = [measure(ds, dsn, workdir, 1.0, LOCAL) for ds in SCANNED]
            results = measure_scan(dsn, workdir, rows)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print("\n".join(scan_section(results, rows)))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.reader_only:
        reader_only(args)
        return
    if args.casts_only:
        casts_only(args)
        return
    if args.scan_only:
        scan_only(args)
        return
    if args.opening_only:
        opening_only(args)
        return
    if args.small_only:
        small_only(args)
        return
    if args.stream_only:
        stream_only(args)
        return
    if args.frameworks_only:
        frameworks_only(args)
        return
    if args.ragged_only:
        ragged_only(args)
        return
    if args.s3_only:
        s3_only(args)
        return
    if args.keys_only:
        keys_only(args)
        return
    if args.resume_only:
        resume_only(args)
        return
    scales = {"windows": args.scale_seq, "rows": args.scale_rows}
    if not args.no_scan:
        scales["mixed"] = args.scale_mixed
    small = WINDOWS.expected(args.scale_seq) < MIN_WINDOWS or ROWS.expected(args.scale_rows) < MIN_ROWS
    if small and not args.quick:
        log(f"warning: below the issue's sizes ({MIN_WINDOWS:,} windows, {MIN_ROWS:,} rows)")
    results = Results(
        quick=args.quick, scales=scales, delay_ms=args.delay_ms, started=utc_now(), revision=code_revision()
    )
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="pgpf-bench-stores-"))
    scan_results = scan.ScanResults()
    scanned: list[Row] = []  # the query-mode rows of datasets only the scan section shows (mixed)
    keyed = resumed = None
    scan_keyed: list[scankeys.ScanRun] = []
    try:
        with server() as admin_dsn, database(admin_dsn) as dsn:
            _, results.server_version = asyncio.run(load(dsn, scales, SCANNED if not args.no_scan else (WINDOWS, ROWS)))
            results.setup_s = time.perf_counter() - started
            for ds in (WINDOWS, ROWS):
                results.rows.append(measure(ds, dsn, workdir, args.blog_seconds, LOCAL))
                results.casts.append(measure_casts(ds, dsn, results.rows[-1].dump))
            if not args.no_scan:
                scanned = [measure(MIXED, dsn, workdir, args.blog_seconds, LOCAL)]
                scan_results = measure_scan(dsn, workdir, results.rows + scanned)
            for label, fraction in (("1x", 0.25), ("4x", 1.0)):
                run = dumprun.dump(ROWS, dsn, workdir, fraction=fraction, measure_rss=True)
                log(f"rss {label}: {run.samples:,} samples, peak RSS {run.max_rss / 2**20:,.1f} MiB")
                results.rss.append((label, fraction, run))
            if not args.no_small:
                measure_small(results, dsn, args.quick)
            if not args.no_s3:
                measure_s3(results, dsn, args)
            if not args.no_keys:
                keyed = measure_keys(dsn, args.quick)
                scan_keyed = scankeys.run(dsn, quick=args.quick, before=None)
            if not args.no_resume:
                resumed = measure_resume(dsn, args.quick)
            if not args.no_proxy:
                with proxy(dsn, args.delay_ms) as slow_dsn:
                    results.rtt_ms["direct"] = asyncio.run(contenders.round_trip_ms(dsn))
                    results.rtt_ms["proxy"] = asyncio.run(contenders.round_trip_ms(slow_dsn))
                    direct, proxied = results.rtt_ms["direct"], results.rtt_ms["proxy"]
                    log(f"round trip: {direct:.3f} ms direct, {proxied:.3f} ms proxied")
                    transport = f"TCP proxy +{args.delay_ms:g} ms each way"
                    for ds in (WINDOWS, ROWS):
                        results.rows.append(
                            measure(ds, slow_dsn, workdir, args.blog_seconds, transport, args.proxy_ceiling)
                        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if not args.no_reader:  # after the server is gone: nothing else runs on the two cores
        measure_reader(results, args.reader_bytes)
    if not args.no_opening:
        measure_opening(results)
    streamed = None if args.no_stream else measure_stream(args.quick)
    padded = None if args.no_ragged else ragged_bench.run(*_ragged_sizes(args.quick))
    readers = None if args.no_frameworks else measure_frameworks(args.quick)
    results.total_s = time.perf_counter() - started
    text = render(results)
    if not args.no_scan:
        text = text.rstrip("\n") + "\n\n" + "\n".join(scan_section(scan_results, results.rows + scanned)) + "\n"
    if streamed is not None:
        text = text.rstrip("\n") + "\n\n" + stream_bench.render(streamed, revision=results.revision) + "\n"
    if padded is not None:
        text = text.rstrip("\n") + "\n\n" + ragged_bench.render(padded, revision=results.revision) + "\n"
    if readers is not None:
        text = text.rstrip("\n") + "\n\n" + frameworks.render(readers, revision=results.revision) + "\n"
    if keyed is not None:
        text = text.rstrip("\n") + "\n\n" + keys_bench.render(keyed, revision=results.revision) + "\n"
        memory = scankeys.QUICK_BUDGET if args.quick else scankeys.BUDGET
        text = text.rstrip("\n") + "\n\n" + scankeys.render(scan_keyed, memory, results.revision) + "\n"
    if resumed is not None:
        text = text.rstrip("\n") + "\n\n" + resume_bench.render(resumed, revision=results.revision) + "\n"
    print(text)
    if args.results:
        args.results.write_text(text, encoding="utf-8")
        log(f"wrote {args.results}")


if __name__ == "__main__":
    main()
