"""Windows as starts against the batches layout (#56): the dump, the epoch's bytes, the readers, a step's wait.

``python -m bench.windowstarts [--quick] [--results bench/RESULTS.md]`` (``make bench`` runs it). On a throwaway
embedded PostgreSQL (or ``PGPREFETCH_BENCH_DSN``), the windows job of ``bench.handwritten``: ``series`` tables of
``series_id, t, f0 real, f1 real, label int4``, every 64-row window a sample (``x`` float32[64, 2], ``y``
int64[64]), batches of 256, at stride 1 and 8, over two tables:

- *bench*: 150 series of 3,000 rows (the handwritten bench's);
- *large*: 1,200 series of 3,000 rows (3.6M rows; 3.5M windows at stride 1, a 3.6 GB epoch as batches), large
  enough that a dump's fixed costs (imports, connections: about 0.6 s) are not the job.

Per table and stride, each layout (``[store] windows = "batches"`` or ``"starts"``):

- *dump*: ``pgprefetch dump`` as a process (a fresh store each time), its wall time, median of ``--rounds``
  with the layouts' order alternating; the epoch's bytes on disk;
- *readers*, each in a process of its own: the GB/s of batches handed out and touched (a byte of each page of
  every array of every batch, keys left out: a view's pages are read only when touched) by ``EpochArrays``
  iterated (views of the mapped files, or gathered windows), by its ``read_into`` into reused buffers, and by
  torch's ``EpochDataset`` iterated; *warm* (the epoch read once before, untimed) and *cold*
  (``posix_fadvise(DONTNEED)`` on each of the epoch's files first, so they come from the disk); one thread:
  GB/s per core;
- *a training loop's wait*: ``EpochDataset`` iterated with a step between batches (a 256x256 float32 matmul),
  the mean and 99th percentile wait for the next batch to be resident (handed out, every page touched: what a
  copy to a device waits for), warm and cold.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np

from bench import log as _log
from bench.handwritten import load_series
from bench.machine import code_revision
from bench.postgres import database, server
from bench.report import splice_into

WINDOW, SIZE, SEED = 64, 256, 7
TABLES = {"bench": (150, 3000), "large": (1200, 3000)}
QUICK = {"bench": (40, 1500), "large": (160, 1500)}
STRIDES = (1, 8)
LAYOUTS = ("batches", "starts")
ROW_BYTES = 2 * 4 + 8  # a row's fields as stored: x float32[2], y int64
BEGIN, END = "<!-- windows as starts bench: begin -->", "<!-- windows as starts bench: end -->"


def log(message: str) -> None:
    _log(message, "bench-windowstarts")


def config(table: str, stride: int, layout: str, store: Path) -> str:
    """The windows job over ``table`` at ``stride``, stored as ``layout``."""
    return (
        f'[source]\nconnections = 8\nmemory = "4GiB"\n\n[samples]\ntable = "{table}"\nkey = ["series_id"]\n'
        f'order = "t"\nwindow = {WINDOW}\nstride = {stride}\n\n'
        '[fields.x]\ncolumns = ["f0", "f1"]\ndtype = "float32"\n\n[fields.y]\ncolumns = ["label"]\ndtype = "int64"\n\n'
        f"[batches]\nsize = {SIZE}\nseed = {SEED}\ndrop_last = false\n\n"
        f'[store]\npath = "{store}"\ncompression = "none"\nwindows = "{layout}"\n'
    )


def dump(dsn: str, cfg: Path) -> tuple[float, dict[str, Any]]:
    """One ``pgprefetch dump`` process: its wall seconds and its ``--json`` summary."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pgprefetch", "dump", "--config", str(cfg), "--epoch", "0", "--dsn", dsn, "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"dump failed: {done.stderr[-2000:]}")
    return seconds, json.loads(done.stdout)


