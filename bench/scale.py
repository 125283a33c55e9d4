"""``python -m bench.scale``: the Ray executor (#25) at 1, 2, 4 and 8 workers, and what it costs on one host.

One table, one query mode config; every figure is an epoch's samples/s as the dump reports it (keys
query included), the second epoch of each run, so that the cluster's workers have started and imported
pgprefetch. Each worker count gets a Ray cluster of its own on this host (``ray.init(num_cpus=W)``) and
the epoch in ``W`` parts; the single process dumps the same epochs with the same ``connections`` per
process. Ratios are to one worker, and to the single process (the executor's overhead: at 2 workers on a
2-core machine it cannot show a speed-up, only what spreading costs). Scan mode is not spread yet
(``--executor ray`` refuses it), so only query mode is measured.

Run it on a large host with ``PGPREFETCH_BENCH_DSN`` pointing at a PostgreSQL with cores to spare; on this
2-core machine ``--workers 1,2 --samples 100000`` (the figures in docs/many-machines.md).
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


def config(store: Path, dsn: str) -> dict[str, Any]:
    return {
        "source": {"dsn": dsn, "connections": CONNECTIONS},
        "samples": {"keys": "SELECT id FROM t", "query": "SELECT v, arr FROM t WHERE id = $1"},
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
    """Samples/s of epoch 1, after epoch 0 warmed up the workers (and the table's pages)."""
    results = pgprefetch.dump(cfg, epochs=[0, 1], **kwargs)
    return results[1].samples_per_s


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8", help="worker counts, comma separated")
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    workers = [int(w) for w in args.workers.split(",")]
    import ray  # only here: `python -m bench` does not need it

    folder = Path(tempfile.mkdtemp(prefix="pgpf-scale-"))
    os.environ["RAY_TMPDIR"] = str(folder)  # a cluster of its own, whatever /tmp/ray holds
    out: dict[str, Any] = {"samples": args.samples, "connections_per_process": CONNECTIONS, "cpus": os.cpu_count()}
    try:
        with server() as admin, database(admin) as dsn:
            log(f"loading {args.samples:,} samples", "scale")
            asyncio.run(load(dsn, args.samples))
            out["single_process"] = round(rate(config(folder / "single", dsn)), 1)
            log(f"single process: {out['single_process']:,.0f} samples/s", "scale")
            out["ray"] = {}
            for w in workers:
                ray.init(num_cpus=w, include_dashboard=False, logging_level="WARNING")
                try:
                    started = time.monotonic()
                    out["ray"][w] = round(rate(config(folder / f"ray{w}", dsn), executor="ray", parts=w), 1)
                finally:
                    ray.shutdown()
                log(f"ray, {w} workers: {out['ray'][w]:,.0f} samples/s ({time.monotonic() - started:.1f} s)", "scale")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    one = out["ray"].get(1) or out["single_process"]
    out["ratio_to_one_worker"] = {w: round(r / one, 2) for w, r in out["ray"].items()}
    out["ratio_to_single_process"] = {w: round(r / out["single_process"], 2) for w, r in out["ray"].items()}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"single process: {out['single_process']:>10,.0f} samples/s")
        for w, r in out["ray"].items():
            print(f"ray {w:>2} workers: {r:>10,.0f} samples/s  {out['ratio_to_one_worker'][w]:.2f}x one worker"
                  f"  {out['ratio_to_single_process'][w]:.2f}x the single process")  # fmt: skip
    return out


if __name__ == "__main__":
    main()
