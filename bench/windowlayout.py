"""Windows stored as starts: what the layout would save a dump, and what it would cost a reader.

``python -m bench.windowlayout`` (no PostgreSQL: the arrays are made here). The windows job of
``bench.handwritten``: 150 series of 3,000 rows (``x`` float32[2], ``y`` int64 per row), every 64-row window
at stride 1 a sample (440,550), batches of 256, in a seeded random order. Two layouts of the same epoch:

- *batches* (today's): each batch's windows gathered and written, ``x`` (256, 64, 2) and ``y`` (256, 64) per
  batch: 64 copies of every row, 458 MB;
- *starts*: the sorted rows once (``x`` (450,000, 2), ``y`` (450,000,)) and each sample's first row, in the
  epoch's order (int64): 11 MB.

Per layout, the write: every byte to its file, then ``fdatasync`` (a published epoch is on disk), in seconds.
The read, page cache warm, every batch into one buffer reused: *batches* by one ``preadv`` per array and
batch (the *raw* reader of ``bench.reader``: what any reader of these bytes pays); *starts* by the batch's
starts read the same way, then one gather of 64-row runs from the mapped rows (each run an opaque item, a
fancy index). Medians of ``--rounds``, order alternating.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

WINDOW, BATCH, SEED = 64, 256, 0


def _table(series: int, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sorted rows' ``x`` and ``y``, and the starts of every window, shuffled."""
    rng = np.random.default_rng(SEED)
    x = rng.random((series * length, 2), dtype=np.float32)
    y = rng.integers(0, 9, series * length).astype(np.int64)
    per = length - WINDOW + 1
    starts = (np.arange(series)[:, None] * length + np.arange(per)).reshape(-1)
    return x, y, starts[rng.permutation(starts.size)]


def _runs(rows: np.ndarray) -> np.ndarray:
    """Every ``WINDOW``-row run of ``rows`` as one opaque item: ``runs[s]`` is the window starting at row s."""
    item = np.dtype((np.void, rows.strides[0] * WINDOW))
    return np.ndarray((rows.shape[0] - WINDOW + 1,), item, rows, 0, (rows.strides[0],))


def _write(path: Path, chunks: list[np.ndarray]) -> None:
    with path.open("wb") as f:
        for c in chunks:
            f.write(memoryview(np.ascontiguousarray(c)).cast("B"))
        f.flush()
        os.fdatasync(f.fileno())


def write_batches(folder: Path, x: np.ndarray, y: np.ndarray, starts: np.ndarray) -> float:
    """Today's layout: each batch's windows gathered, written, synced."""
    t = time.perf_counter()
    runs_x, runs_y = _runs(x), _runs(y)
    with (folder / "x").open("wb") as fx, (folder / "y").open("wb") as fy:
        for b in range(0, starts.size, BATCH):
            s = starts[b : b + BATCH]
            fx.write(memoryview(runs_x[s]).cast("B"))  # an index, not np.take: take copies a strided source whole
            fy.write(memoryview(runs_y[s]).cast("B"))
        for f in (fx, fy):
            f.flush()
            os.fdatasync(f.fileno())
    return time.perf_counter() - t


def write_starts(folder: Path, x: np.ndarray, y: np.ndarray, starts: np.ndarray) -> float:
    """The starts layout: the rows once, the starts in the epoch's order, synced."""
    t = time.perf_counter()
    _write(folder / "rows_x", [x])
    _write(folder / "rows_y", [y])
    _write(folder / "starts", [starts])
    return time.perf_counter() - t


def read_batches(folder: Path, n: int) -> float:
    """Every batch of ``x`` and ``y`` by ``preadv`` into reused buffers."""
    bx, by = np.empty((BATCH, WINDOW, 2), np.float32), np.empty((BATCH, WINDOW), np.int64)
    t = time.perf_counter()
    fx, fy = os.open(folder / "x", os.O_RDONLY), os.open(folder / "y", os.O_RDONLY)
    try:
        for b in range(0, n, BATCH):
            k = min(BATCH, n - b)
            os.preadv(fx, [memoryview(bx[:k]).cast("B")], b * bx[0].nbytes)
            os.preadv(fy, [memoryview(by[:k]).cast("B")], b * by[0].nbytes)
    finally:
        os.close(fx)
        os.close(fy)
    return time.perf_counter() - t


