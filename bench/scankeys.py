"""The scan-mode half of the KEYS benchmark (issue #27): peak RSS of scan dumps whose keys outgrow ``--memory``.

Two tables of ``N`` and ``8N`` rows each, too large for the budget, so each dump reads them in passes
after a keys pass over their key (and order) columns:

- **rows**: ``flat_<n> (id bigint, emb real[16])``, one sample a row, ids scrambled over the heap;
- **windows**: ``ticks_<n> (series_id int, t int, emb real[16])``, series of 1,000 rows stored by ``t``
  (every series interleaved), windows of 16 at stride 8.

Every dump is ``pgprefetch dump`` as a whole process under ``--memory 64MiB``, its peak RSS taken by the
same wrapper as the keys bench's. *after*: this code (the keys pass ordered on disk); *before*: the code at
``--before DIR`` (a copy of the tree before the change, e.g. ``git archive <rev> | tar -x -C DIR``), whose
keys pass held every row's keys. The figure is the growth of the peak per extra table row, 1x to 8x.

    python -m bench.scankeys [--quick] [--before DIR] [--results bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from . import log
from .keys import WRAPPER
from .postgres import database, server

BUDGET = "64MiB"
ROWS = 1_000_000  # 1x: keys beyond 64 MiB's keys pass (838,000 rows; 599,000 for windows), data beyond it
QUICK_ROWS, QUICK_BUDGET = 100_000, "8MiB"
FACTOR = 8
SERIES_ROWS = 1000
TARGET = 16.0  # bytes per extra table row
BEGIN = "<!-- scan keys bench: begin -->"
END = "<!-- scan keys bench: end -->"
KINDS = {
    "rows": (
        "CREATE TABLE flat_{n} AS SELECT (i::int8 * 1000003) % 2147483647 AS id, array_fill(i::real, ARRAY[16]) AS emb "
        "FROM generate_series(1, {n}) i",
        "CREATE INDEX ON flat_{n} (id)",
        'table = "flat_{n}"\nkey = "id"',
    ),
    "windows": (
        "CREATE TABLE ticks_{n} AS SELECT s AS series_id, t, array_fill(t::real, ARRAY[16]) AS emb "
        "FROM generate_series(1, {rows}) t, generate_series(1, {n} / {rows}) s",
        "CREATE INDEX ON ticks_{n} (series_id, t)",
        'table = "ticks_{n}"\nkey = ["series_id"]\norder = "t"\nwindow = 16\nstride = 8',
    ),
}


@dataclass(frozen=True)
class ScanRun:
    """One dump: its table rows, samples, wall time and peak RSS."""

    kind: str
    code: str  # "after" or "before"
    rows: int
    samples: int
    seconds: float
    max_rss: int


async def _load(dsn: str, n: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        for create, index, _ in KINDS.values():
            await conn.execute(create.format(n=n, rows=SERIES_ROWS))
            await conn.execute(index.format(n=n))
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


def dump(dsn: str, workdir: Path, kind: str, n: int, memory: str, pythonpath: str | None) -> ScanRun:
    """Dump epoch 0 of ``kind``'s ``n``-row table under ``memory`` in a process of its own."""
    store = workdir / f"{kind}-{n}.zarr"
    config = workdir / f"{kind}-{n}.toml"
    config.write_text(
        f"[source]\nconnections = 4\n\n[samples]\n{KINDS[kind][2].format(n=n)}\n\n"
        '[fields.emb]\ncolumns = ["emb"]\ndtype = "float32"\n\n'
        f'[batches]\nsize = 1024\nseed = 0\n\n[store]\npath = "{store}"\n',
        encoding="utf-8",
    )
    argv = [sys.executable, "-c", WRAPPER, sys.executable, "-m", "pgprefetch", "dump", "--config", str(config)]
    argv += ["--epoch", "0", "--force", "--json", "--dsn", dsn, "--memory", memory]
    env = dict(os.environ, PYTHONPATH=pythonpath or os.environ.get("PYTHONPATH", ""))
    try:
        started = time.perf_counter()
        p = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
        seconds = time.perf_counter() - started
    finally:
        shutil.rmtree(store, ignore_errors=True)
    *lines, last = p.stdout.strip().splitlines() or ["MAXRSS_KIB 0 CPU_S 0 RC -1"]
    _, kib, _, _, _, rc = last.split()
    if int(rc) != 0 or not lines:
        raise RuntimeError(f"scan dump of {kind} {n:,} failed ({rc}): {(p.stderr + p.stdout).strip()[-2000:]}")
    summary = json.loads(lines[-1])
    code = "before" if pythonpath else "after"
    return ScanRun(kind, code, n, int(summary["n_samples"]), seconds, int(kib) * 1024)


