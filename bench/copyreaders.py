"""Scan mode's COPY reader (asyncpg + numpy views) against ADBC's PostgreSQL driver, on the same page ranges.

``python -m bench.copyreaders --dsn DSN --config scan.toml [--rounds 3]``, in a venv that has
``adbc-driver-postgresql`` and ``pyarrow`` (``make bench-peers``'s, or any with them). One snapshot is
exported; the table is split into the scan's ``connections`` page ranges (``ctid`` ranges, as scan mode
splits it) and read, on connections that each import the snapshot, by:

- *pgprefetch*: :func:`pgprefetch.write.scan.table.read_table`, the scan's own read: one asyncpg binary
  ``COPY`` per range, decoded into numpy columns on the dump's threads, then assembled and sorted;
- *ADBC*: one thread per range, each on its own ADBC connection that runs ``SET TRANSACTION ISOLATION
  LEVEL REPEATABLE READ`` and ``SET TRANSACTION SNAPSHOT`` first, then ``fetch_arrow_table()`` of the same
  ``SELECT`` (ADBC reads it with binary ``COPY`` and decodes it into Arrow in C++); the columns are then
  viewed as numpy (no copy for fixed-width columns without NULLs).

Rounds alternate which reader goes first; wall and this process's CPU seconds of each read are printed,
and the row counts of both are checked to agree.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import threading
import time
from pathlib import Path

from pgprefetch.config import load_config
from pgprefetch.pg.session import Snapshot
from pgprefetch.write.scan.shape import copy_select, describe_scan
from pgprefetch.write.scan.table import _page_ranges, read_table


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _adbc(dsn: str, snapshot: str, sqls: list[str]) -> int:
    """Read each ``sql`` on its own ADBC connection in its own thread, on ``snapshot``; return the rows."""
    import adbc_driver_postgresql.dbapi as adbc

    rows = [0] * len(sqls)
    errors: list[BaseException] = []

    def one(i: int, sql: str) -> None:
        try:
            with adbc.connect(dsn) as conn, conn.cursor() as cur:  # autocommit off: statements run in a transaction
                cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                cur.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")
                cur.execute(sql)
                table = cur.fetch_arrow_table()
                columns = [table.column(j).to_numpy() for j in range(table.num_columns)]  # views: no NULLs
                rows[i] = int(columns[0].shape[0]) if columns else 0
                conn.rollback()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i, s)) for i, s in enumerate(sqls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(rows)


async def measure(config: Path, dsn: str, rounds: int) -> None:
    """Read the table ``rounds`` times with each reader, alternating, and print the figures."""
    cfg = load_config(config, dsn=dsn)
    figures: dict[str, list[tuple[float, float]]] = {"pgprefetch": [], "adbc": []}
    async with Snapshot.open(cfg.source) as snap:
        shape = await describe_scan(cfg, snap)
        wheres = await _page_ranges(snap, shape, cfg.source.connections)
        sqls = [copy_select(shape, w) for w in wheres]
        print(f"{len(sqls)} page ranges of {shape.relation}; e.g. {sqls[0][:160]}")
        n = {}
        for r in range(rounds):
            for reader in ("pgprefetch", "adbc") if r % 2 == 0 else ("adbc", "pgprefetch"):
                cpu, started = _cpu(), time.perf_counter()
                if reader == "pgprefetch":
                    table = await read_table(cfg, snap, shape, wheres)
                    n[reader] = table.rows_read
                    del table
                else:
                    n[reader] = await asyncio.to_thread(_adbc, dsn, snap.id, sqls)
                figures[reader].append((time.perf_counter() - started, _cpu() - cpu))
                print(
                    f"round {r + 1}: {reader}: {figures[reader][-1][0]:.2f} s wall, {figures[reader][-1][1]:.2f} s CPU"
                )
        if n["pgprefetch"] != n["adbc"]:
            raise AssertionError(f"the readers read other row counts: {n}")
    for reader, runs in figures.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"MEDIAN {reader}: {wall:.2f} s wall, {cpu:.2f} s client CPU, {n[reader]:,} rows")


def main() -> None:
    """Parse the arguments and measure."""
    parser = argparse.ArgumentParser(prog="python -m bench.copyreaders", description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--config", type=Path, required=True, help="a scan-mode config ([samples] table)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(measure(args.config, args.dsn, args.rounds))


if __name__ == "__main__":
    main()