def read_starts(folder: Path, n: int) -> float:
    """Every batch: its starts by ``preadv``, then its windows gathered from the mapped rows into the buffers."""
    bx, by = np.empty((BATCH, WINDOW, 2), np.float32), np.empty((BATCH, WINDOW), np.int64)
    bs = np.empty(BATCH, np.int64)
    t = time.perf_counter()
    maps = []
    try:
        for name in ("rows_x", "rows_y"):
            with (folder / name).open("rb") as f:
                maps.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
        x = np.frombuffer(maps[0], np.float32).reshape(-1, 2)
        y = np.frombuffer(maps[1], np.int64)
        runs_x, runs_y = _runs(x), _runs(y)
        out_x, out_y = bx.reshape(-1).view(runs_x.dtype), by.reshape(-1).view(runs_y.dtype)
        fs = os.open(folder / "starts", os.O_RDONLY)
        try:
            for b in range(0, n, BATCH):
                k = min(BATCH, n - b)
                os.preadv(fs, [memoryview(bs[:k]).cast("B")], b * 8)
                out_x[:k] = runs_x[bs[:k]]
                out_y[:k] = runs_y[bs[:k]]
        finally:
            os.close(fs)
        del x, y, runs_x, runs_y
    finally:
        for m in maps:
            m.close()
    return time.perf_counter() - t


def _size(folder: Path, names: tuple[str, ...]) -> int:
    return sum((folder / n).stat().st_size for n in names)


def main(argv: list[str] | None = None) -> None:
    """Write both layouts, read both back, print the figures."""
    parser = argparse.ArgumentParser(prog="python -m bench.windowlayout", description=__doc__.split("\n")[0])
    parser.add_argument("--series", type=int, default=150)
    parser.add_argument("--length", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tmp", type=Path, default=None, help="where the files go (default: the system's temp)")
    args = parser.parse_args(argv)
    x, y, starts = _table(args.series, args.length)
    n = starts.size
    with tempfile.TemporaryDirectory(prefix="pgpf-bench-wl-", dir=args.tmp) as tmp:
        a, b = Path(tmp, "batches"), Path(tmp, "starts")
        a.mkdir()
        b.mkdir()
        writes: dict[str, list[float]] = {"batches": [], "starts": []}
        reads: dict[str, list[float]] = {"batches": [], "starts": []}
        for r in range(args.rounds):
            for name in ("batches", "starts")[:: 1 if r % 2 == 0 else -1]:
                if name == "batches":
                    writes[name].append(write_batches(a, x, y, starts))
                else:
                    writes[name].append(write_starts(b, x, y, starts))
        read_batches(a, n)
        read_starts(b, n)  # warm
        for r in range(args.rounds):
            for name in ("batches", "starts")[:: 1 if r % 2 == 0 else -1]:
                reads[name].append(read_batches(a, n) if name == "batches" else read_starts(b, n))
        check = np.empty((BATCH, WINDOW, 2), np.float32)
        with (a / "x").open("rb") as f:
            f.readinto(memoryview(check).cast("B"))
        assert np.array_equal(check, _runs(x)[starts[:BATCH]].view(np.float32).reshape(check.shape))
        sizes = {"batches": _size(a, ("x", "y")), "starts": _size(b, ("rows_x", "rows_y", "starts"))}
    w = {k: statistics.median(v) for k, v in writes.items()}
    rd = {k: statistics.median(v) for k, v in reads.items()}
    print(f"{n:,} windows of {WINDOW} rows, batches of {BATCH}; medians of {args.rounds} rounds")
    print("| layout | bytes | write + sync | read, samples/s | read vs batches |")
    print("|---|--:|--:|--:|--:|")
    for k in ("batches", "starts"):
        print(f"| {k} | {sizes[k] / 1e6:,.1f} MB | {w[k]:.3f} s | {n / rd[k]:,.0f} | {rd['batches'] / rd[k]:.2f}x |")


if __name__ == "__main__":
    main()
