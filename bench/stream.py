"""The STREAM benchmark: ``EpochStream`` against ``EpochDataset`` and a plain ``preadv`` (issue #12).

``EPOCHS`` epochs of small batches (256 x 100 float32, 100 KiB: the size where per-batch overhead shows)
are written straight through :class:`pgprefetch.write.files.writer.EpochWriter` (no PostgreSQL), page cache warm. Each
variant reads all of them, batch by batch, and copies every batch into one buffer allocated once (the
stand-in for the copy to a GPU), except where the read itself is the copy:

- *raw*: each shard file opened once, ``os.preadv`` of each batch into a reused buffer (no copy after).
- *dataset*: ``for batch in EpochDataset(store, e)``, epoch after epoch, + copy.
- *stream*: ``for batch in EpochStream(store, 0, EPOCHS)`` + copy.
- *dataset k=2*: a ``DataLoader(EpochDataset(...), num_workers=2)`` per epoch + copy;
  *stream k=2*: one ``DataLoader(EpochStream(...), num_workers=2)`` for all epochs + copy.
- *micro-batches*: the stream at ``batch_size = 64`` (a quarter of the stored size: views) + copy; and at
  ``512`` (two stored batches: a view inside a shard file, one copy across two).
- *stream, buffers=3*: ``EpochStream(..., buffers=3)`` reads each batch with one ``preadv`` into a ring of
  reused buffers; nothing more is copied (like *raw*). *read_into*: ``ds.read_into(i, buffers)`` in a loop.

Variants take turns, ``PASSES`` rounds in a rotating order; each one's median pass is reported. The epoch
hand-over is timed in the *stream* passes: the time from the last batch of an epoch to the first of the
next (which is already published: opening it, recording the consumer) less the median time between two
batches of an epoch. ``python -m bench.stream`` runs it alone.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from pgprefetch import EpochDataset, EpochStream
from pgprefetch.store.open import open_store

from . import log
from .reader import BATCH_SIZE, aligned, build_epoch, read_plan

EPOCHS = 4
EPOCH_BYTES = 256 << 20
QUICK_EPOCH_BYTES = 16 << 20
SAMPLE_SHAPE = (100,)
PASSES = 5
BEGIN = "<!-- stream bench: begin -->"
END = "<!-- stream bench: end -->"

Batches = Iterable[dict[str, torch.Tensor]]


@dataclass
class StreamResults:
    batch_bytes: int
    n_batches: int  # over all epochs, at the stored size
    seconds: dict[str, list[float]] = field(default_factory=dict)
    handover_s: list[float] = field(default_factory=list)  # each epoch boundary of each stream pass
    gap_s: float = 0.0  # median time between two batches of an epoch, in the stream passes
    total_s: float = 0.0

    def gbs(self, name: str) -> float:
        return self.n_batches * self.batch_bytes / statistics.median(self.seconds[name]) / 1e9

    def times(self, name: str, base: str) -> float:
        return self.gbs(name) / self.gbs(base)


def copied(batches: Batches, out: torch.Tensor) -> float:
    """Seconds to copy every batch into ``out`` (field ``x``)."""
    start = time.perf_counter()
    for batch in batches:
        t = batch["x"]
        out[: t.shape[0]].copy_(t)
    return time.perf_counter() - start


def untouched(batches: Batches) -> float:
    """Seconds to go through the batches (already copied by the read)."""
    start = time.perf_counter()
    for _ in batches:
        pass
    return time.perf_counter() - start


def raw_pass(plans: list[list[tuple[str, list[int]]]], nbytes: int, buf: memoryview) -> float:
    start = time.perf_counter()
    for plan in plans:
        for path, offsets in plan:
            fd = os.open(path, os.O_RDONLY)
            try:
                for offset in offsets:
                    os.preadv(fd, [buf], offset)
            finally:
                os.close(fd)
    return time.perf_counter() - start


def datasets(store: Path, **kwargs: object) -> Batches:
    for epoch in range(EPOCHS):
        yield from EpochDataset(store, epoch, consumer=None, **kwargs)  # type: ignore[arg-type]


def loaders(store: Path) -> Batches:
    for epoch in range(EPOCHS):
        yield from DataLoader(EpochDataset(store, epoch, consumer=None), batch_size=None, num_workers=2)


def read_into(store: Path) -> float:
    start = time.perf_counter()
    for epoch in range(EPOCHS):
        ds = EpochDataset(store, epoch, consumer=None)
        buffers = ds.new_buffers()
        for i in range(len(ds)):
            ds.read_into(i, buffers)
    return time.perf_counter() - start


def timed_stream(store: Path, out: torch.Tensor, results: StreamResults) -> float:
    """A *stream* pass that also notes the time of each batch, for the hand-over."""
    stamps: list[float] = []
    start = time.perf_counter()
    for batch in EpochStream(store, 0, EPOCHS, consumer="bench"):
        t = batch["x"]
        out[: t.shape[0]].copy_(t)
        stamps.append(time.perf_counter())
    seconds = time.perf_counter() - start
    per_epoch = len(stamps) // EPOCHS
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    inner = [g for i, g in enumerate(gaps) if (i + 1) % per_epoch]
    results.gap_s = statistics.median(inner)
    results.handover_s += [gaps[e * per_epoch - 1] - results.gap_s for e in range(1, EPOCHS)]
    return seconds


def run(epoch_bytes: int = EPOCH_BYTES, passes: int = PASSES) -> StreamResults:
    started = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="pgpf-bench-stream-"))
    try:
        backend = open_store(folder / "store")
        backend.create()
        batch_bytes = BATCH_SIZE * SAMPLE_SHAPE[0] * 4
        per_epoch = -(-epoch_bytes // batch_bytes)
        for epoch in range(EPOCHS):
            build_epoch(backend, epoch, BATCH_SIZE, SAMPLE_SHAPE, per_epoch)
        store = folder / "store"
        plans = [read_plan(store, epoch)[0] for epoch in range(EPOCHS)]
        results = StreamResults(batch_bytes=batch_bytes, n_batches=per_epoch * EPOCHS)
        log(f"stream: {EPOCHS} epochs of {per_epoch:,} batches of {batch_bytes / 1024:g} KiB, page cache warm")
        buf = memoryview(aligned(batch_bytes))
        out = torch.from_numpy(aligned(batch_bytes * 2)).view(torch.float32).view(2 * BATCH_SIZE, *SAMPLE_SHAPE)
        check(store)
        raw_pass(plans, batch_bytes, buf)  # untimed: warms the page cache
        variants: dict[str, Callable[[], float]] = {
            "raw": lambda: raw_pass(plans, batch_bytes, buf),
            "dataset": lambda: copied(datasets(store), out),
            "stream": lambda: timed_stream(store, out, results),
            "dataset k=2": lambda: copied(loaders(store), out),
            "stream k=2": lambda: copied(
                DataLoader(EpochStream(store, 0, EPOCHS, consumer=None), batch_size=None, num_workers=2), out
            ),
            "stream, batch 64": lambda: copied(EpochStream(store, 0, EPOCHS, batch_size=64, consumer=None), out),
            "stream, batch 512": lambda: copied(EpochStream(store, 0, EPOCHS, batch_size=512, consumer=None), out),
            "stream, buffers=3": lambda: untouched(EpochStream(store, 0, EPOCHS, buffers=3, consumer=None)),
            "read_into": lambda: read_into(store),
        }
        names = list(variants)
        results.seconds = {name: [] for name in names}
        for p in range(passes):
            for name in names[p % len(names) :] + names[: p % len(names)]:  # rotate who goes first
                results.seconds[name].append(variants[name]())
        results.total_s = time.perf_counter() - started
        log(summary(results))
        return results
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def check(store: Path) -> None:
    """The stream hands out exactly the datasets' batches, at every size measured."""
    whole = torch.cat([b["x"] for b in datasets(store)])
    for kwargs in ({}, {"batch_size": 64}, {"batch_size": 512}):
        streamed = torch.cat([b["x"].clone() for b in EpochStream(store, 0, EPOCHS, consumer=None, **kwargs)])  # type: ignore[arg-type]
        if not torch.equal(streamed, whole[: len(streamed)]):
            raise RuntimeError(f"stream {kwargs}: batches differ from the datasets'")
    ring = torch.cat([b["x"].clone() for b in EpochStream(store, 0, EPOCHS, buffers=3, consumer=None)])
    if not torch.equal(ring, whole):
        raise RuntimeError("stream with buffers: batches differ from the datasets'")


