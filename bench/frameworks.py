"""The FRAMEWORKS benchmark: the NumPy reader, EpochDataset before and after it, JAX and Grain (issue #26).

Two epochs are written straight through :class:`pgprefetch.write.files.writer.EpochWriter` (no PostgreSQL), page
cache warm: *large* batches (256 x 4096 float32, 4 MiB) and *small* ones (256 x 100, 100 KiB). Every
variant touches every byte of every batch; where the read is not itself a copy, it copies each batch into
one page-aligned buffer, on one thread (as ``preadv`` copies on one):

- *raw*: each shard file opened once, ``os.preadv`` of each batch's bytes into the buffer.
- *EpochArrays*: ``np.copyto`` of each batch of ``EpochArrays(store, e)`` (opened inside the clock).
- *EpochDataset, now* and *EpochDataset, before*: ``out.copy_(ds[i]["x"])`` with ``torch.set_num_threads(1)``
  for every ``i``, each in a child process (``bench/datasetpass.py``) serving passes on request: one runs this
  tree, the other the tree of ``BASELINE`` (the commit before the NumPy core), exported with ``git archive``.
  Both are children, so neither has an advantage of process.
- *device_put inline* and *device_batches*: the same 4 MiB batches to the JAX CPU device, each followed by a
  jitted step that reads all of it, its result waited for (a loss logged every step): ``jax.device_put`` of
  each batch of ``EpochArrays`` before its step, against ``device_batches(EpochArrays, prefetch=2)``.
- *Grain k=0* and *EpochArrays loop*: every batch of ``grain.DataLoader(EpochSource, worker_count=0)``
  (README's sampler: no shuffle, one pass; README's ``ReadOptions(num_threads=0)``, and Grain's default of 16
  reading threads) against ``for batch in EpochArrays``, each batch copied.

The machine is shared and its load drifts, so each comparison runs its two variants back to back, which
one first alternating, ``PASSES`` rounds; a ratio is the median of the rounds' ratios.
``python -m bench.frameworks`` runs it alone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

import numpy as np

from pgprefetch import EpochArrays
from pgprefetch.store.open import open_store

from . import log
from .reader import BATCH_SIZE, aligned, build_epoch, raw_pass, read_plan

BASELINE = "8f96948"  # the last commit before the NumPy reading core (issue #26)
EPOCH_BYTES = {"large": 512 << 20, "small": 64 << 20}
QUICK_EPOCH_BYTES = {"large": 64 << 20, "small": 16 << 20}
SHAPES = {"large": (4096,), "small": (100,)}
PASSES = 9
NOISE = {"device_batches": 0.02}  # "must not cost more than it hides": 1.0x, within the noise of equal work
BEGIN = "<!-- frameworks bench: begin -->"
END = "<!-- frameworks bench: end -->"
HERE = Path(__file__).resolve().parent


@dataclass
class Case:
    """One epoch: seconds per pass of each variant."""

    label: str
    batch_bytes: int
    n_batches: int
    seconds: dict[str, list[float]] = field(default_factory=dict)
    ratios: dict[str, list[float]] = field(default_factory=dict)  # "name/base": base s / name s, per pair

    def gbs(self, name: str) -> float:
        return self.n_batches * self.batch_bytes / statistics.median(self.seconds[name]) / 1e9

    def times(self, name: str, base: str) -> float:
        """The median over the paired passes of name's rate against base's (run back to back)."""
        paired = self.ratios.get(f"{name}/{base}")
        return statistics.median(paired) if paired else self.gbs(name) / self.gbs(base)


@dataclass
class FrameworkResults:
    cases: list[Case] = field(default_factory=list)
    baseline: str = ""  # the commit EpochDataset "before" ran; "" when it could not be exported
    versions: str = ""
    total_s: float = 0.0


# --- the variants ----------------------------------------------------------------------------------------------
def arrays_pass(store: Path, epoch: int, out: np.ndarray) -> float:
    start = time.perf_counter()
    for batch in EpochArrays(store, epoch, consumer=None):
        x = batch["x"]
        np.copyto(out[: x.shape[0]], x)
    return time.perf_counter() - start


def copied(batches: Iterable[dict[str, np.ndarray]], out: np.ndarray) -> float:
    start = time.perf_counter()
    for batch in batches:
        x = batch["x"]
        np.copyto(out[: x.shape[0]], x)
    return time.perf_counter() - start


class Child:
    """A ``bench/datasetpass.py`` process over one epoch, with ``tree`` first on its path; timed passes on request."""

    def __init__(self, tree: Path, store: Path, epoch: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree)}
        script = HERE / "datasetpass.py"
        self.p = subprocess.Popen(
            [sys.executable, str(script), str(store), str(epoch)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),  # not a folder holding another pgprefetch
        )
        assert self.p.stdout is not None
        if self.p.stdout.readline().strip() != "ready":
            raise RuntimeError(f"bench/datasetpass.py with {tree} did not start")

    def __call__(self) -> float:
        assert self.p.stdin is not None
        assert self.p.stdout is not None
        self.p.stdin.write("pass\n")
        self.p.stdin.flush()
        return float(self.p.stdout.readline())

    def close(self) -> None:
        if self.p.stdin:
            self.p.stdin.close()
        self.p.wait(timeout=30)


def export_baseline(folder: Path, revision: str) -> Path | None:
    """``revision``'s ``pgprefetch/`` under ``folder`` (``git archive``), or None without git or the commit."""
    try:
        data = subprocess.run(
            ["git", "-C", str(HERE.parent), "archive", "--format=tar", revision, "pgprefetch"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def jax_variants(store: Path, epoch: int) -> dict[str, Callable[[], float]]:
    import jax

    step = jax.jit(lambda x: (x * 2.0).sum())

    def inline() -> float:
        start = time.perf_counter()
        for batch in EpochArrays(store, epoch, consumer=None):
            step(jax.device_put(batch["x"])).block_until_ready()
        return time.perf_counter() - start

    def ahead() -> float:
        from pgprefetch.jax import device_batches

        start = time.perf_counter()
        for batch in device_batches(EpochArrays(store, epoch, consumer=None), prefetch=2):
            step(batch["x"]).block_until_ready()
        return time.perf_counter() - start

    inline()  # compiles the step
    return {"device_put inline": inline, "device_batches": ahead}


def grain_pass(store: Path, epoch: int, out: np.ndarray, threads: int | None) -> float:
    """A pass of ``grain.DataLoader(EpochSource, worker_count=0)``; ``threads`` None: Grain's ReadOptions."""
    import grain

    from pgprefetch.grain import EpochSource

    start = time.perf_counter()
    source = EpochSource(store, epoch, consumer=None)
    sampler = grain.samplers.IndexSampler(len(source), shuffle=False, num_epochs=1)
    options = None if threads is None else grain.ReadOptions(num_threads=threads, prefetch_buffer_size=0)
    loader = grain.DataLoader(data_source=source, sampler=sampler, worker_count=0, read_options=options)
    copied(loader, out)
    return time.perf_counter() - start


# --- the run ---------------------------------------------------------------------------------------------------
def measure(store: Path, epoch: int, label: str, baseline: Path | None, passes: int) -> Case:
    plan, nbytes = read_plan(store, epoch)
    n_batches = sum(len(offsets) for _, offsets in plan)
    case = Case(label, nbytes, n_batches)
    buf = aligned(nbytes)
    out = aligned(nbytes).view(np.float32).reshape(BATCH_SIZE, -1)
    raw_pass(plan, nbytes, buf)  # untimed: warms the page cache
    if not np.array_equal(
        EpochArrays(store, epoch, consumer=None)[n_batches - 1]["x"].reshape(-1), _last(plan, nbytes)
    ):
        raise RuntimeError(f"{label}: EpochArrays' last batch is not the file's bytes")
    children = {"EpochDataset, now": Child(HERE.parent, store, epoch)}
    if baseline is not None:
        children["EpochDataset, before"] = Child(baseline, store, epoch)
    variants: dict[str, Callable[[], float]] = {
        "raw": lambda: raw_pass(plan, nbytes, buf),
        "EpochArrays": lambda: arrays_pass(store, epoch, out),
        **children,
        "Grain k=0": lambda: grain_pass(store, epoch, out, threads=0),
        "Grain k=0, default ReadOptions": lambda: grain_pass(store, epoch, out, threads=None),
        "EpochArrays loop": lambda: copied(EpochArrays(store, epoch, consumer=None), out),
    }
    if label == "large":
        variants.update(jax_variants(store, epoch))
    pairs = [(name, base) for name, (base, _) in AGAINST.items() if name in variants and base in variants]
    if "EpochDataset, before" in variants:
        pairs.append(("EpochDataset, now", "EpochDataset, before"))
    try:
        case.seconds = {name: [] for name in variants}
        for p in range(passes):  # each comparison's two variants back to back, which one first alternating
            for name, base in pairs:
                first, second = (name, base) if p % 2 else (base, name)
                a, b = variants[first](), variants[second]()
                case.seconds[first].append(a)
                case.seconds[second].append(b)
                ratio = a / b if first == base else b / a  # base seconds / name seconds: name's rate / base's
                case.ratios.setdefault(f"{name}/{base}", []).append(ratio)
    finally:
        for child in children.values():
            child.close()
    log("  frameworks " + summary(case))
    return case


def _last(plan: list[tuple[str, list[int]]], nbytes: int) -> np.ndarray:
    path, offsets = plan[-1]
    with open(path, "rb") as f:
        f.seek(offsets[-1])
        return np.frombuffer(f.read(nbytes), dtype=np.float32)


def run(
    epoch_bytes: dict[str, int] = EPOCH_BYTES, passes: int = PASSES, baseline_rev: str = BASELINE
) -> FrameworkResults:
    started = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="pgpf-bench-frameworks-"))
    results = FrameworkResults()
    try:
        import grain
        import jax

        results.versions = f"jax {jax.__version__}, grain {getattr(grain, '__version__', '?')}"
        baseline = export_baseline(folder / "baseline", baseline_rev)
        results.baseline = baseline_rev if baseline is not None else ""
        if baseline is None:
            log(f"frameworks: cannot export {baseline_rev} with git: no 'before' figures")
        store = open_store(folder / "store")
        store.create()
        for epoch, label in enumerate(SHAPES):
            shape = SHAPES[label]
            batch_bytes = BATCH_SIZE * shape[0] * 4
            build_epoch(store, epoch, BATCH_SIZE, shape, -(-epoch_bytes[label] // batch_bytes))
        for epoch, label in enumerate(SHAPES):
            results.cases.append(measure(folder / "store", epoch, label, baseline, passes))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    results.total_s = time.perf_counter() - started
    return results


# --- the report ------------------------------------------------------------------------------------------------
AGAINST = {  # variant: (baseline, target)
    "EpochArrays": ("raw", 0.9),
    "EpochDataset, now": ("raw", None),
    "EpochDataset, before": ("raw", None),
    "Grain k=0": ("EpochArrays loop", None),
    "Grain k=0, default ReadOptions": ("EpochArrays loop", None),
    "device_batches": ("device_put inline", 1.0),
}


def summary(case: Case) -> str:
    parts = [f"{name} {case.gbs(name):.2f} GB/s" for name in case.seconds]
    ratios = [f"{n}/{b} {case.times(n, b):.2f}x" for n, (b, _) in AGAINST.items() if n in case.seconds]
    if "EpochDataset, before" in case.seconds:
        ratios.append(f"EpochDataset now/before {case.times('EpochDataset, now', 'EpochDataset, before'):.2f}x")
    return f"{case.label} ({case.batch_bytes / 1024:g} KiB x {case.n_batches}): " + ", ".join(parts + ratios)


def _verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"


def render(r: FrameworkResults, *, revision: str = "") -> str:
    lines = [
        BEGIN,
        "## NumPy, JAX and Grain readers (page cache warm)",
        "",
        f"`python -m bench.frameworks`{f' at {revision}' if revision else ''}; {r.versions}; {PASSES} rounds, "
        f"{r.total_s:.0f} s in all. Each ratio pairs the two variants back to back (which one first alternating) "
        "and is the median over the rounds of the pairs' ratios; GB/s is each variant's median pass. Every "
        "variant touches every byte on one thread: *raw* `preadv` into a page-aligned buffer; *EpochArrays* "
        "and the *loop*s `np.copyto` each batch "
        "into one; *EpochDataset* `out.copy_(ds[i]['x'])` with `torch.set_num_threads(1)`, now and at "
        f"{r.baseline or '(no baseline)'} (the commit before the NumPy core), each served by a child process "
        "(`bench/datasetpass.py`); *device_put inline* / *device_batches*: each batch to the JAX CPU device and a "
        "jitted step reading it, waited for every step; *Grain k=0*: `grain.DataLoader(EpochSource, "
        "worker_count=0)` with the README's sampler and `ReadOptions(num_threads=0, prefetch_buffer_size=0)` (and "
        "with Grain's default ReadOptions: 16 reading threads), each batch copied.",
        "",
        "| batch | variant | GB/s | against |",
        "|---|---|--:|---|",
    ]
    for case in r.cases:
        size = f"{case.label} ({case.batch_bytes / 1024:g} KiB)"
        for name in case.seconds:
            base, target = AGAINST.get(name, (None, None))
            versus = f"{case.times(name, base):.2f}x {base}" if base else "baseline"
            if target is not None and (case.label == "large" or name != "EpochArrays"):
                ok = case.times(name, base) >= target - NOISE.get(name, 0.0)
                versus += f" (target >= {target}x: {_verdict(ok)})"
            lines.append(f"| {size} | {name} | {case.gbs(name):.2f} | {versus} |")
    lines.append("")
    for case in r.cases:
        if "EpochDataset, before" in case.seconds:
            after = case.times("EpochDataset, now", "EpochDataset, before")
            lines.append(
                f"- {case.label} batches: EpochDataset after the change {after:.2f}x before it (target >= 0.95x: "
                f"{_verdict(after >= 0.95)}); EpochArrays {case.times('EpochArrays', 'raw'):.2f}x raw against the "
                f"torch reader's {case.times('EpochDataset, now', 'raw'):.2f}x."
            )
    lines.append(
        "- *device_batches* against *device_put inline*: the prefetch must not cost more than it hides (target "
        ">= 1.0x within 2% noise); on the CPU, JAX uses an aligned host array's memory, so neither copies."
    )
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the NumPy reader, EpochDataset before and after, JAX and Grain")
    parser.add_argument("--quick", action="store_true", help="small epochs, 2 passes")
    parser.add_argument("--baseline", default=BASELINE, help=f"the commit to compare EpochDataset with ({BASELINE})")
    args = parser.parse_args(argv)
    results = run(QUICK_EPOCH_BYTES if args.quick else EPOCH_BYTES, 2 if args.quick else PASSES, args.baseline)
    print(render(results))


if __name__ == "__main__":
    main()
