"""The READER benchmark: ``EpochDataset`` against a plain ``preadv`` of the same bytes, page cache warm.

Two epochs are written straight through :class:`pgprefetch.write.files.writer.EpochWriter` (no PostgreSQL): *small*
batches (256 x 100 float32, 100 KiB) and *large* ones (256 x 4096 float32, 4 MiB), about 1 GiB each. Per
epoch, three variants read every batch of field ``x`` into a buffer allocated once:

- *raw*: each shard file opened once, ``os.preadv`` of each batch's byte range (from the shard index)
  into a reused buffer: what any reader of these bytes must at least pay.
- *ds[i]+copy*: ``out["x"][:n].copy_(t)`` for every tensor of ``ds[i]``, ``i`` over the epoch.
- *to_device(cpu)*: the same copy for every batch ``ds.to_device("cpu")`` yields (mapped views). A copy,
  not a one-element sum: summing one element would touch one page of 25 and leave the rest unread.
- *DataLoader k*: the same copy for every batch of ``DataLoader(ds, batch_size=None, num_workers=k)``, for
  k = 0 and 2 (a new DataLoader per pass: worker start-up included), and k = 2 with ``persistent_workers``
  (one DataLoader, warmed by an untimed pass: the steady state).
- *ds[i]+copy, 1 thread*: *ds[i]+copy* with ``torch.set_num_threads(1)``. *raw* is one thread's ``preadv``
  (the kernel copies on the calling thread), while torch's ``copy_`` of a large batch runs on its intra-op
  threads: this variant compares the two at equal threads.

A reader pass opens a fresh ``EpochDataset`` inside the clock (manifest, layouts, and mappings made and
torn down: the cost of an epoch), the raw pass opens and closes its files inside it too. One untimed raw
pass warms the page cache, then the variants take turns, ``PASSES`` rounds in a rotating order; each
variant's median pass is reported. The first-batch latency is the median of ``LATENCY_REPEATS`` times
from the ``EpochDataset(...)`` call to ``ds[0]``'s tensors copied out (every byte touched).
"""

from __future__ import annotations

import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from pgprefetch import EpochDataset
from pgprefetch._version import __version__
from pgprefetch.store.base import FORMAT_VERSION, ArraySpec, Store, epoch_name
from pgprefetch.store.layout import ArrayLayout
from pgprefetch.store.open import open_store
from pgprefetch.write.files.writer import EpochWriter

from . import log
from .report import ReaderRow

EPOCH_BYTES = 1 << 30  # 1.07 GB of field bytes per epoch
QUICK_EPOCH_BYTES = 64 << 20
BATCH_SIZE = 256
CASES = {"small": (100,), "large": (4096,)}  # sample shapes: 100 KiB and 4 MiB batches of float32
PASSES = 5
LATENCY_REPEATS = 5
FIELD = "x"


def manifest(epoch: int, batch_size: int, n_batches: int, sample_shape: tuple[int, ...]) -> dict:
    """A manifest like the dump's (``pgprefetch.write.manifest.epoch_manifest``), with what the reader reads."""
    n_samples = n_batches * batch_size
    return {
        "format_version": FORMAT_VERSION,
        "pgprefetch_version": __version__,
        "epoch": epoch,
        "seed": 0,
        "batch_size": batch_size,
        "n_batches": n_batches,
        "n_samples": n_samples,
        "drop_last": True,
        "n_keys": n_samples,
        "fields": {FIELD: {"dtype": "float32", "shape": list(sample_shape), "columns": [FIELD]}},
        "key_columns": ["id"],
        "compression": "none",
        "bytes": n_samples * (math.prod(sample_shape) * 4 + 8),
        "complete": True,
    }


def build_epoch(store: Store, epoch: int, batch_size: int, sample_shape: tuple[int, ...], n_batches: int) -> None:
    """Write and publish an uncompressed epoch of ``n_batches`` float32 batches (and int64 keys)."""
    writer = EpochWriter(
        store,
        epoch,
        n_batches=n_batches,
        batch_size=batch_size,
        arrays=[ArraySpec(FIELD, np.dtype("float32"), sample_shape), ArraySpec("keys", np.dtype("int64"), (1,))],
        compression="none",
        identity={"bench": "reader", "n_keys": n_batches * batch_size},
    )
    try:
        base = np.random.default_rng(epoch).standard_normal((batch_size, *sample_shape), dtype=np.float32)
        x = np.empty_like(base)
        keys = np.empty((batch_size, 1), dtype=np.int64)
        for b in range(n_batches):
            np.add(base, np.float32(b), out=x)  # different bytes in every batch, cheap to make
            keys[:, 0] = np.arange(b * batch_size, (b + 1) * batch_size)
            writer.write_batch(b, {FIELD: x, "keys": keys})
        writer.publish(manifest(epoch, batch_size, n_batches, sample_shape))
    except BaseException:
        writer.discard()
        raise


