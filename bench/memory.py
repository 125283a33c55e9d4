"""``python -m bench.memory``: what ``--memory`` costs and whether the dump's peak RSS stays within it.

Each job is dumped as a whole process (the peak RSS is the child's ``ru_maxrss``), once with the budget and
once with a budget far above the job (*in memory*); *floor* is the same job's dump of a 1,000-row table (the
interpreter, the imports and the fixed buffers). The promise checked: ``peak <= floor + budget + slack``
with the slack of :data:`pgprefetch.write.memory.policy.SLACK`, and the budgeted time within 1.5x the in-memory
time, with the same bytes (every chunk's digest).

Jobs (issue #39's table; ``--quick`` divides the rows by 10):

- *query*: query mode, 3M one-column keys, two ``int`` columns a sample.
- *rows3*: scan mode, one row a sample, 3M rows of ``bigint`` + 2 ``int``.
- *rows17*: scan mode, 2M rows of ``bigint`` + 16 ``real`` + 1 ``int``.
- *windows8* / *windows1*: scan mode, 48-row windows of a 3.6M-row table at stride 8 (and 1).
- *mixed*: the new user's case of #52, a 3.19M-row scan source (``bigint`` + 2 ``int``) beside two query
  sources of 20,000 keys. A budget it does not hold is a refusal naming the least ``--memory``: recorded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.harness.db import execute

from . import log
from .dumprun import PGPREFETCH, RSS_WRAPPER
from .postgres import database, server
from .report import splice_into

MIB = 1 << 20
TARGET_TIME = 1.5
IN_MEMORY = "16GiB"
SERIES_ROWS = 3_000  # rows a series in the windows table
BEGIN, END = "<!-- bench.memory -->", "<!-- /bench.memory -->"


@dataclass(frozen=True)
class Job:
    """One dump shape: its table (made by ``create(name, rows)``) and its config."""

    name: str
    rows: int
    create: str  # SQL with {t} (the table) and {n} (its rows)
    config: str  # TOML with {t} and {store}


def _rows_table(columns: str, values: str) -> str:
    return (
        f"CREATE TABLE {{t}} (id bigint PRIMARY KEY, {columns});"
        f"INSERT INTO {{t}} SELECT i, {values} FROM generate_series(1, {{n}}) i"
    )


R17_COLS = ", ".join(f"f{i} real NOT NULL" for i in range(16)) + ", c int NOT NULL"
R17_VALS = ", ".join(f"(i % {97 + i}) * 0.5" for i in range(16)) + ", i % 7"
BATCHES = "[batches]\nsize = {size}\nseed = 0\ndrop_last = false\n\n"
STORE = '[store]\npath = "{store}"\ncompression = "none"\n'

JOBS = {
    "query": Job(
        "query",
        3_000_000,
        _rows_table("a int NOT NULL, b int NOT NULL", "i % 1000, i % 77"),
        '[samples]\nkeys = "SELECT id FROM {t}"\nquery = "SELECT a, b FROM {t} WHERE id = $1"\n\n'
        '[fields.x]\ncolumns = ["a", "b"]\ndtype = "int32"\n\n' + BATCHES.format(size=1024) + STORE,
    ),
    "rows3": Job(
        "rows3",
        3_000_000,
        _rows_table("a int NOT NULL, b int NOT NULL", "i % 1000, i % 77"),
        '[samples]\ntable = "{t}"\nkey = ["id"]\n\n[fields.x]\ncolumns = ["a", "b"]\ndtype = "int32"\n\n'
        + BATCHES.format(size=1024)
        + STORE,
    ),
    "rows17": Job(
        "rows17",
        2_000_000,
        _rows_table(R17_COLS, R17_VALS),
        '[samples]\ntable = "{t}"\nkey = ["id"]\n\n[fields.x]\ncolumns = ['
        + ", ".join(f'"f{i}"' for i in range(16))
        + ']\ndtype = "float32"\n\n[fields.y]\ncolumns = ["c"]\ndtype = "int64"\n\n'
        + BATCHES.format(size=1024)
        + STORE,
    ),
}
MIXED_SOURCE = (
    '[samples.{name}]\nweight = 1\nkeys = "SELECT id FROM {t}_{name}"\n'
    'query = "SELECT a, b FROM {t}_{name} WHERE id = $1"\n\n'
)
SMALL = _rows_table("a int NOT NULL, b int NOT NULL", "i % 1000, i % 77").replace("{n}", "20000")
JOBS["mixed"] = Job(
    "mixed",
    3_190_000,
    ";".join(
        [
            _rows_table("a int NOT NULL, b int NOT NULL", "i % 1000, i % 77"),
            SMALL.replace("{t}", "{t}_web"),
            SMALL.replace("{t}", "{t}_docs"),
        ]
    ),
    '[samples.events]\nweight = 2\ntable = "{t}"\nkey = ["id"]\n\n'
    + MIXED_SOURCE.format(name="web", t="{t}")
    + MIXED_SOURCE.format(name="docs", t="{t}")
    + '[fields.x]\ncolumns = ["a", "b"]\ndtype = "int32"\n\n'
    + BATCHES.format(size=1024)
    + STORE,
)
WINDOWS_TABLE = (
    "CREATE TABLE {t} (series_id int NOT NULL, t int NOT NULL, f0 real NOT NULL, f1 real NOT NULL, "
    "label smallint NOT NULL);"
    f"INSERT INTO {{t}} SELECT i / {SERIES_ROWS}, i % {SERIES_ROWS}, i * 0.25, (i % 13) * 0.5, i % 5 "
    "FROM generate_series(0, {n} - 1) i ORDER BY random()"
)
for _stride in (8, 1):
    JOBS[f"windows{_stride}"] = Job(
        f"windows{_stride}",
        3_600_000,
        WINDOWS_TABLE,
        '[samples]\ntable = "{t}"\nkey = ["series_id"]\norder = "t"\nwindow = 48\n'
        f"stride = {_stride}\n\n"
        '[fields.x]\ncolumns = ["f0", "f1"]\ndtype = "float32"\n\n[fields.y]\ncolumns = ["label"]\n'
        'dtype = "int64"\n\n' + BATCHES.format(size=256) + STORE,
    )


@dataclass(frozen=True)
class Run:
    """One dump: wall seconds, peak RSS (bytes), the dump's own peak report, the epoch's digest.

    ``refused``: the dump's one-line refusal (a budget a mixed epoch's scan source does not fit), if any.
    """

    seconds: float
    peak: int
    reported: int
    digest: str
    refused: str = ""


def epoch_digest(store: Path) -> str:
    """The sha256 over every chunk file of epoch 0, in path order (the same bytes, or not)."""
    h = hashlib.sha256()
    root = store / "epoch-00000"
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != "zarr.json" and "manifest" not in p.name:
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def dump(job: Job, table: str, dsn: str, workdir: Path, memory: str) -> Run:
    """Dump epoch 0 of ``job`` over ``table`` under ``--memory memory`` as a whole process."""
    store = workdir / f"store-{table}"
    shutil.rmtree(store, ignore_errors=True)
    config = workdir / f"{table}.toml"
    config.write_text(job.config.replace("{t}", table).replace("{store}", str(store)), encoding="utf-8")
    argv = [str(PGPREFETCH), "dump", "--config", str(config), "--epoch", "0", "--force", "--json"]
    argv += ["--dsn", dsn, "--memory", memory]
    started = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", RSS_WRAPPER, *argv], capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    *lines, last = p.stdout.strip().splitlines() or ["MAXRSS_KIB 0 RC -1"]
    _, kib, _, rc = last.split()
    if int(rc) != 0 and lines and '"error"' in lines[-1]:
        return Run(seconds, int(kib) * 1024, 0, "", refused=json.loads(lines[-1])["error"])
    if int(rc) != 0 or not lines:
        raise RuntimeError(f"dump of {table} under {memory} failed: {p.stderr.strip()[-1500:]}")
    result = json.loads(lines[-1])
    digest = epoch_digest(store)
    shutil.rmtree(store, ignore_errors=True)
    return Run(seconds, int(kib) * 1024, int(result.get("peak_rss", 0)), digest)


def _verdict(peak_ok: bool, time_ok: bool) -> str:
    if peak_ok and time_ok:
        return "met"
    return "peak met, time not" if peak_ok else ("time met, peak not" if time_ok else "not met")


def parse_size(text: str) -> int:
    from pgprefetch.config.values import parse_size as parse

    return parse(text, "--budgets")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", default=",".join(JOBS), help="comma-separated: " + ", ".join(JOBS))
    ap.add_argument("--budgets", default="32MiB,64MiB,256MiB")
    ap.add_argument("--quick", action="store_true", help="a tenth of the rows")
    ap.add_argument("--runs", type=int, default=1, help="dumps of each cell (the median is kept)")
    ap.add_argument("--results", type=Path, help="splice the section into this RESULTS.md")
    args = ap.parse_args(argv)
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    jobs = [JOBS[j.strip()] for j in args.jobs.split(",") if j.strip()]
    from pgprefetch.write.memory.policy import SLACK

    lines = []
    with server() as admin, database(admin) as dsn, tempfile.TemporaryDirectory(prefix="pgpf-mem-") as tmp:
        workdir = Path(tmp)
        for job in jobs:
            rows = job.rows // 10 if args.quick else job.rows
            for table, n in ((f"{job.name}_floor", 1_000), (f"{job.name}_t", rows)):
                log(f"{job.name}: loading {n:,} rows into {table}")
                execute(dsn, f"DROP TABLE IF EXISTS {table}")
                for statement in job.create.replace("{t}", table).replace("{n}", str(n)).split(";"):
                    execute(dsn, statement)
                execute(dsn, f"VACUUM ANALYZE {table}")

            def best(table: str, memory: str, job: Job = job) -> Run:
                runs = [dump(job, table, dsn, workdir, memory) for _ in range(args.runs)]
                return sorted(runs, key=lambda run: run.seconds)[len(runs) // 2]

            floor = best(f"{job.name}_floor", IN_MEMORY)
            free = best(f"{job.name}_t", IN_MEMORY)
            base = f"floor {floor.peak / MIB:.0f} MiB, in memory {free.peak / MIB:.0f} MiB"
            log(f"{job.name}: {base} in {free.seconds:.2f} s")
            for b in budgets:
                r = best(f"{job.name}_t", b)
                if r.refused:
                    least = r.refused.rsplit("--memory ", 1)[-1] if "--memory " in r.refused else "?"
                    line = f"| {job.name} | {rows:,} | {b} | | | | | | | refused: least --memory {least} |"
                    log(line)
                    lines.append(line)
                    continue
                limit = floor.peak + parse_size(b) + SLACK
                line = (
                    f"| {job.name} | {rows:,} | {b} | {r.peak / MIB:.0f} | {floor.peak / MIB:.0f} | "
                    f"{(r.peak - floor.peak - parse_size(b)) / MIB:+.0f} | {r.seconds:.2f} s | "
                    f"{r.seconds / free.seconds:.2f}x | {'yes' if r.digest == free.digest else 'NO'} | "
                    f"{_verdict(r.peak <= limit, r.seconds <= TARGET_TIME * free.seconds)} |"
                )
                log(line)
                lines.append(line)
            lines.append(
                f"| {job.name} | {rows:,} | in memory | {free.peak / MIB:.0f} | {floor.peak / MIB:.0f} | "
                f"| {free.seconds:.2f} s | 1.00x | | |"
            )
    section = "\n".join(
        [
            BEGIN,
            "## --memory: the dump's peak against floor + budget + slack (`python -m bench.memory`)",
            "",
            "Whole `pgprefetch dump` processes, peak RSS from the kernel; floor: the same config over 1,000 rows; "
            f"in memory: `--memory {IN_MEMORY}`. Target: peak <= floor + budget + {SLACK >> 20} MiB, time <= "
            f"{TARGET_TIME}x in memory, the same bytes.",
            "",
            "| job | rows | budget | peak MiB | floor MiB | peak - floor - budget, MiB | time | vs in memory | "
            "same bytes | target |",
            "|---|--:|---|--:|--:|--:|--:|--:|---|---|",
            *lines,
            END,
        ]
    )
    print(section)
    if args.results:
        splice_into(args.results, section, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