def on_disk(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def read(store: Path, mode: str) -> dict[str, float]:
    """Child process: the readers' GB/s over epoch 0 of ``store``, a training loop's waits (``mode``: warm, cold)."""
    import torch

    from pgprefetch import EpochArrays, EpochDataset

    def drop_cache() -> None:
        if mode == "warm":
            return
        for p in (store / "epoch-00000").rglob("*"):
            if p.is_file():
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)

    def timed(run: Any) -> float:
        if mode == "warm":
            run()  # once untimed: the page cache holds the epoch
        drop_cache()
        started = time.perf_counter()
        nbytes = run()
        return nbytes / (time.perf_counter() - started) / 1e9

    def touched(array: np.ndarray) -> int:  # a byte of each page read: a view's pages come from the file now
        flat = array.reshape(-1).view(np.uint8)
        flat[::4096].sum()
        return int(flat.size)

    def iterate() -> int:
        return sum(touched(v) for b in EpochArrays(store, 0, consumer=None) for v in b.values())

    def into() -> int:
        reader = EpochArrays(store, 0, consumer=None)
        buffers, n = reader.new_buffers(), 0
        for i in range(len(reader)):
            n += sum(touched(v) for v in reader.read_into(i, buffers).values())
        return n

    def tensors() -> int:
        return sum(touched(v.numpy()) for b in EpochDataset(store, 0, consumer=None) for v in b.values())

    out = {"arrays": timed(iterate), "read_into": timed(into), "torch": timed(tensors)}
    weights = torch.randn(256, 256)
    if mode == "warm":
        tensors()
    drop_cache()
    waits: list[float] = []
    batches = iter(EpochDataset(store, 0, consumer=None))
    while True:
        started = time.perf_counter()
        batch = next(batches, None)
        if batch is None:
            break
        for v in batch.values():  # resident: what a copy to a device would wait for
            touched(v.numpy())
        waits.append(time.perf_counter() - started)
        (weights @ weights).sum().item()  # the step
    out["wait_mean_us"] = statistics.fmean(waits) * 1e6
    out["wait_p99_us"] = float(np.percentile(waits, 99)) * 1e6
    return out


def read_in_child(store: Path, mode: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-m", "bench.windowstarts", "--read", str(store), "--mode", mode],
        capture_output=True, text=True, check=False, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"reader failed: {done.stderr[-2000:]}")
    result: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return result


def run_table(dsn: str, name: str, table: str, stride: int, work: Path, rounds: int) -> list[dict[str, Any]]:
    """Both layouts of one table and stride: dumps (alternating), then the readers of the last ones."""
    seconds: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
    last: dict[str, tuple[Path, dict[str, Any]]] = {}
    for r in range(rounds):
        for layout in LAYOUTS[:: 1 if r % 2 == 0 else -1]:
            folder = work / f"{name}-{stride}-{layout}"
            subprocess.run(["rm", "-rf", str(folder)], check=True)
            folder.mkdir()
            cfg = folder / "c.toml"
            cfg.write_text(config(table, stride, layout, folder / "store.zarr"))
            wall, summary = dump(dsn, cfg)
            seconds[layout].append(wall)
            last[layout] = folder / "store.zarr", summary
            log(f"{name} stride {stride} {layout}: {wall:.2f} s, {summary['n_samples']:,} windows")
    out = []
    for layout in LAYOUTS:
        store, summary = last[layout]
        row = {"table": name, "stride": stride, "layout": layout, "seconds": statistics.median(seconds[layout]),
               "windows": summary["n_samples"], "bytes": on_disk(store / "epoch-00000")}  # fmt: skip
        for mode in ("warm", "cold"):
            row[mode] = read_in_child(store, mode)
            log(f"{name} stride {stride} {layout} {mode}: {row[mode]}")
        out.append(row)
    for layout in LAYOUTS:
        subprocess.run(["rm", "-rf", str(work / f"{name}-{stride}-{layout}")], check=True)
    return out