def read_plan(store: Path, epoch: int) -> tuple[list[tuple[str, list[int]]], int]:
    """The byte ranges the reader serves for ``x``: ``[(shard file, [batch offsets])]`` in batch order."""
    layout = ArrayLayout.read(store / epoch_name(epoch) / FIELD)
    if not (layout.raw and layout.sharded):
        raise RuntimeError(f"{layout.path}: expected raw sharded batches")
    plan: list[tuple[str, list[int]]] = []
    index = None
    for g in range(layout.n_batches):
        path, slot = layout.file(g)
        if not plan or plan[-1][0] != str(path):
            with open(path, "rb") as f:
                f.seek(-layout.index_bytes, os.SEEK_END)
                index = layout.shard_index(np.frombuffer(f.read(layout.index_bytes), dtype=np.uint8)).copy()
            plan.append((str(path), []))
        if index is None or int(index[slot, 1]) != layout.batch_bytes:
            raise RuntimeError(f"{path}: batch {g} is not {layout.batch_bytes} bytes")
        plan[-1][1].append(int(index[slot, 0]))
    return plan, layout.batch_bytes


def aligned(nbytes: int, align: int = 4096) -> np.ndarray:
    """``nbytes`` zeroed bytes starting on a page boundary.

    Both raw and reader copy into such a buffer: here ``preadv`` into a buffer at page + 16 bytes (where
    glibc puts a large numpy array) runs at half the speed of one at page + 0 or + 64 (8.5 vs 19 GB/s).
    """
    block = np.zeros(nbytes + align, dtype=np.uint8)
    start = -block.ctypes.data % align
    return block[start : start + nbytes]


def raw_pass(plan: list[tuple[str, list[int]]], nbytes: int, buf: np.ndarray) -> float:
    """Seconds to ``preadv`` every batch into ``buf``, each shard file opened once."""
    view = [memoryview(buf)[:nbytes]]
    start = time.perf_counter()
    for path, offsets in plan:
        fd = os.open(path, os.O_RDONLY)
        try:
            for offset in offsets:
                if os.preadv(fd, view, offset) != nbytes:
                    raise RuntimeError(f"short read in {path} at {offset}")
        finally:
            os.close(fd)
    return time.perf_counter() - start


def getitem_pass(store: Path, epoch: int, out: dict[str, torch.Tensor]) -> float:
    """Seconds to open the epoch and copy ``ds[i]`` into ``out`` for every ``i`` (and drop the dataset)."""
    start = time.perf_counter()
    ds = EpochDataset(store, epoch)
    for i in range(len(ds)):
        for name, t in ds[i].items():
            out[name][: t.shape[0]].copy_(t)
    del ds, t
    return time.perf_counter() - start


def one_thread(fn: Callable[[], float]) -> float:
    """``fn()`` with torch limited to one intra-op thread (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def to_device_pass(store: Path, epoch: int, out: dict[str, torch.Tensor]) -> float:
    """Seconds to open the epoch and copy every batch of ``ds.to_device("cpu")`` into ``out``."""
    start = time.perf_counter()
    ds = EpochDataset(store, epoch)
    for batch in ds.to_device("cpu"):
        for name, t in batch.items():
            out[name][: t.shape[0]].copy_(t)
    del ds, batch, t
    return time.perf_counter() - start


def loader_pass(store: Path, epoch: int, out: dict[str, torch.Tensor], workers: int) -> float:
    """Seconds to open the epoch and copy every batch of a new ``DataLoader(ds, num_workers=workers)``."""
    start = time.perf_counter()
    ds = EpochDataset(store, epoch, consumer=None)
    for batch in DataLoader(ds, batch_size=None, num_workers=workers):
        for name, t in batch.items():
            out[name][: t.shape[0]].copy_(t)
    del ds, batch, t
    return time.perf_counter() - start


def steady_loader(store: Path, epoch: int, out: dict[str, torch.Tensor]) -> Callable[[], float]:
    """A pass over one ``DataLoader(num_workers=2, persistent_workers=True)``, warmed by an untimed pass."""
    loader = DataLoader(
        EpochDataset(store, epoch, consumer=None), batch_size=None, num_workers=2, persistent_workers=True
    )

    def one_pass() -> float:
        start = time.perf_counter()
        for batch in loader:
            for name, t in batch.items():
                out[name][: t.shape[0]].copy_(t)
        return time.perf_counter() - start

    one_pass()
    return one_pass


def first_batch(store: Path, epoch: int, out: dict[str, torch.Tensor]) -> float:
    """Seconds from ``EpochDataset(...)`` to ``ds[0]``'s tensors copied into ``out`` (every byte read)."""
    start = time.perf_counter()
    ds = EpochDataset(store, epoch)
    for name, t in ds[0].items():
        out[name][: t.shape[0]].copy_(t)
    seconds = time.perf_counter() - start
    del ds, t
    return seconds


