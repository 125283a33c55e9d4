"""``make bench-peers``: pgprefetch's reader beside MosaicML Streaming and LitData, on the same samples.

Run as ``python -m bench.peers`` from the repository root, in the virtual environment ``make bench-peers``
builds (``.venv-peers``, pinned by ``bench/peers-requirements.txt``): Streaming pins numpy below 2.2,
which ``make install``'s environment need not agree with.

Two shapes of float32 samples, 256 to a batch, about ``--epoch-mb`` MB of sample bytes each (default 1024):
*128 KiB* batches (64 x 2 per sample) and *4 MiB* batches (4096 per sample). Per shape, in a temp folder on
local disk:

1. a pgprefetch epoch is written in sample order 0..N-1 (``bench.reader.build_epoch``: ``EpochWriter``, no
   compression), and the same samples, read back from it, are written once as an MDS dataset
   (``streaming.MDSWriter``, an ``ndarray:float32:<shape>`` column, no compression, its default 64 MiB
   shards) and once as a LitData optimized dataset (``litdata.optimize``, 64 MB chunks, no compression, two
   workers keeping the input order);
2. every file of the three is read once (page cache warm), and each reader's first unshuffled batch and a
   few samples taken across the epoch by index are checked against pgprefetch's: the same float32 values;
3. each variant runs one untimed pass, then ``--passes`` timed ones; the median pass is reported. A pass
   opens the dataset inside the clock and copies every batch's tensor into a buffer allocated once (every
   byte touched), ``num_workers=0``:

   - pgprefetch: ``for b in EpochDataset(store, epoch, consumer=None)``, copying ``b["x"]``. Its epochs are
     shuffled when the dump writes them (a fresh permutation per epoch), so its "shuffle on" is the same
     sequential read of the (pre-shuffled) epoch: measured again with passes of its own;
   - Streaming: ``StreamingDataset(local=..., shuffle=..., batch_size=256)`` and
     ``torch.utils.data.DataLoader(batch_size=256, num_workers=0)``;
   - LitData: ``StreamingDataset(dir, shuffle=...)`` and ``litdata.StreamingDataLoader(batch_size=256,
     num_workers=0)``.

A pass stops at the end of the epoch or at the first batch past ``--seconds`` (0: never), so that the
slowest reader's 2 M samples do not take minutes a pass: the rate is then over the part read, which the
table gives as a fraction of the epoch.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from bench import log as _log
from pgprefetch import EpochDataset
from pgprefetch._version import __version__ as pgprefetch_version
from pgprefetch.store.open import open_store

from .reader import aligned, build_epoch

BATCH_SIZE = 256
CASES = {"128 KiB": (64, 2), "4 MiB": (4096,)}  # batch bytes: sample shapes of float32
EPOCH = 0
FIELD = "x"  # the field build_epoch writes
LITDATA_WORKERS = 2  # optimize's worker processes: one per core here
OUT = Path(__file__).with_name("PEERS.md")


def log(message: str) -> None:
    """A progress line, tagged as this bench's."""
    _log(message, "bench-peers")


@dataclass
class Peers:
    """The peers' entry points, imported once."""

    mds_writer: Any
    streaming_dataset: Any
    streaming_version: str
    streaming_import: str  # how streaming was imported: "import streaming", or the torchvision-less way
    litdata: Any


