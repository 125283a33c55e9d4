"""``python -m bench.scale``: the Ray executor (#25) at 1, 2, 4 and 8 workers, and what it costs on one host.

One table, a query mode config and its scan mode twin (``--modes``); every figure is an epoch's samples/s as
the dump reports it (keys query, or the table's read, included). Each mode dumps epoch 0 to warm up (the
cluster's workers start and import pgprefetch, the table's pages come into the cache), then epoch 1 in a
dump of its own, so that a scan epoch pays for its read. Each worker count gets a Ray cluster of its own on
this host (``ray.init(num_cpus=W)``) and the epoch in ``W`` parts; the single process dumps the same epochs
with the same ``connections`` per process. Ratios are to one worker, and to the single process (the
executor's overhead: at 2 workers on a 2-core machine it cannot show a speed-up, only what spreading costs).

Run it on a large host with ``PGPREFETCH_BENCH_DSN`` pointing at a PostgreSQL with cores to spare; on this
2-core machine ``--workers 1,2 --samples 100000`` (``make bench`` runs that; figures in docs/many-machines.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

import pgprefetch

from . import log
from .postgres import database, server

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before Ray is imported: bind to 127.0.0.1
LENGTH = 16  # int4 array elements per sample
SIZE = 256
CONNECTIONS = 2  # per process: the single one, and each part


def config(store: Path, dsn: str, mode: str = "query") -> dict[str, Any]:
    samples = {"keys": "SELECT id FROM t", "query": "SELECT v, arr FROM t WHERE id = $1"}
    if mode == "scan":  # the same samples, the table read once
        samples = {"table": "t", "key": ["id"]}
    return {
        "source": {"dsn": dsn, "connections": CONNECTIONS},
        "samples": samples,
        "fields": {"v": {"columns": ["v"], "dtype": "float32"},
                   "arr": {"columns": ["arr"], "dtype": "int32", "max_length": LENGTH}},
        "batches": {"size": SIZE, "seed": 0},
        "store": {"path": str(store)},
    }  # fmt: skip


async def load(dsn: str, samples: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v real NOT NULL, arr int4[] NOT NULL)")
        await conn.execute(
            f"INSERT INTO t SELECT i, i * 0.5, array_fill(i % 100, ARRAY[{LENGTH}]) FROM generate_series(1, $1) i",
            samples,
        )
        await conn.execute("ANALYZE t")
    finally:
        await conn.close()


def rate(cfg: dict[str, Any], **kwargs: Any) -> float:
    """Samples/s of epoch 1, after epoch 0 warmed up the workers (and the table's pages).

    Two dumps, not one of ``epochs=[0, 1]``: in scan mode that would cut epoch 1 from epoch 0's read.
    """
    pgprefetch.dump(cfg, epochs=0, **kwargs)
    (result,) = pgprefetch.dump(cfg, epochs=1, **kwargs)
    return result.samples_per_s


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8", help="worker counts, comma separated")
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--modes", default="query,scan", help="query, scan or both, comma separated")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    modes = args.modes.split(",")
    import ray  # only here: `python -m bench` does not need it

    folder = Path(tempfile.mkdtemp(prefix="pgpf-scale-"))
    os.environ["RAY_TMPDIR"] = str(folder)  # a cluster of its own, whatever /tmp/ray holds
    out: dict[str, Any] = {"samples": args.samples, "connections_per_process": CONNECTIONS, "cpus": os.cpu_count()}
    try:
        with server() as admin, database(admin) as dsn:
            log(f"loading {args.samples:,} samples", "scale")
            asyncio.run(load(dsn, args.samples))
            for mode in modes:
                figures: dict[str, Any] = {
                    "single_process": round(rate(config(folder / f"{mode}-single", dsn, mode)), 1)
                }
                log(f"{mode}, single process: {figures['single_process']:,.0f} samples/s", "scale")
                figures["ray"] = {}
                for w in workers:
                    ray.init(num_cpus=w, include_dashboard=False, logging_level="WARNING")
                    try:
                        started = time.monotonic()
                        cfg = config(folder / f"{mode}-ray{w}", dsn, mode)
                        figures["ray"][w] = round(rate(cfg, executor="ray", parts=w), 1)
                    finally:
                        ray.shutdown()
                    took = time.monotonic() - started
                    log(f"{mode}, ray, {w} workers: {figures['ray'][w]:,.0f} samples/s ({took:.1f} s)", "scale")
                one = figures["ray"].get(1) or figures["single_process"]
                figures["ratio_to_one_worker"] = {w: round(r / one, 2) for w, r in figures["ray"].items()}
                single = figures["single_process"]
                figures["ratio_to_single_process"] = {w: round(r / single, 2) for w, r in figures["ray"].items()}
                out[mode] = figures
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if args.json:
        print(json.dumps(out))
    else:
        for mode in modes:
            figures = out[mode]
            print(f"{mode:<5} single process: {figures['single_process']:>10,.0f} samples/s")
            for w, r in figures["ray"].items():
                one, single = figures["ratio_to_one_worker"][w], figures["ratio_to_single_process"][w]
                print(f"{mode:<5} ray {w:>2} workers: {r:>10,.0f} samples/s  {one:.2f}x one worker  "
                      f"{single:.2f}x the single process")  # fmt: skip
    return out


if __name__ == "__main__":
    main()