def render(rows: list[dict[str, Any]], tables: dict[str, tuple[int, int]], wall: float) -> str:
    """The RESULTS.md section: per table and stride, both layouts, and the ratios the issue's targets name.

    The epoch against "1.2x the series' bytes plus 8 bytes a window", with the series' bytes read two ways:
    its rows' fields as stored (16 bytes a row), and with their key and order (two int64 slots, as a sample's
    key is stored: 32 bytes a row).
    """
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [BEGIN, "## Windows stored as starts", "",
             f"`python -m bench.windowstarts` at {code_revision()}, {when}, {wall:.0f} s: 64-row windows, batches of "
             "256; dump: the process's wall time (median); readers: GB/s of batches handed out and touched, one "
             "thread; *cold*: the epoch's files dropped from the page cache first; wait: for the next batch to be "
             "resident, between steps.", "",
             "| table | stride | layout | windows | dump | epoch | / budget (fields) | / budget (with keys) | arrays "
             "warm | read_into warm | torch warm | arrays cold | read_into cold | torch cold | wait warm (mean, p99) "
             "| wait cold (mean, p99) |",
             "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]  # fmt: skip
    for r in rows:
        series, length = tables[r["table"]]
        fields, keyed = (1.2 * series * length * b + 8 * r["windows"] for b in (ROW_BYTES, ROW_BYTES + 16))
        w, c = r["warm"], r["cold"]
        lines.append(
            f"| {r['table']} ({series:,} x {length:,}) | {r['stride']} | {r['layout']} | {r['windows']:,} | "
            f"{r['seconds']:.2f} s | {r['bytes'] / 1e6:,.0f} MB | {r['bytes'] / fields:.2f} | {r['bytes'] / keyed:.2f} "
            f"| {w['arrays']:.2f} | {w['read_into']:.2f} | {w['torch']:.2f} | {c['arrays']:.2f} | "
            f"{c['read_into']:.2f} | {c['torch']:.2f} | {w['wait_mean_us']:.0f}, {w['wait_p99_us']:.0f} µs | "
            f"{c['wait_mean_us']:.0f}, {c['wait_p99_us']:.0f} µs |"
        )
    lines += ["", "| table | stride | dump: batches / starts | epoch: batches / starts | cold arrays: starts / "
              "batches |", "|---|--:|--:|--:|--:|"]  # fmt: skip
    for b, s in zip(rows[0::2], rows[1::2], strict=True):
        lines.append(
            f"| {b['table']} | {b['stride']} | {b['seconds'] / s['seconds']:.2f}x | {b['bytes'] / s['bytes']:.1f}x | "
            f"{s['cold']['arrays'] / b['cold']['arrays']:.2f}x |"
        )
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.windowstarts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small tables, one round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tables", default=",".join(TABLES), help="which tables (default: bench,large)")
    parser.add_argument("--results", type=Path, help="splice the section into this RESULTS.md")
    parser.add_argument("--read", type=Path, help=argparse.SUPPRESS)  # the reader's child process
    parser.add_argument("--mode", default="warm", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.read:
        print(json.dumps(read(args.read, args.mode)))
        return
    wanted = args.tables.split(",")
    tables = {name: shape for name, shape in (QUICK if args.quick else TABLES).items() if name in wanted}
    rounds = 1 if args.quick else args.rounds
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with server() as admin, database(admin) as dsn, tempfile.TemporaryDirectory(prefix="pgpf-bench-ws-") as tmp:
        for name, (series, length) in tables.items():
            log(f"loading {name}: {series:,} series of {length:,} rows")

            async def load(series: int = series, length: int = length, name: str = name) -> None:
                conn = await asyncpg.connect(dsn)
                try:
                    await load_series(conn, series, length, f"series_{name}")
                finally:
                    await conn.close()

            asyncio.run(load())
            for stride in STRIDES:
                rows += run_table(dsn, name, f"series_{name}", stride, Path(tmp), rounds)
    section = render(rows, tables, time.perf_counter() - started)
    print(section)
    if args.results:
        splice_into(args.results, section, BEGIN, END)


if __name__ == "__main__":
    main()
