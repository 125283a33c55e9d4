"""``python -m bench.gpu``: host-to-device GB/s of ``ds.to_device("cuda")`` against a plain pinned copy.

Needs a CUDA GPU; without one it says so and exits (status 1) before writing anything. For each batch
shape (default: 256 x 4096 float32 = 4 MiB batches, then 256 x 100 = 100 KiB), an epoch of ``--gb`` GiB
is written in a temp folder with :class:`pgprefetch.write.files.writer.EpochWriter` (no PostgreSQL), read once
untimed (page cache warm), then measured, each run a whole epoch, ``--passes`` rounds in turn, median:

- *to_device*: ``for batch in ds.to_device("cuda", prefetch=2)``, a synchronize at the end.
- *pinned copy_*: the plain way, same bytes: one pinned host buffer (the size of the epoch, so that no
  batch waits for a slot to be free), ``buf[i].copy_(ds[i]["x"])`` then ``buf[i].to("cuda",
  non_blocking=True)`` per batch, a synchronize at the end. The target: to_device >= 0.8x this.
- *H2D only* (pinned buffer -> device) and *host copy only* (mapped file -> pinned): the two halves.
- Overlap with compute: a step of ``k`` square bf16 matmuls (``--matmul``, halved while one lasts over
  twice a batch's copy; ``k`` so that a step lasts about as long as a copy) timed alone over
  ``n_batches`` steps, the epoch of copies alone, and both as a training loop runs them
  (``for batch in ds.to_device(...): step(batch)``).
  ``hidden = (compute + copies - loop) / min(compute, copies)``: 1.0 when the copies are fully hidden
  behind the steps, 0 when the loop takes their sum.

``--cpu-smoke`` runs the same loops on the CPU with tiny sizes (no pinning, no CUDA) to check the script
itself where there is no GPU; its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pgprefetch import EpochDataset
from pgprefetch.store.open import open_store

from . import log as _log
from .reader import BATCH_SIZE, FIELD, build_epoch, raw_pass, read_plan

TARGET = 0.8


def log(message: str) -> None:
    """A progress line, tagged as this bench's."""
    _log(message, "bench.gpu")


@dataclass
class Case:
    """What one batch shape measured (seconds per pass, medians taken at render time)."""

    features: int
    batch_bytes: int
    n_batches: int
    to_device: list[float]
    pinned: list[float]
    h2d: list[float]
    host: list[float]
    matmul: str  # the step: "k x size^2"
    compute: list[float]
    loop: list[float]

    @property
    def epoch_bytes(self) -> int:
        """Bytes of field ``x`` moved per pass."""
        return self.batch_bytes * self.n_batches

    def gbs(self, seconds: list[float]) -> float:
        """GB/s (10^9 bytes) of the median pass."""
        return self.epoch_bytes / statistics.median(seconds) / 1e9


