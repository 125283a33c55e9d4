"""The S3 benchmark: dumping to and reading from S3 against plain obstore calls on the same bytes (issue #10).

Against moto's S3 server on 127.0.0.1, in a process of its own (so that its Python shares no GIL with the
contenders). One epoch of the windows dataset, the first ``SAMPLES`` windows of ``train_samples`` copied into
a table of their own (untimed), uncompressed, in batches of 256:

- *local dump*: ``pgprefetch dump`` to a local folder, as a whole process (:func:`bench.dumprun.dump`);
- *S3 dump*: the same to ``s3://bucket/prefix`` (staging in a temp folder, ``PGPREFETCH_STAGING``);
- *plain upload*: the local epoch's files, each read whole and sent by one ``obstore.put(...,
  use_multipart=False)``, from a thread pool of ``UPLOAD_THREADS`` (the dump's own width);
- *EpochDataset*: ``iter(EpochDataset("s3://...", 0, prefetch=p))`` to the end (opening it is not timed);
- *plain GETs*: one ``obstore.get_range`` per array of each batch (the byte ranges the reader fetches, from the
  arrays' ``zarr.json``), into a new numpy array, a batch per task on a thread pool of ``p``;
- *per rank*: ``EpochDataset(..., rank=r, world_size=2).bytes_fetched`` after a whole pass, each batch checked
  equal to the local epoch's.

Dumps and the upload take turns in rounds (the order reversed from one round to the next), then the reads
(their order rotated): the median of the rounds. Every S3 epoch's data objects must equal the local epoch's
files byte for byte, or the part fails. moto's own CPU time is read from ``/proc`` around each measurement.

The epoch's size is set by moto: a ranged GET there reads the whole object (``FakeKey.value``), which costs
~2 ms up to ~24 MiB and ~40 ms at 64 MiB (a new 64 MiB ``bytes`` each time), so each array is kept to one
shard file of ~23 MiB.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any

import asyncpg
import numpy as np

from tests.harness.s3 import environment, moto_process

from . import dumprun, log
from .datasets import CONNECTIONS, WINDOWS, Dataset

SAMPLES = 48_000  # windows: 187 batches of 256; x and y 23.4 MiB each, one shard file each; 49 MB in all
QUICK_SAMPLES = 3_800  # the quick scale loads 3,856
SCALE = 1.25  # the windows dataset's scale --s3-only loads: 48,200 train windows
QUICK_SCALE = 0.1
ROUNDS = 3
QUICK_ROUNDS = 1
PREFETCHES = (4, 8)  # EpochDataset's default, and twice it
WORLD_SIZE = 2
TABLE = "s3_samples"
BUCKET = "pgprefetch-bench"
EPOCH_DIR = "epoch-00000"
TARGET_DUMP = 1.2
TARGET_READER = 0.8
BEGIN = "<!-- s3 bench: begin -->"
END = "<!-- s3 bench: end -->"

LOCAL_DUMP, S3_DUMP, UPLOAD = "local dump", "S3 dump", "plain upload"
READER, PLAIN = "EpochDataset", "plain GETs"


@dataclass(frozen=True)
class Moto:
    """A running moto server: its process and the environment that points pgprefetch and obstore at it."""

    pid: int
    endpoint: str
    env: dict[str, str]

    def cpu(self) -> float:
        """Seconds of CPU the server process has used (user + system, all its threads)."""
        with open(f"/proc/{self.pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def moto_server() -> Iterator[Moto]:
    """moto in a process of its own (the tests' harness starts it), and the bench's credentials for it."""
    with moto_process() as (pid, endpoint):
        env = {
            "AWS_ACCESS_KEY_ID": "AKIABENCHPGPREFETCH",
            "AWS_SECRET_ACCESS_KEY": "bench-secret",
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
        }
        yield Moto(pid, endpoint, env)


def client(prefix: str | None = None) -> Any:
    import obstore.store

    return obstore.store.S3Store(BUCKET, prefix=prefix, client_options={"allow_http": True})


def objects(store: Any, prefix: str) -> dict[str, int]:
    """Every object under ``prefix``: key -> size."""
    import obstore

    return {m["path"]: int(m["size"]) for chunk in obstore.list(store, prefix) for m in chunk}


def remove(store: Any, prefix: str) -> None:
    import obstore

    keys = list(objects(store, prefix))
    for i in range(0, len(keys), 1000):
        obstore.delete(store, keys[i : i + 1000])


def local_files(epoch: Path) -> dict[str, Path]:
    """Every file of a local epoch but its group ``zarr.json`` (the manifest), by relative path."""
    return {p.relative_to(epoch).as_posix(): p for p in sorted(epoch.rglob("*")) if p.is_file() and p.parent != epoch}


def check_same_bytes(store: Any, prefix: str, epoch: Path) -> int:
    """The S3 epoch's data objects equal the local epoch's files byte for byte; return their bytes."""
    import obstore

    top = f"{prefix}/{EPOCH_DIR}/"
    remote = {k.removeprefix(top): n for k, n in objects(store, top).items() if "/" in k.removeprefix(top)}
    local = local_files(epoch)
    if sorted(remote) != sorted(local):
        raise RuntimeError(f"s3: {prefix} holds {sorted(remote)}, the local epoch {sorted(local)}")
    for name, path in local.items():
        if bytes(obstore.get(store, top + name).bytes()) != path.read_bytes():
            raise RuntimeError(f"s3: {top}{name} differs from the local epoch's file")
    return sum(remote.values())


@dataclass
class Case:
    """One contender: wall seconds, the dump's own seconds, and CPU seconds of moto and of the client, per round."""

    label: str
    wall_s: list[float] = field(default_factory=list)
    own_s: list[float] = field(default_factory=list)  # dumps: the seconds the dump reports
    server_cpu_s: list[float] = field(default_factory=list)
    client_cpu_s: list[float] = field(default_factory=list)
    nbytes: int = 0  # bytes moved per round

    @property
    def seconds(self) -> float:
        return statistics.median(self.wall_s)

    @property
    def mbs(self) -> float:
        return self.nbytes / self.seconds / 1e6

    def cpu(self, what: str) -> float:
        """Median CPU seconds of ``server`` or ``client``."""
        return statistics.median(getattr(self, f"{what}_cpu_s"))


@dataclass
class RankRun:
    rank: int
    batches: int
    bytes_fetched: int
    share_bytes: int  # its batches times the bytes of one batch of every field


@dataclass
class S3Results:
    samples: int = 0
    batches: int = 0
    epoch_bytes: int = 0  # the epoch's data objects ("/c/" keys: every array's chunks or shards)
    files: int = 0  # the epoch's objects but its group zarr.json
    shards: dict[str, int] = field(default_factory=dict)  # shard files of each array
    dumps: dict[str, Case] = field(default_factory=dict)
    reads: dict[tuple[str, int], Case] = field(default_factory=dict)
    ranks: list[RankRun] = field(default_factory=list)
    open_s: float = 0.0  # median EpochDataset(...) construction, over S3
    rounds: int = 0
    checked: int = 0  # S3 epochs found equal to the local one, byte for byte
    quick: bool = False
    seconds: float = 0.0

    def dump_ratio(self) -> float:
        """The S3 dump's wall time over the larger of the local dump's and the plain upload's."""
        base = max(self.dumps[LOCAL_DUMP].seconds, self.dumps[UPLOAD].seconds)
        return self.dumps[S3_DUMP].seconds / base

    def reader_ratio(self, prefetch: int) -> float:
        """EpochDataset's MB/s over the plain GETs', at the same concurrency."""
        return self.reads[(READER, prefetch)].mbs / self.reads[(PLAIN, prefetch)].mbs


async def prepare(dsn: str, samples: int) -> int:
    """(Re)create ``TABLE``: the first ``samples`` windows of ``train_samples``; return its row count."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        await conn.execute(
            f"CREATE TABLE {TABLE} AS SELECT series_id, start_t FROM train_samples "
            f"ORDER BY series_id, start_t LIMIT {int(samples)}"
        )
        await conn.execute(f"VACUUM (FREEZE, ANALYZE) {TABLE}")
        return int(await conn.fetchval(f"SELECT count(*) FROM {TABLE}"))
    finally:
        await conn.close()


def dataset() -> Dataset:
    return dataclasses.replace(WINDOWS, name="windows-s3", keys=f"SELECT series_id, start_t FROM {TABLE}")


def measured(case: Case, moto: Moto, call: Callable[[], Any], *, child: bool = False) -> Any:
    """Run ``call``, recording its wall seconds and moto's and the client's CPU seconds into ``case``."""
    usage = resource.RUSAGE_CHILDREN if child else resource.RUSAGE_SELF
    before = resource.getrusage(usage)
    server = moto.cpu()
    started = time.perf_counter()
    result = call()
    case.wall_s.append(time.perf_counter() - started)
    case.server_cpu_s.append(moto.cpu() - server)
    after = resource.getrusage(usage)
    case.client_cpu_s.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return result


def upload(store: Any, epoch: Path, prefix: str, threads: int) -> None:
    """Every file of the local epoch to ``prefix/epoch-00000/...``, one PUT each, ``threads`` at a time."""
    import obstore

    def put(path: Path) -> None:
        key = f"{prefix}/{EPOCH_DIR}/{path.relative_to(epoch).as_posix()}"
        obstore.put(store, key, path.read_bytes(), use_multipart=False)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, sorted(p for p in epoch.rglob("*") if p.is_file())))


Ranges = list[list[tuple[str, int, int, np.dtype, tuple[int, ...]]]]


def batch_ranges(epoch: Path, names: tuple[str, ...]) -> Ranges:
    """Per batch, per array: the object key (under the store's prefix), offset, length, dtype and batch shape."""
    from pgprefetch.store.layout import ArrayLayout

    layouts = []
    for name in names:
        meta = json.loads((epoch / name / "zarr.json").read_text())
        layout = ArrayLayout.parse(meta, PurePosixPath(EPOCH_DIR, name))
        if not layout.raw:
            raise RuntimeError(f"s3: array {name} is not raw: the plain GETs read raw batches")
        layouts.append(layout)
    out: Ranges = []
    for g in range(layouts[0].n_batches):
        batch = []
        for layout in layouts:
            key, slot = layout.file(g)
            batch.append((str(key), slot * layout.batch_bytes, layout.batch_bytes, layout.dtype, layout.batch_shape))
        out.append(batch)
    return out


def plain_gets(store: Any, ranges: Ranges, threads: int) -> int:
    """One ranged GET per array of each batch into a new numpy array, a batch per task; return the bytes."""
    import obstore

    def fetch(batch: list[tuple[str, int, int, np.dtype, tuple[int, ...]]]) -> int:
        n = 0
        for key, start, length, dtype, shape in batch:
            raw = np.frombuffer(obstore.get_range(store, key, start=start, length=length), dtype=np.uint8)
            if raw.size != length:
                raise RuntimeError(f"s3: {key} ended early")
            out = np.empty(shape, dtype=dtype)
            out.reshape(-1).view(np.uint8)[:] = raw
            n += out.nbytes
        return n

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(fetch, ranges))


def iterate(ds: Any) -> int:
    """Every batch of ``ds``, dropped as it comes; return the bytes it fetched."""
    n = sum(1 for _ in ds)
    if n != len(ds):
        raise RuntimeError(f"s3: EpochDataset handed out {n} batches of {len(ds)}")
    return int(ds.bytes_fetched)


def per_rank(url: str, local_store: Path) -> list[RankRun]:
    """Each of ``WORLD_SIZE`` ranks reads its share: every batch equal to the local epoch's, and its bytes."""
    import torch

    from pgprefetch import EpochDataset

    out = []
    for rank in range(WORLD_SIZE):
        remote = EpochDataset(url, 0, rank=rank, world_size=WORLD_SIZE, consumer=None)
        local = EpochDataset(local_store, 0, rank=rank, world_size=WORLD_SIZE, consumer=None)
        for i, (a, b) in enumerate(zip(remote, local, strict=True)):
            if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
                raise RuntimeError(f"s3: rank {rank} batch {i} over S3 differs from the local epoch's")
        one = sum(int(np.prod(t.shape)) * t.element_size() for t in local[0].values())
        out.append(RankRun(rank, len(remote), remote.bytes_fetched, len(remote) * one))
    return out


def run(dsn: str, *, samples: int = SAMPLES, rounds: int = ROUNDS, quick: bool = False) -> S3Results:
    """Make the table, start moto, dump and upload ``rounds`` times, read ``rounds`` times, check the bytes."""
    import boto3

    from pgprefetch import EpochDataset
    from pgprefetch.store.uploads import UPLOAD_THREADS

    started = time.perf_counter()
    results = S3Results(quick=quick, rounds=rounds)
    results.samples = asyncio.run(prepare(dsn, samples))
    if results.samples < samples:
        log(f"s3: warning: only {results.samples:,} train windows loaded, fewer than {samples:,}")
    ds = dataset()
    workdir = Path(tempfile.mkdtemp(prefix="pgpf-bench-s3-"))
    try:
        with moto_server() as moto, environment(moto.env):
            boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
            env = {**os.environ, "PGPREFETCH_STAGING": str(workdir / "staging")}
            bucket = client()
            reference = workdir / "local-0"  # the first round's local epoch: what every S3 epoch must equal
            for case in (LOCAL_DUMP, S3_DUMP, UPLOAD):
                results.dumps[case] = Case(case)

            def local_dump(r: int) -> dumprun.DumpRun:
                text = ds.config(workdir / f"local-{r}")
                return dumprun.dump(ds, dsn, workdir, config=text, env=env, keep_store=True)

            def s3_dump(r: int) -> dumprun.DumpRun:
                text = ds.config(f"s3://{BUCKET}/dump-{r}")
                return dumprun.dump(ds, dsn, workdir, config=text, env=env, keep_store=True)  # nothing local to remove

            def plain_upload(r: int) -> None:
                upload(bucket, reference / EPOCH_DIR, f"upload-{r}", UPLOAD_THREADS)

            steps: list[tuple[str, Callable[[int], dumprun.DumpRun | None]]] = [
                (LOCAL_DUMP, local_dump),
                (S3_DUMP, s3_dump),
                (UPLOAD, plain_upload),
            ]
            for r in range(rounds):
                for name, step in steps if r % 2 == 0 else steps[::-1]:
                    case = results.dumps[name]
                    got = measured(case, moto, partial(step, r), child=name != UPLOAD)
                    if got is not None:
                        case.own_s.append(got.dump_seconds)
                        results.samples = got.samples
                    log(f"  round {r + 1}: {name} {case.wall_s[-1]:.2f} s")
                results.dumps[UPLOAD].nbytes = check_same_bytes(bucket, f"upload-{r}", reference / EPOCH_DIR)
                check_same_bytes(bucket, f"dump-{r}", reference / EPOCH_DIR)
                results.checked += 1
                remove(bucket, f"upload-{r}")
                if r > 0:
                    remove(bucket, f"dump-{r}")
                    shutil.rmtree(workdir / f"local-{r}", ignore_errors=True)
            log(f"  every S3 epoch's data objects equal the local epoch's files ({results.checked} checked)")
            epoch = reference / EPOCH_DIR
            files = local_files(epoch)
            results.files = len(files)
            results.epoch_bytes = sum(p.stat().st_size for k, p in files.items() if "/c/" in k)
            manifest = json.loads((epoch / "zarr.json").read_text())["attributes"]["pgprefetch"]
            results.batches = int(manifest["n_batches"])
            fields = tuple(manifest["fields"])
            for name in (*fields, "keys"):
                results.shards[name] = sum(1 for k in files if k.startswith(f"{name}/c/"))
            url = f"s3://{BUCKET}/dump-0"
            ranges = batch_ranges(epoch, fields)
            variants = [(who, p) for p in PREFETCHES for who in (READER, PLAIN)]
            opens = []
            for r in range(rounds):
                shift = r % len(variants)
                for who, p in variants[shift:] + variants[:shift]:
                    case = results.reads.setdefault((who, p), Case(f"{who} {p}"))
                    if who == READER:
                        started_open = time.perf_counter()
                        reader = EpochDataset(url, 0, consumer=None, prefetch=p)
                        opens.append(time.perf_counter() - started_open)
                        nbytes = measured(case, moto, partial(iterate, reader))
                    else:
                        plain = client(prefix="dump-0")
                        nbytes = measured(case, moto, partial(plain_gets, plain, ranges, p))
                    if case.nbytes and nbytes != case.nbytes:
                        raise RuntimeError(f"s3: {case.label} moved {nbytes:,} bytes, before {case.nbytes:,}")
                    case.nbytes = nbytes
                    log(f"  round {r + 1}: {case.label}: {nbytes / case.wall_s[-1] / 1e6:,.0f} MB/s")
            if results.reads[(READER, PREFETCHES[0])].nbytes != results.reads[(PLAIN, PREFETCHES[0])].nbytes:
                raise RuntimeError("s3: EpochDataset and the plain GETs did not fetch the same bytes")
            results.open_s = statistics.median(opens)
            results.ranks = per_rank(url, reference)
            for rank in results.ranks:
                log(f"  rank {rank.rank}: {rank.bytes_fetched:,} bytes fetched, {rank.share_bytes:,} its share")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results.seconds = time.perf_counter() - started
    return results


def render(results: S3Results, *, revision: str = "") -> str:
    """The S3 section, between markers so that ``--s3-only`` can replace it in RESULTS.md."""
    from pgprefetch.store.uploads import UPLOAD_THREADS

    from .machine import code_revision, cpu_model, times

    mb = results.epoch_bytes / 1e6
    shards = ", ".join(f"`{k}` {v}" for k, v in results.shards.items())
    out = [BEGIN, "## S3: dumping to and reading from moto's S3 server against plain obstore calls", ""]
    if results.quick:
        out += ["**`--quick` smoke run: sizes too small to be representative.**", ""]
    out += [
        f"One epoch of {results.samples:,} windows of the windows dataset ({results.batches} batches of 256, "
        f"uncompressed; {mb:,.1f} MB of data objects in {results.files} objects; shard files per array: {shards}), "
        f"against moto's S3 server (moto {_version('moto')}, obstore {_version('obstore')}) on 127.0.0.1 in a "
        f"process of its own. {_plural(results.rounds, 'round')}, the median; in each, the three writers in turns (the "
        "order reversed from one round to the next), then the four reads (the order rotated). "
        "*local dump* and *S3 dump*: `pgprefetch dump` as a whole process, wall time (the dump's own reported "
        f"seconds beside it), {CONNECTIONS} connections; the S3 dump stages in a temp folder and uploads each "
        f"shard file as soon as its last batch is written, {UPLOAD_THREADS} at a time, the epoch's `zarr.json` "
        f"last. *plain upload*: the local epoch's files, each read whole and sent by one `obstore.put(..., "
        f"use_multipart=False)`, from a pool of {UPLOAD_THREADS} threads. *EpochDataset p*: "
        '`iter(EpochDataset("s3://...", 0, prefetch=p))` to the end (opening it, '
        f"{results.open_s * 1e3:.0f} ms, not timed); *plain GETs p*: one `obstore.get_range` per field of each "
        "batch (the ranges the reader fetches, from the arrays' `zarr.json`), into a new numpy array, a batch per "
        f"task on a pool of p threads. *moto CPU*: the server process's CPU seconds over the wall time (100% = "
        "one core; its Python holds one GIL). *client CPU*: the dump process's, or this process's. "
        f"{'Every' if results.checked else 'No'} S3 epoch's data objects were checked equal to the local epoch's "
        f"files, byte for byte ({_plural(results.checked, 'epoch')}); the per-rank passes checked every batch "
        "against the local epoch's.",
        "",
        "| writer | wall s | dump's own s | MB/s | vs local dump | moto CPU | client CPU s |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    local = results.dumps[LOCAL_DUMP].seconds
    for case in results.dumps.values():
        own = f"{statistics.median(case.own_s):.2f}" if case.own_s else "—"
        out.append(
            f"| {case.label} | {case.seconds:.2f} | {own} | {results.epoch_bytes / case.seconds / 1e6:,.0f} "
            f"| {times(case.seconds / local)} | {case.cpu('server') / case.seconds:.0%} | {case.cpu('client'):.2f} |"
        )
    out += [
        "",
        "| reader | s | MB/s | vs plain GETs | moto CPU | client CPU s |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for (who, p), case in results.reads.items():
        vs = times(results.reader_ratio(p)) if who == READER else "—"
        out.append(
            f"| {case.label} | {case.seconds:.2f} | {case.mbs:,.0f} | {vs} | {case.cpu('server') / case.seconds:.0%} "
            f"| {case.cpu('client'):.2f} |"
        )
    out += [
        "",
        f"| rank of {WORLD_SIZE} | batches | bytes fetched | epoch bytes / {WORLD_SIZE} | ratio | its batches' field "
        "bytes | ratio |",
        "|--:|--:|--:|--:|--:|--:|--:|",
    ]
    half = results.epoch_bytes / WORLD_SIZE
    for rank in results.ranks:
        out.append(
            f"| {rank.rank} | {rank.batches} | {rank.bytes_fetched:,} | {half:,.0f} "
            f"| {times(rank.bytes_fetched / half)} "
            f"| {rank.share_bytes:,} | {times(rank.bytes_fetched / rank.share_bytes)} |"
        )
    ratio = results.dump_ratio()
    upload, s3 = results.dumps[UPLOAD].seconds, results.dumps[S3_DUMP].seconds
    out += ["", "Targets (not meaningful at `--quick` sizes):" if results.quick else "Targets:", ""]
    out.append(
        f"- S3 dump / max(local dump, plain upload) = {s3:.2f} / {max(local, upload):.2f} s = {times(ratio)} "
        f"<= {TARGET_DUMP:g}x: {'PASS' if ratio <= TARGET_DUMP else 'FAIL'}"
    )
    for p in PREFETCHES:
        r = results.reader_ratio(p)
        default = " (the default)" if p == PREFETCHES[0] else ""
        out.append(
            f"- EpochDataset prefetch {p}{default} / plain GETs {p} = {times(r)} >= {TARGET_READER:g}x: "
            f"{'PASS' if r >= TARGET_READER else 'FAIL'}"
        )
    exact = all(r.bytes_fetched == r.share_bytes for r in results.ranks)
    out.append(
        f"- bytes fetched per rank: {'exactly' if exact else 'not exactly'} its batches' field bytes "
        f"({', '.join(times(r.bytes_fetched / half) for r in results.ranks)} of epoch bytes / {WORLD_SIZE}; the keys "
        "and checksums arrays and the shard indexes are not read) (no target)"
    )
    if results.shards and max(results.shards.values()) == 1:
        walls = results.dumps[LOCAL_DUMP].wall_s
        out += [
            "",
            "Every array is one shard file at this size, so none of the S3 dump's uploads can start before its last "
            "batch is written: this epoch cannot show the upload overlapping the fetching, and what the S3 dump "
            f"adds is the upload's own time (the plain upload's {upload:.2f} s, {times(upload / local)} of the local "
            f"dump), against rounds of the local dump that ranged over {min(walls):.2f}-{max(walls):.2f} s.",
        ]
    out += [
        "",
        "Caveat: moto is not S3. It is a Python server on the same two cores as the client, holding one GIL: "
        "every request costs it milliseconds of CPU (its *moto CPU* near 100% means it was the bottleneck), and "
        "a ranged GET reads the whole object on the server. S3 has ~10-30 ms to a first byte and serves many "
        "connections in parallel, so on S3 more requests in flight pay off where here they only queue. The "
        "ratios compare pgprefetch with a plain client of the same library on the same server, not with S3's "
        "throughput or latency.",
        "",
        f"S3 bench: {os.cpu_count()} x {cpu_model()}, Python {platform.python_version()}, "
        f"pgprefetch {revision or code_revision()}; {results.seconds:.0f} s including making the table.",
        END,
    ]
    return "\n".join(out)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"