def check(store: Path, epoch: int, plan: list[tuple[str, list[int]]], nbytes: int, buf: np.ndarray) -> None:
    """The reader returns the bytes the raw plan reads (first, middle and last batch)."""
    ds = EpochDataset(store, epoch)
    flat = [(path, offset) for path, offsets in plan for offset in offsets]
    for i in sorted({0, len(flat) // 2, len(flat) - 1}):
        path, offset = flat[i]
        with open(path, "rb") as f:
            f.seek(offset)
            f.readinto(memoryview(buf)[:nbytes])
        if ds[i][FIELD].numpy().tobytes() != buf[:nbytes].tobytes():
            raise RuntimeError(f"batch {i} of epoch {epoch}: the reader's bytes differ from the file's")


def measure_case(store: Path, epoch: int, label: str, sample_shape: tuple[int, ...]) -> ReaderRow:
    """Warm pass, first-batch latency, then the three variants interleaved over ``PASSES`` rounds."""
    plan, nbytes = read_plan(store, epoch)
    n_batches = sum(len(offsets) for _, offsets in plan)
    buf = aligned(nbytes)
    out = {FIELD: torch.from_numpy(aligned(nbytes)).view(torch.float32).view(BATCH_SIZE, *sample_shape)}
    check(store, epoch, plan, nbytes, buf)
    raw_pass(plan, nbytes, buf)  # untimed: warms the page cache (the epoch was just written, but still)
    latency = [first_batch(store, epoch, out) for _ in range(LATENCY_REPEATS)]
    variants: dict[str, Callable[[], float]] = {
        "raw": lambda: raw_pass(plan, nbytes, buf),
        "getitem": lambda: getitem_pass(store, epoch, out),
        "to_device": lambda: to_device_pass(store, epoch, out),
        "getitem_1t": lambda: one_thread(lambda: getitem_pass(store, epoch, out)),
        "loader 0": lambda: loader_pass(store, epoch, out, 0),
        "loader 2": lambda: loader_pass(store, epoch, out, 2),
        "loader 2 persistent": steady_loader(store, epoch, out),
    }
    names = list(variants)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for p in range(PASSES):
        for name in names[p % len(names) :] + names[: p % len(names)]:  # rotate who goes first
            seconds[name].append(variants[name]())
    row = ReaderRow(
        label=label,
        batch_size=BATCH_SIZE,
        sample_shape=sample_shape,
        batch_bytes=nbytes,
        n_batches=n_batches,
        raw_s=seconds["raw"],
        getitem_s=seconds["getitem"],
        to_device_s=seconds["to_device"],
        first_batch_s=latency,
        getitem_1t_s=seconds["getitem_1t"],
        loader_s={name.removeprefix("loader "): seconds[name] for name in names if name.startswith("loader ")},
    )
    log(
        f"  {label} ({nbytes / 1e3:,.0f} KB x {n_batches:,}): raw {row.raw_gbs:.2f} GB/s, "
        f"ds[i]+copy {row.getitem_gbs:.2f} GB/s ({row.getitem_gbs / row.raw_gbs:.2f}x), "
        f"to_device(cpu) {row.to_device_gbs:.2f} GB/s ({row.to_device_gbs / row.raw_gbs:.2f}x), "
        f"ds[i]+copy on 1 thread {row.getitem_1t_gbs:.2f} GB/s ({row.getitem_1t_gbs / row.raw_gbs:.2f}x), "
        f"DataLoader k=0 {row.loader_gbs('0'):.2f}, k=2 {row.loader_gbs('2'):.2f} "
        f"({row.loader_gbs('2') / row.loader_gbs('0'):.2f}x), k=2 persistent {row.loader_gbs('2 persistent'):.2f} GB/s "
        f"({row.loader_gbs('2 persistent') / row.loader_gbs('0'):.2f}x), "
        f"first batch {statistics.median(latency) * 1e3:.1f} ms; passes (s): "
        + "; ".join(f"{k} " + " ".join(f"{s:.3f}" for s in v) for k, v in seconds.items())
    )
    return row


def run(epoch_bytes: int = EPOCH_BYTES) -> list[ReaderRow]:
    """Build both epochs in a temp folder, measure them, delete them; the rows in CASES order."""
    folder = Path(tempfile.mkdtemp(prefix="pgpf-bench-reader-"))
    rows = []
    try:
        store = open_store(folder / "store")
        store.create()
        for epoch, (label, shape) in enumerate(CASES.items()):
            batch_bytes = BATCH_SIZE * math.prod(shape) * 4
            n_batches = -(-epoch_bytes // batch_bytes)
            started = time.perf_counter()
            build_epoch(store, epoch, BATCH_SIZE, shape, n_batches)
            log(
                f"reader: built {label} epoch, {n_batches:,} batches of {batch_bytes:,} B "
                f"({n_batches * batch_bytes / 1e9:.2f} GB) in {time.perf_counter() - started:.1f} s"
            )
        for epoch, (label, shape) in enumerate(CASES.items()):
            rows.append(measure_case(store.path, epoch, label, shape))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return rows