def import_streaming() -> tuple[Any, Any, str, str]:
    """Streaming's ``MDSWriter``, ``StreamingDataset`` and version, and how they were imported.

    ``import streaming`` imports ``streaming.vision`` (its image datasets), which imports torchvision. No
    torchvision here imports beside the CPU build of torch (PyPI's is built against CUDA torch). Where it
    does not import, the package is loaded without running its ``__init__`` (which only re-exports and
    imports ``streaming.vision``, ``.text`` and ``.multimodal``), and ``streaming.base`` is imported as is:
    the writer, dataset and every module they use are Streaming's own, unchanged.
    """
    try:
        import streaming

        return streaming.MDSWriter, streaming.StreamingDataset, streaming.__version__, "import streaming"
    except (ImportError, RuntimeError) as e:  # RuntimeError: "operator torchvision::nms does not exist"
        if "torchvision" not in f"{e!r} {e.__cause__!r} {getattr(e, 'name', '')}":
            raise
        reason = f"{type(e).__name__}: {e}"
    for name in [m for m in sys.modules if m == "streaming" or m.startswith("streaming.")]:
        del sys.modules[name]  # what the failed import left half-initialised
    spec = importlib.util.find_spec("streaming")
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("streaming is not installed")
    sys.modules["streaming"] = importlib.util.module_from_spec(spec)  # the package, its __init__ not run
    base = importlib.import_module("streaming.base")
    version = importlib.import_module("streaming._version").__version__
    how = f"streaming.base without streaming/__init__.py (`import streaming` fails here: {reason})"
    return base.MDSWriter, base.StreamingDataset, version, how


def import_peers() -> Peers:
    """Import Streaming and LitData (in the main process only: LitData's spawned workers need neither)."""
    mds_writer, streaming_dataset, version, how = import_streaming()
    import litdata

    return Peers(mds_writer, streaming_dataset, version, how, litdata)


# --- writing the peers' datasets -------------------------------------------------------------------------------


def write_mds(peers: Peers, store: Path, out: Path, shape: tuple[int, ...]) -> None:
    """The pgprefetch epoch's samples, in order, as an uncompressed MDS dataset at ``out``."""
    ds = EpochDataset(store, EPOCH, consumer=None)
    columns = {FIELD: f"ndarray:float32:{','.join(map(str, shape))}"}
    with peers.mds_writer(out=str(out), columns=columns, compression=None) as writer:
        for i in range(len(ds)):
            for row in ds[i][FIELD].numpy():
                writer.write({FIELD: row})


class BatchSamples:
    """``litdata.optimize``'s ``fn``: the samples of pgprefetch batch ``b``, one dict each, in order.

    Pickled into LitData's (spawned) workers; each opens the epoch once.
    """

    def __init__(self, store: str) -> None:
        self.store = store
        self._ds: EpochDataset | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"store": self.store, "_ds": None}

    def __call__(self, b: int) -> Iterator[dict[str, np.ndarray]]:
        """Yield batch ``b``'s samples."""
        if self._ds is None:
            self._ds = EpochDataset(self.store, EPOCH, consumer=None)
        yield from ({FIELD: row} for row in self._ds[b][FIELD].numpy())


def write_litdata(peers: Peers, store: Path, out: Path, n_batches: int) -> None:
    """The pgprefetch epoch's samples, in order, as an uncompressed LitData optimized dataset at ``out``."""
    peers.litdata.optimize(
        fn=BatchSamples(str(store)),
        inputs=list(range(n_batches)),
        output_dir=str(out),
        chunk_bytes="64MB",
        compression=None,
        num_workers=LITDATA_WORKERS,
        keep_data_ordered=True,  # each worker takes a contiguous slice, in order: the samples stay in order
        reorder_files=False,
        verbose=False,
    )


def warm(folder: Path) -> int:
    """Read every file under ``folder`` once (into the page cache); the bytes read."""
    buf = bytearray(8 << 20)
    total = 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total


# --- the readers -----------------------------------------------------------------------------------------------


@dataclass
class Variant:
    """One reader at one shuffle setting: ``batches()`` opens the dataset and yields its batches' tensors."""

    peer: str
    version: str
    shuffle: bool
    batches: Callable[[], Iterable[torch.Tensor]]
    seconds: list[float] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)


def pgprefetch_batches(store: Path) -> Iterator[torch.Tensor]:
    """``for b in EpochDataset(store, epoch, consumer=None)``: each batch's ``x``."""
    for b in EpochDataset(store, EPOCH, consumer=None):
        yield b[FIELD]