class Device:
    """CUDA, or the CPU standing in for it in ``--cpu-smoke`` (no pinning, synchronize does nothing)."""

    def __init__(self, smoke: bool) -> None:
        self.smoke = smoke
        self.device = torch.device("cpu" if smoke else "cuda")

    def sync(self) -> None:
        if not self.smoke:
            torch.cuda.synchronize(self.device)

    def host_buffer(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A float32 host buffer, pinned (page-locked) on CUDA."""
        return torch.empty(shape, dtype=torch.float32, pin_memory=not self.smoke)


def timed(dev: Device, fn: Callable[[], object]) -> float:
    """Seconds of ``fn()`` up to the device being idle again."""
    dev.sync()
    start = time.perf_counter()
    fn()
    dev.sync()
    return time.perf_counter() - start


def to_device_epoch(store: Path, epoch: int, dev: Device, prefetch: int, step: Step | None) -> None:
    """One epoch through ``ds.to_device`` (a fresh dataset); ``step(batch["x"])`` on each batch when given."""
    ds = EpochDataset(store, epoch)
    for batch in ds.to_device(dev.device, prefetch=prefetch):
        if step is not None:
            step(batch[FIELD])


def pinned_epoch(store: Path, epoch: int, dev: Device, pinned: torch.Tensor) -> None:
    """The plain way: mapped batch -> its slice of one pinned buffer -> ``.to(device, non_blocking=True)``."""
    ds = EpochDataset(store, epoch)
    for i in range(len(ds)):
        t = ds[i][FIELD]
        staging = pinned[i, : t.shape[0]]
        staging.copy_(t)
        staging.to(dev.device, non_blocking=True)


def h2d_epoch(dev: Device, pinned: torch.Tensor) -> None:
    """Pinned host -> device only, batch by batch: the transfer half of the pinned copy."""
    for i in range(pinned.shape[0]):
        pinned[i].to(dev.device, non_blocking=True)


def host_epoch(store: Path, epoch: int, pinned: torch.Tensor) -> None:
    """Mapped file -> pinned host only: the CPU half of the pinned copy."""
    ds = EpochDataset(store, epoch)
    for i in range(len(ds)):
        t = ds[i][FIELD]
        pinned[i, : t.shape[0]].copy_(t)


class Step:
    """A dummy training step: a reduction of the batch (so it depends on the copy), then k square bf16 matmuls."""

    def __init__(self, dev: Device, size: int) -> None:
        self.dev, self.size, self.k = dev, size, 1
        self.a = torch.randn(size, size, device=dev.device, dtype=torch.bfloat16)
        self.b = torch.randn(size, size, device=dev.device, dtype=torch.bfloat16)
        self.c = torch.empty(size, size, device=dev.device, dtype=torch.bfloat16)
        self.acc = torch.zeros((), device=dev.device)

    def matmul_seconds(self) -> float:
        """Seconds of one matmul (after a warm-up: cuBLAS picks its kernel on the first call)."""
        for _ in range(3):
            torch.mm(self.a, self.b, out=self.c)
        reps = 20
        return timed(self.dev, lambda: [torch.mm(self.a, self.b, out=self.c) for _ in range(reps)]) / reps

    def __call__(self, x: torch.Tensor) -> None:
        self.acc.add_(x[0, 0])
        for _ in range(self.k):
            torch.mm(self.a, self.b, out=self.c)


def calibrate(dev: Device, size: int, per_batch: float) -> tuple[Step, float]:
    """A step lasting about ``per_batch`` seconds: halve the matmul while one is over twice that, then set k."""
    step = Step(dev, size)
    one = step.matmul_seconds()
    while one > 2 * per_batch and step.size > 256:
        step = Step(dev, step.size // 2)
        one = step.matmul_seconds()
    step.k = max(1, round(per_batch / one))
    return step, one


def measure(store: Path, epoch: int, features: int, dev: Device, args: argparse.Namespace) -> Case:
    plan, nbytes = read_plan(store, epoch)
    raw_pass(plan, nbytes, np.empty(nbytes, dtype=np.uint8))  # untimed: page cache warm
    n = sum(len(offsets) for _, offsets in plan)
    pinned = dev.host_buffer((n, BATCH_SIZE, features))
    # Warm-up (CUDA context, allocator, mappings), then a step lasting about as long as one batch's copy.
    to_device_epoch(store, epoch, dev, args.prefetch, None)
    pinned_epoch(store, epoch, dev, pinned)
    copies = timed(dev, lambda: to_device_epoch(store, epoch, dev, args.prefetch, None))
    step, one = calibrate(dev, args.matmul, copies / n)
    x_static = torch.zeros((BATCH_SIZE, features), device=dev.device)
    log(
        f"  {features} features: {n} batches of {nbytes / 2**20:.2f} MiB, to_device {copies / n * 1e6:.0f} us/batch; "
        f"step: {step.k} x {step.size}^2 bf16 matmul of {one * 1e6:.0f} us"
    )

    def compute_epoch() -> None:
        for _ in range(n):
            step(x_static)

    runs: dict[str, Callable[[], object]] = {
        "to_device": lambda: to_device_epoch(store, epoch, dev, args.prefetch, None),
        "pinned": lambda: pinned_epoch(store, epoch, dev, pinned),
        "h2d": lambda: h2d_epoch(dev, pinned),
        "host": lambda: host_epoch(store, epoch, pinned),
        "compute": compute_epoch,
        "loop": lambda: to_device_epoch(store, epoch, dev, args.prefetch, step),
    }
    names = list(runs)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for p in range(args.passes):
        for name in names[p % len(names) :] + names[: p % len(names)]:  # rotate who goes first
            seconds[name].append(timed(dev, runs[name]))
    log("  passes (s): " + "; ".join(f"{name} " + " ".join(f"{s:.3f}" for s in v) for name, v in seconds.items()))
    return Case(features, nbytes, n, matmul=f"{step.k} x {step.size}^2", **seconds)


def render(cases: list[Case], args: argparse.Namespace, dev: Device) -> str:
    if dev.smoke:
        where = "CPU smoke run (`--cpu-smoke`): the numbers mean nothing"
    else:
        where = f"{torch.cuda.get_device_name(dev.device)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    out = [
        '# pgprefetch bench.gpu: `to_device("cuda")` against a plain pinned copy',
        "",
        f"{where}; {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads; prefetch={args.prefetch}; "
        f"median of {args.passes} passes, page cache warm; GB/s = 10^9 bytes/s of field `x`.",
        "",
        "| batch | epoch GB | to_device GB/s | pinned copy_ GB/s | to_device/pinned | H2D only GB/s "
        "| host copy only GB/s |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for case in cases:
        ratio = case.gbs(case.to_device) / case.gbs(case.pinned)
        out.append(
            f"| {BATCH_SIZE} x {case.features} float32 ({case.batch_bytes / 2**20:.2f} MiB) "
            f"| {case.epoch_bytes / 1e9:.2f} | {case.gbs(case.to_device):.2f} | {case.gbs(case.pinned):.2f} "
            f"| {ratio:.2f}x | {case.gbs(case.h2d):.2f} | {case.gbs(case.host):.2f} |"
        )
    out += [
        "",
        "Overlap with compute: per batch, one step of k square bf16 matmuls (size halved from "
        f"{args.matmul} while one lasts over twice a batch's copy, then k set so that a step lasts about as long "
        "as one batch's copy); *loop* is `for batch in ds.to_device(...): step(batch)`. "
        "hidden = (compute + copies - loop) / min(compute, copies): 1.00 = copies fully hidden, 0 = serial.",
        "",
        "| batch | step (bf16 matmuls) | compute s | copies s | loop s | compute + copies s | max s | hidden |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for case in cases:
        compute, copies, loop = (statistics.median(s) for s in (case.compute, case.to_device, case.loop))
        hidden = (compute + copies - loop) / min(compute, copies)
        out.append(
            f"| {case.batch_bytes / 2**20:.2f} MiB | {case.matmul} | {compute:.3f} | {copies:.3f} "
            f"| {loop:.3f} | {compute + copies:.3f} | {max(compute, copies):.3f} | {hidden:.2f} |"
        )
    out += ["", "Targets:", ""]
    for case in cases:
        ratio = case.gbs(case.to_device) / case.gbs(case.pinned)
        verdict = "PASS" if ratio >= TARGET else "FAIL"
        out.append(
            f"- {case.batch_bytes / 2**20:.2f} MiB batches: to_device/pinned {ratio:.2f}x >= {TARGET}x: {verdict}"
        )
    return "\n".join(out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0, help="GiB of field x per epoch (default 2)")
    parser.add_argument(
        "--features",
        type=int,
        nargs="+",
        default=[4096, 100],
        help="float32 values per sample, one epoch each (default 4096 100: 4 MiB and 100 KiB batches)",
    )
    parser.add_argument("--prefetch", type=int, default=2, help="to_device's prefetch (default 2)")
    parser.add_argument("--passes", type=int, default=3, help="rounds of every run (default 3)")
    parser.add_argument("--matmul", type=int, default=4096, help="side of the step's square matmul (default 4096)")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny run on the CPU to test this script")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        args.gb, args.matmul, args.passes = min(args.gb, 1 / 64), min(args.matmul, 128), min(args.passes, 2)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        raise SystemExit(
            f"bench.gpu needs a CUDA GPU, and torch.cuda.is_available() is False here (torch {torch.__version__}, "
            f"built for CUDA {torch.version.cuda or 'none'}): nothing measured. `--cpu-smoke` tests the script."
        )
    dev = Device(args.cpu_smoke)
    folder = Path(tempfile.mkdtemp(prefix="pgpf-bench-gpu-"))
    cases = []
    started = time.perf_counter()
    try:
        store = open_store(folder / "store")
        store.create()
        for epoch, features in enumerate(args.features):
            batch_bytes = BATCH_SIZE * features * 4
            n_batches = max(2, math.ceil(args.gb * 2**30 / batch_bytes))
            t = time.perf_counter()
            build_epoch(store, epoch, BATCH_SIZE, (features,), n_batches)
            log(f"built epoch {epoch}: {n_batches} batches of 256 x {features} in {time.perf_counter() - t:.1f} s")
            cases.append(measure(store.path, epoch, features, dev, args))
            shutil.rmtree(store.epoch_path(epoch), ignore_errors=True)  # one epoch on disk at a time
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(render(cases, args, dev))
    log(f"done in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