def summary(r: StreamResults) -> str:
    parts = [f"{name} {r.gbs(name):.2f} GB/s" for name in r.seconds]
    handover = statistics.median(r.handover_s) * 1e3
    return (
        "  stream: "
        + ", ".join(parts)
        + f"; stream/dataset {r.times('stream', 'dataset'):.2f}x, k=2 {r.times('stream k=2', 'dataset k=2'):.2f}x, "
        f"buffers=3/raw {r.times('stream, buffers=3', 'raw'):.2f}x, hand-over median {handover:.2f} ms "
        f"(max {max(r.handover_s) * 1e3:.2f} ms)"
    )


def _verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def render(r: StreamResults, *, revision: str = "") -> str:
    handover = statistics.median(r.handover_s) * 1e3
    size = f"{r.batch_bytes / 1024:g} KiB"
    stream0, stream2 = r.times("stream", "dataset"), r.times("stream k=2", "dataset k=2")
    small = r.times("stream, buffers=3", "raw")
    lines = [
        BEGIN,
        f"## EpochStream ({EPOCHS} epochs of {r.n_batches // EPOCHS:,} batches of {size}, page cache warm)",
        "",
        f"`python -m bench.stream`{f' at {revision}' if revision else ''}; medians of {len(r.seconds['raw'])} "
        f"passes in rotating order, {r.total_s:.0f} s in all. Every variant copies each batch into one buffer "
        "except *raw*, *buffers=3* and *read_into*, whose read is the copy.",
        "",
        "| variant | GB/s | against |",
        "|---|--:|---|",
    ]
    against = {
        "dataset": ("raw", None),
        "stream": ("dataset", 0.9),
        "dataset k=2": ("dataset", None),
        "stream k=2": ("dataset k=2", 0.9),
        "stream, batch 64": ("stream", None),
        "stream, batch 512": ("stream", None),
        "stream, buffers=3": ("raw", 0.8),
        "read_into": ("raw", None),
    }
    for name in r.seconds:
        base, target = against.get(name, (None, None))
        versus = f"{r.times(name, base):.2f}x {base}" if base else "baseline"
        if target:
            versus += f" (target >= {target}x: {_verdict(r.times(name, base) >= target)})"
        lines.append(f"| {name} | {r.gbs(name):.2f} | {versus} |")
    lines += [
        "",
        f"- EpochStream against EpochDataset: {stream0:.2f}x with `num_workers=0`, {stream2:.2f}x with 2 workers "
        "(one DataLoader for all epochs against one per epoch: the stream's workers start once).",
        f"- Small batches: a ring of reused buffers reads at {small:.2f}x a raw `preadv` "
        f"(target >= 0.8x: {_verdict(small >= 0.8)}).",
        f"- Epoch hand-over (last batch of epoch N to the first of N+1, published): median {handover:.2f} ms, "
        f"max {max(r.handover_s) * 1e3:.2f} ms over {len(r.handover_s)} boundaries, beyond the "
        f"{r.gap_s * 1e6:.0f} us between two batches (target <= 50 ms: {_verdict(max(r.handover_s) <= 0.05)}).",
        END,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="EpochStream against EpochDataset and preadv")
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_EPOCH_BYTES >> 20} MiB epochs, 2 passes")
    args = parser.parse_args(argv)
    results = run(QUICK_EPOCH_BYTES if args.quick else EPOCH_BYTES, 2 if args.quick else PASSES)
    print(render(results))


if __name__ == "__main__":
    main()