def streaming_batches(peers: Peers, local: Path, shuffle: bool) -> Iterator[torch.Tensor]:
    """Streaming's ``StreamingDataset`` through a ``DataLoader(batch_size=256, num_workers=0)``."""
    ds = peers.streaming_dataset(local=str(local), shuffle=shuffle, batch_size=BATCH_SIZE)
    try:
        for b in DataLoader(ds, batch_size=BATCH_SIZE, num_workers=0):
            yield b[FIELD]
    finally:
        # A pass stopped early leaves the epoch's prepare and ready threads running (the dataset's next
        # __iter__ would stop them, but each pass opens a new one): stop them as that __iter__ does.
        iterator = getattr(ds, "_iterator", None)
        if iterator is not None:
            iterator.exit()
        executor = getattr(ds, "_executor", None)
        if executor is not None:
            executor.shutdown(wait=True)


def litdata_batches(peers: Peers, folder: Path, shuffle: bool) -> Iterator[torch.Tensor]:
    """LitData's ``StreamingDataset`` through its ``StreamingDataLoader(batch_size=256, num_workers=0)``."""
    ds = peers.litdata.StreamingDataset(str(folder), shuffle=shuffle)
    for b in peers.litdata.StreamingDataLoader(ds, batch_size=BATCH_SIZE, num_workers=0):
        yield b[FIELD]


def one_pass(variant: Variant, out: torch.Tensor, seconds: float) -> tuple[float, int]:
    """Seconds and samples to copy the variant's batches into ``out``: the epoch, or up to ``seconds``."""
    samples = 0
    start = time.perf_counter()
    batches = iter(variant.batches())
    try:
        for t in batches:
            out[: t.shape[0]].copy_(t)
            samples += t.shape[0]
            if seconds and time.perf_counter() - start > seconds:
                break
        elapsed = time.perf_counter() - start
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()  # outside the clock: a pass stopped early tidies up what a finished epoch would not need to
        del batches
        gc.collect()  # the dataset (Streaming's shared memory, named after its folder, goes with it)
    return elapsed, samples


def measure(variant: Variant, out: torch.Tensor, passes: int, seconds: float) -> None:
    """One untimed pass, then ``passes`` timed ones into ``variant``."""
    one_pass(variant, out, min(seconds, 2.0) if seconds else 0.0)
    for _ in range(passes):
        s, n = one_pass(variant, out, seconds)
        variant.seconds.append(s)
        variant.samples.append(n)


# --- the checks ------------------------------------------------------------------------------------------------