def run(dsn: str, *, quick: bool, before: str | None) -> list[ScanRun]:
    """Load both sizes, then dump each table with this code (and the code ``before``)."""
    base, memory = (QUICK_ROWS, QUICK_BUDGET) if quick else (ROWS, BUDGET)
    for n in (base, base * FACTOR):
        log(f"scan keys: loading {n:,} rows of each table")
        asyncio.run(_load(dsn, n))
    runs = []
    workdir = Path(tempfile.mkdtemp(prefix="pgpf-bench-scankeys-"))
    try:
        for kind in KINDS:
            for code in [None, *([before] if before else [])]:
                for n in (base, base * FACTOR):
                    runs.append(r := dump(dsn, workdir, kind, n, memory, code))
                    log(
                        f"scan keys: {kind}, {n:,} rows, {r.code}: {r.samples:,} samples, "
                        f"peak RSS {r.max_rss / 2**20:,.1f} MiB, {r.seconds:.1f} s"
                    )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return runs


def render(runs: list[ScanRun], memory: str, revision: str) -> str:
    """The section, between markers, for RESULTS.md."""
    out = [BEGIN, f"### Scan mode: the keys pass under `--memory {memory}`", ""]
    out += [
        "Scan-mode dumps of tables larger than the budget (read in passes), each `pgprefetch dump` as a whole "
        "process (`python -m bench.scankeys`): *rows*, `(id bigint, emb real[16])`, ids scrambled; *windows*, "
        f"`(series_id, t, emb real[16])`, series of {SERIES_ROWS:,} rows stored interleaved, windows of 16 at "
        "stride 8. *after*: the keys pass ordered on disk beyond the budget; *before*: every row's keys held.",
        "",
        "| table | code | rows | samples | peak RSS MiB | s | B per extra row, 1x to 8x |",
        "|---|---|--:|--:|--:|--:|--:|",
    ]
    for kind in KINDS:
        for code in ("before", "after"):
            mine = sorted((r for r in runs if r.kind == kind and r.code == code), key=lambda r: r.rows)
            if len(mine) < 2:
                continue
            small, large = mine[0], mine[-1]
            per_row = (large.max_rss - small.max_rss) / (large.rows - small.rows)
            for r in mine:
                growth = f"{per_row:.1f}" if r is large else ""
                out.append(
                    f"| {kind} | {code} | {r.rows:,} | {r.samples:,} | {r.max_rss / 2**20:,.1f} | {r.seconds:.1f} "
                    f"| {growth} |"
                )
    out += ["", f"Target: under {TARGET:g} B per extra table row. Revision {revision}.", END]
    return "\n".join(out)


def main() -> None:
    from .machine import code_revision
    from .report import splice

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} rows under {QUICK_BUDGET}")
    parser.add_argument("--before", help="a copy of the code before the change, for the 'before' dumps")
    parser.add_argument("--results", type=Path, help="splice the section into this RESULTS.md")
    args = parser.parse_args()
    with server() as admin_dsn, database(admin_dsn) as dsn:
        runs = run(dsn, quick=args.quick, before=args.before)
    section = render(runs, QUICK_BUDGET if args.quick else BUDGET, code_revision())
    print(section)
    if args.results:
        old = args.results.read_text(encoding="utf-8")
        args.results.write_text(splice(old, section, BEGIN, END), encoding="utf-8")
        log(f"wrote the scan keys section of {args.results}")


if __name__ == "__main__":
    main()
