"""Scan mode against the query mode, the per-batch ceilings and a bare full-table COPY; rows read; RSS.

For each dataset, in one run on one server (two windows shapes, both at stride 1: *windows*, 64 rows of
``real``, ``double precision`` and ``smallint`` into float32[64, 2] and int64[64]; *mixed*, 48 rows of
``double precision``, ``real`` and ``smallint`` into one float32[48, 3] field and a ``boolean`` into bool[48],
300 series, bench/mixed.py; and *rows*, one row a sample):

- *scan*: ``pgprefetch dump`` of a scan config as a whole process (the table read once, windows cut in
  numpy). Its samples are every window of every series (stride 1) or every row, not the query mode's
  train subset, so rates are compared per sample.
- *bare COPY*: one binary ``COPY (SELECT the same columns FROM the table) TO STDOUT``, bytes thrown away:
  the read's own limit on one connection.
- *rows read*: ``seq_tup_read + idx_tup_fetch`` of the table in ``pg_stat_user_tables`` around a scan dump
  and around a query-mode dump of the same dataset, against the table's row count.
- *RSS*: the rows table and a quarter of it, both read in passes under the same small ``--memory``: the
  growth of the peak per extra row is what the keys cost.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from . import dumprun, log
from .datasets import CONNECTIONS, ROWS, SEED, Dataset

TABLES = {"windows": "ticks", "rows": "items", "mixed": "sensors"}
COLUMNS = {
    "windows": "series_id, t, f0, f1, label",
    "rows": "id, emb, price, qty, day, label",
    "mixed": "series_id, t, f0, f1, f2, flag",
}
RSS_MEMORY = "64MiB"


def scan_config(ds: Dataset, store: Path, *, table: str | None = None, memory: str | None = None) -> str:
    """The scan-mode config of a dataset (windows of ``ds.rows`` with stride 1, or one row per sample)."""
    name = table or TABLES[ds.name]
    samples = (
        f'[samples]\ntable = "{name}"\nkey = ["series_id"]\norder = "t"\nwindow = {ds.rows}\n'
        if ds.rows > 1
        else f'[samples]\ntable = "{name}"\nkey = ["id"]\n'
    )
    memory_line = f'memory = "{memory}"\n' if memory else ""
    return (
        f"[source]\nconnections = {CONNECTIONS}\n{memory_line}\n{samples}\n"
        f"{ds.fields}\n"
        f"[batches]\nsize = {ds.batch_size}\nseed = {SEED}\ndrop_last = {str(ds.drop_last).lower()}\n\n"
        f'[store]\npath = "{store}"\ncompression = "none"\n'
    )


@dataclass
class ScanRow:
    """One dataset's scan-mode figures."""

    dataset: str
    table_rows: int
    scan: dumprun.DumpRun
    bare_copy_s: float
    rows_read_scan: int
    rows_read_query: int
    query: dumprun.DumpRun | None = None


@dataclass
class ScanRss:
    """Peak RSS of scans of a quarter of the rows table and of all of it, under the same ``--memory``."""

    small_rows: int
    big_rows: int
    small: dumprun.DumpRun
    big: dumprun.DumpRun


@dataclass
class ScanResults:
    """What the scan bench measured."""

    rows: list[ScanRow] = field(default_factory=list)
    rss: ScanRss | None = None


async def _table_rows(dsn: str, table: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval(f"SELECT count(*) FROM {table}"))
    finally:
        await conn.close()


async def _rows_read(dsn: str, table: str) -> int:
    """The server's count of rows read from ``table`` so far (flushed first)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("SELECT pg_stat_force_next_flush()")
        return int(
            await conn.fetchval(
                "SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables "
                "WHERE relname = $1",
                table,
            )
        )
    finally:
        await conn.close()


async def bare_copy(dsn: str, ds: Dataset) -> float:
    """Seconds of one binary COPY of the whole table's columns, bytes thrown away."""
    conn = await asyncpg.connect(dsn)
    try:

        async def sink(_: bytes) -> None:
            return None

        started = time.perf_counter()
        await conn.copy_from_query(f"SELECT {COLUMNS[ds.name]} FROM {TABLES[ds.name]}", output=sink, format="binary")
        return time.perf_counter() - started
    finally:
        await conn.close()