def first(batches: Iterable[torch.Tensor]) -> torch.Tensor:
    """The first batch of an iterable, copied (the iterator closed)."""
    it = iter(batches)
    try:
        return next(it).clone()
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def check(peers: Peers, store: Path, mds: Path, lit: Path, n_samples: int) -> None:
    """Both peers hold pgprefetch's samples, in its order: the first batch, and samples across the epoch."""
    ds = EpochDataset(store, EPOCH, consumer=None)
    reference = ds[0][FIELD].clone()
    for name, batches in (
        ("Streaming", lambda s: streaming_batches(peers, mds, s)),
        ("LitData", lambda s: litdata_batches(peers, lit, s)),
    ):
        got = first(batches(False))
        if got.dtype != torch.float32 or not torch.equal(got, reference):
            raise RuntimeError(f"{name}: the first unshuffled batch differs from pgprefetch's batch 0")
        if torch.equal(first(batches(True)), reference):
            raise RuntimeError(f"{name}: shuffle=True gave the unshuffled first batch")
    picks = sorted({1, BATCH_SIZE + 3, n_samples // 2 + 5, n_samples - 1})
    mds_ds = peers.streaming_dataset(local=str(mds), shuffle=False, batch_size=BATCH_SIZE)
    lit_ds = peers.litdata.StreamingDataset(str(lit), shuffle=False)
    for name, peer in (("Streaming", mds_ds), ("LitData", lit_ds)):
        if len(peer) != n_samples:
            raise RuntimeError(f"{name}: {len(peer):,} samples, pgprefetch's epoch has {n_samples:,}")
        for k in picks:
            want = ds[k // BATCH_SIZE][FIELD][k % BATCH_SIZE].numpy()
            got = np.asarray(peer[k][FIELD])
            if got.dtype != np.float32 or not np.array_equal(got, want):
                raise RuntimeError(f"{name}: sample {k:,} differs from pgprefetch's")
    del mds_ds, lit_ds
    gc.collect()


# --- one case --------------------------------------------------------------------------------------------------


@dataclass
class CaseResult:
    """The variants of one sample shape."""

    label: str
    shape: tuple[int, ...]
    n_samples: int
    variants: list[Variant]
    write_s: dict[str, float]
    copy_s: float  # the same batches copied into the buffer from a tensor in memory

    @property
    def sample_bytes(self) -> int:
        """Bytes of one sample."""
        return math.prod(self.shape) * 4


def run_case(
    peers: Peers, folder: Path, label: str, shape: tuple[int, ...], epoch_bytes: int, passes: int, seconds: float
) -> CaseResult:
    """Write the three datasets of one shape, check them, measure every variant, delete them."""
    batch_bytes = BATCH_SIZE * math.prod(shape) * 4
    n_batches = -(-epoch_bytes // batch_bytes)
    n_samples = n_batches * BATCH_SIZE
    case = folder / label.replace(" ", "")
    store, mds, lit = case / "pgprefetch", case / "mds", case / "litdata"
    write_s = {}
    started = time.perf_counter()
    backend = open_store(store)
    backend.create()
    build_epoch(backend, EPOCH, BATCH_SIZE, shape, n_batches)
    write_s["pgprefetch"] = time.perf_counter() - started
    started = time.perf_counter()
    write_mds(peers, store, mds, shape)
    write_s["Streaming"] = time.perf_counter() - started
    started = time.perf_counter()
    write_litdata(peers, store, lit, n_batches)
    write_s["LitData"] = time.perf_counter() - started
    log(
        f"{label}: {n_batches:,} batches of {BATCH_SIZE} x {shape} float32 ({n_batches * batch_bytes / 1e9:.2f} GB) "
        f"written: pgprefetch {write_s['pgprefetch']:.1f} s, MDS {write_s['Streaming']:.1f} s, LitData "
        f"{write_s['LitData']:.1f} s"
    )
    check(peers, store, mds, lit, n_samples)
    log(f"{label}: checked: both peers' first unshuffled batch and samples across the epoch equal pgprefetch's")
    warmed = warm(case)
    log(f"{label}: page cache warmed: {warmed / 1e9:.2f} GB read")
    out = torch.from_numpy(aligned(batch_bytes)).view(torch.float32).view(BATCH_SIZE, *shape)
    variants = []
    for shuffle in (False, True):
        variants += [
            Variant("pgprefetch", pgprefetch_version, shuffle, lambda: pgprefetch_batches(store)),
            Variant("Streaming", peers.streaming_version, shuffle, lambda s=shuffle: streaming_batches(peers, mds, s)),
            Variant("LitData", peers.litdata.__version__, shuffle, lambda s=shuffle: litdata_batches(peers, lit, s)),
        ]
    for v in variants:
        measure(v, out, passes, seconds)
        rates = [n / s for n, s in zip(v.samples, v.seconds, strict=True)]
        log(
            f"{label}: {v.peer}, shuffle {'on' if v.shuffle else 'off'}: median {statistics.median(rates):,.0f} "
            f"samples/s; passes: " + ", ".join(f"{n:,} in {s:.3f} s" for n, s in zip(v.samples, v.seconds, strict=True))
        )
    shutil.rmtree(case, ignore_errors=True)
    copy_s = copy_ceiling(out, n_batches, passes)
    log(f"{label}: the same bytes copied from memory: {n_batches * batch_bytes / copy_s / 1e9:.1f} GB/s")
    return CaseResult(label, shape, n_samples, variants, write_s, copy_s)


def copy_ceiling(out: torch.Tensor, n_batches: int, passes: int) -> float:
    """Median seconds to ``copy_`` ``n_batches`` batches from a tensor in memory into ``out``: no reader at all."""
    src = torch.ones(n_batches, *out.shape, dtype=out.dtype)  # every page written: no shared zero page to read
    seconds = []
    for _ in range(passes + 1):
        start = time.perf_counter()
        for b in src:
            out.copy_(b)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds[1:])


# --- the report ------------------------------------------------------------------------------------------------


def rate(v: Variant) -> float:
    """The variant's median samples/s over its timed passes."""
    return statistics.median(n / s for n, s in zip(v.samples, v.seconds, strict=True))


def gbs(x: float) -> str:
    """GB/s with two decimals, or three significant digits below 0.1."""
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3g}"


def tree() -> str:
    """The commit this ran at, and whether the working tree had changes (the reader measured is the tree's)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"commit {head.stdout.strip()}" + (", uncommitted changes in the tree" if dirty.stdout.strip() else "")


def render(results: list[CaseResult], peers: Peers, args: argparse.Namespace, wall_s: float) -> str:
    """The markdown report: the table, the versions, what each variant does, and the caveats."""
    lines = [
        "# pgprefetch's reader beside MosaicML Streaming and LitData",
        "",
        f"`make bench-peers` (`python -m bench.peers --epoch-mb {args.epoch_mb} --passes {args.passes} --seconds "
        f"{args.seconds:g}`), {time.strftime('%Y-%m-%d')}, on {os.cpu_count()} cores of a shared machine (another "
        f"engineer's benchmarks may have run on the same cores). One run: {wall_s / 60:.1f} minutes in all.",
        "",
        f"The same float32 samples, {BATCH_SIZE} a batch, num_workers=0, page cache warm, every byte of every batch "
        "copied into a buffer allocated once. Median of the timed passes; *pgprefetch / peer* is pgprefetch's "
        "samples/s at the same batch shape and shuffle setting over the peer's.",
        "",
        "| peer | version | batch (samples x shape) | shuffle | samples/s | GB/s | pgprefetch / peer | read a pass |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        ours = {v.shuffle: rate(v) for v in r.variants if v.peer == "pgprefetch"}
        for v in r.variants:
            samples_s = rate(v)
            ratio = "—" if v.peer == "pgprefetch" else f"{ours[v.shuffle] / samples_s:,.1f}x"
            fraction = statistics.median(v.samples) / r.n_samples
            shape = " x ".join(map(str, r.shape))
            lines.append(
                f"| {v.peer} | {v.version} | {r.label} ({BATCH_SIZE} x {shape}) | {'on' if v.shuffle else 'off'} | "
                f"{samples_s:,.0f} | {gbs(samples_s * r.sample_bytes / 1e9)} | {ratio} | {fraction:.0%} |"
            )
    lines += [
        "",
        "Epochs:",
        "",
        *(
            f"- {r.label}: {r.n_samples:,} samples, {r.n_samples * r.sample_bytes / 1e9:.2f} GB, written in "
            + ", ".join(f"{k} {s:.1f} s" for k, s in r.write_s.items())
            + ". The same batches copied into the buffer from a tensor in memory, no reader at all: "
            f"{r.n_samples / r.copy_s:,.0f} samples/s, {r.n_samples * r.sample_bytes / r.copy_s / 1e9:.1f} GB/s."
            for r in results
        ),
        "",
        "Versions: "
        + ", ".join(
            [
                f"pgprefetch {pgprefetch_version} ({tree()})",
                f"mosaicml-streaming {peers.streaming_version}",
                f"litdata {peers.litdata.__version__}",
                f"torch {torch.__version__}",
                f"numpy {np.__version__}",
                f"Python {platform.python_version()}",
                f"{platform.system()} {platform.machine()}",
                f"torch threads {torch.get_num_threads()}",
            ]
        )
        + ".",
        "",
        "## What each variant does",
        "",
        "- **pgprefetch**: `for b in EpochDataset(store, epoch, consumer=None)`, copying `b['x']`. The epoch is "
        "written in sample order, so that its batches can be compared with the peers' unshuffled ones. A dump "
        "writes each epoch already shuffled (a fresh permutation per epoch), so pgprefetch's *shuffle on* is the "
        "same sequential read of a pre-shuffled epoch, measured again with passes of its own: it does no "
        "shuffling at read time.",
        "- **Streaming**: an MDS dataset (`MDSWriter`, column `ndarray:float32:<shape>`, no compression, 64 MiB "
        "shards) read with `StreamingDataset(local=..., shuffle=..., batch_size=256)` and "
        "`torch.utils.data.DataLoader(batch_size=256, num_workers=0)` (its default collate stacks the samples).",
        "- **LitData**: a dataset written by `litdata.optimize` (64 MB chunks, no compression, 2 workers keeping "
        "the input order) read with `StreamingDataset(dir, shuffle=...)` and "
        "`StreamingDataLoader(batch_size=256, num_workers=0)`.",
        "- Every pass opens its dataset inside the clock, and copies each batch tensor into a preallocated buffer. "
        "Each variant runs one untimed pass (at most 2 s) first, after every file of the three datasets was read "
        "once (page cache warm).",
        "- Checked before timing: both peers' first unshuffled batch holds exactly pgprefetch's batch 0, their "
        "shuffled first batch differs from it, they hold as many samples as pgprefetch's epoch, and samples 1, "
        "259, the middle and the last (by index) equal pgprefetch's.",
        "",
        "## Caveats",
        "",
        (
            f"- A pass stops at the end of the epoch or at the first batch past {args.seconds:g} s: the slow "
            "readers would take minutes a pass over 2 M samples. Their rate is over the part read (*read a pass*, "
            "the median pass's share of the epoch), the opening of the dataset included."
            if args.seconds
            else "- Every pass reads the whole epoch (`--seconds 0`)."
        ),
        "- pgprefetch's batches are views of the mapped epoch files, so its pass is mostly the copy into the "
        "buffer: compare with the in-memory copy under *Epochs*. torch runs a large `copy_` on its intra-op threads "
        f"({torch.get_num_threads()} here), for every variant alike.",
        "- One machine, 2 cores, shared: another engineer's benchmarks may have run on the same cores at the time; "
        "numbers from one run; local "
        "disk, page cache warm: no storage is measured, only what each reader costs on top of bytes in memory.",
        "- num_workers=0 everywhere: the readers' own per-batch cost on one process. With worker processes every "
        "reader's batches would also cross a process boundary (pgprefetch's as file references).",
        f"- Streaming imported as: {peers.streaming_import}.",
        "- Both peers read from a local folder only; neither's download, cache or remote paths are exercised.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Run the comparison, print the markdown report and write it to ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n")[0])
    parser.add_argument("--epoch-mb", type=int, default=1024, help="MiB of sample bytes per shape (default 1024)")
    parser.add_argument("--passes", type=int, default=3, help="timed passes per variant (default 3)")
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="stop a pass at the first batch past this (default 10; 0: never)"
    )
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the report goes (default {OUT})")
    parser.add_argument("--tmp", type=Path, default=None, help="where the temp folder goes (default: the system's)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")  # Streaming's collate
    peers = import_peers()
    log(f"Streaming {peers.streaming_version} ({peers.streaming_import}), LitData {peers.litdata.__version__}")
    folder = Path(tempfile.mkdtemp(prefix="pgpf-bench-peers-", dir=args.tmp))
    # LitData's optimize keeps its caches in the temp dir, and Streaming its locks: all inside our folder.
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = str(folder)
    os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = str(folder / "litdata-cache" / "chunks")
    os.environ["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = str(folder / "litdata-cache" / "data")
    try:
        results = [
            run_case(peers, folder, label, shape, args.epoch_mb << 20, args.passes, args.seconds)
            for label, shape in CASES.items()
        ]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    text = render(results, peers, args, time.perf_counter() - started)
    print(text)
    args.out.write_text(text)
    log(f"wrote {args.out}")


if __name__ == "__main__":
    main()