def measure(ds: Dataset, dsn: str, workdir: Path, query: dumprun.DumpRun | None) -> ScanRow:
    """Scan dump, bare COPY, and the rows each mode reads per epoch, for one dataset."""
    table = TABLES[ds.name]
    n_rows = asyncio.run(_table_rows(dsn, table))
    before = asyncio.run(_rows_read(dsn, table))
    run = dumprun.dump(ds, dsn, workdir, config=scan_config(ds, workdir / f"scan-{ds.name}"))
    rows_scan = asyncio.run(_rows_read(dsn, table)) - before
    log(f"{ds.name} scan: {run.samples:,} samples in {run.seconds:.1f} s = {run.rate:,.0f}/s, {rows_scan:,} read")
    copy_s = asyncio.run(bare_copy(dsn, ds))
    log(f"{ds.name} bare COPY: {n_rows:,} rows in {copy_s:.1f} s = {n_rows / copy_s:,.0f} rows/s")
    before = asyncio.run(_rows_read(dsn, table))
    dumprun.dump(ds, dsn, workdir)  # the query mode, for its rows read
    rows_query = asyncio.run(_rows_read(dsn, table)) - before
    log(f"{ds.name} query mode: {rows_query:,} rows read ({rows_query / n_rows:.1f}x the table)")
    return ScanRow(ds.name, n_rows, run, copy_s, rows_scan, rows_query, query)


def measure_rss(dsn: str, workdir: Path) -> ScanRss:
    """Peak RSS of two multi-pass scans, a quarter of ``items`` and all of it, under ``RSS_MEMORY``."""
    quarter = "SELECT * FROM items WHERE id % 4 = 0"
    runs = {}
    for label, table in (("small", quarter), ("big", "items")):
        cfg = scan_config(ROWS, workdir / f"scan-rss-{label}", table=table, memory=RSS_MEMORY)
        runs[label] = dumprun.dump(ROWS, dsn, workdir, config=cfg, measure_rss=True)
        log(f"scan rss {label}: {runs[label].samples:,} samples, peak {runs[label].max_rss / 2**20:,.1f} MiB")
    return ScanRss(runs["small"].samples, runs["big"].samples, runs["small"], runs["big"])


def render(results: ScanResults, query_rates: dict[str, tuple[float, float]]) -> list[str]:
    """The scan section of RESULTS.md; ``query_rates`` maps a dataset to (query dump/s, row ceiling/s)."""
    out = [
        "## Scan mode: each table row read once per epoch",
        "",
        __doc__.split("\n\n", 1)[1].strip(),
        "",
        "| dataset | table rows | scan samples/s | query dump/s | row ceiling/s | bare COPY rows/s "
        "| scan/ceiling | scan/bare COPY | rows read: scan | rows read: query |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in results.rows:
        dump_rate, ceiling = query_rates.get(r.dataset, (0.0, 0.0))
        copy_rate = r.table_rows / r.bare_copy_s
        out.append(
            f"| {r.dataset} | {r.table_rows:,} | {r.scan.rate:,.0f} ({r.scan.samples:,} in {r.scan.seconds:.1f} s) "
            f"| {dump_rate:,.0f} | {ceiling:,.0f} | {copy_rate:,.0f} "
            f"| {r.scan.rate / ceiling if ceiling else 0:.1f}x | {r.scan.rate / copy_rate:.2f}x "
            f"| {r.rows_read_scan / r.table_rows:.2f}x | {r.rows_read_query / r.table_rows:.1f}x |"
        )
    if results.rss:
        s = results.rss
        growth = (s.big.max_rss - s.small.max_rss) / max(1, s.big_rows - s.small_rows)
        out += [
            "",
            f"RSS, rows table read in passes under `--memory {RSS_MEMORY}`: a quarter ({s.small_rows:,} rows) "
            f"peaks at {s.small.max_rss / 2**20:,.1f} MiB, the whole ({s.big_rows:,} rows) at "
            f"{s.big.max_rss / 2**20:,.1f} MiB: {growth:,.0f} bytes per extra row, which is what the keys cost "
            "(key column, sample key, start row, epoch order and the shuffle's hash and index).",
        ]
    return out
