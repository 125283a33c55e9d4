"""What must hold after a soak, asserted: the ranks' reads, the store's end state, the reader's memory.

- **Reads.** Each rank's record (its steps, as ``examples/stream_train.py --record`` writes them, cut back to
  the last save at each restart) must be exactly the start of that rank's batches of epoch 0, 1, 2, ... of
  clean dumps, batch for batch, byte for byte (by digest): nothing lost, nothing twice, in order, across
  the kills and restarts.
- **End state**, after the clean cron run: no process of the soak left, no lock held, no lease, no temporary
  file, no partial epoch, and exactly the epochs ``--ahead`` and ``--keep`` say.
- **Memory.** A rank's anonymous memory (the heap, not the mapped files) does not grow from epoch to epoch.
"""

from __future__ import annotations

import asyncio
import fcntl
import importlib.util
import itertools
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from pgprefetch import EpochDataset, dump_epoch, load_config
from pgprefetch.store.consumers import run_of
from pgprefetch.store.open import open_store

from ..harness.db import execute
from .bed import REPO, Bed

MEMORY_GROWTH_KIB = 16 << 10  # a rank's heap may move by this much between its early and late epochs


def example_module() -> ModuleType:
    """``examples/stream_train.py``, the training side the soak runs, as a module (it is a script)."""
    spec = importlib.util.spec_from_file_location("stream_train", REPO / "examples" / "stream_train.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def example_digest() -> Callable[[dict[str, Any]], str]:
    """The digest the training example records, from the example itself (the same bytes give the same digest)."""
    return example_module().digest  # type: ignore[no-any-return]


def read_record(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A rank's record: its steps and its saves, in order."""
    steps, saves = [], []
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        (steps if "step" in entry else saves).append(entry)
    return steps, saves


def reference(bed: Bed, epochs: int, world: int) -> list[list[list[str]]]:
    """Each rank's batch digests of clean dumps of epochs ``0..epochs-1`` (``[rank][epoch][batch]``).

    Dumped after the soak, with no fault and the server's pace taken away, into a store of their own.
    """
    execute(bed.direct, "UPDATE pace SET seconds = 0")
    folder = bed.root / "reference.zarr"
    cfg = load_config(bed.config, dsn=bed.direct, store=str(folder))
    digest = example_digest()
    out: list[list[list[str]]] = [[] for _ in range(world)]
    for epoch in range(epochs):
        asyncio.run(dump_epoch(cfg, epoch))
        for rank in range(world):
            ds = EpochDataset(folder, epoch, rank=rank, world_size=world, consumer=None)
            out[rank].append([digest(ds.batch(i, keys=True)) for i in range(len(ds))])
    return out


def check_reads(
    records: dict[int, Path], batches_per_epoch: int, bed: Bed, world: int
) -> tuple[dict[str, Any], list[str]]:
    """Each rank read exactly its batches of consecutive clean epochs: what was read, and what went wrong."""
    problems = []
    steps = {rank: read_record(path)[0] for rank, path in records.items()}
    for rank, got in steps.items():
        if [s["step"] for s in got] != list(range(len(got))):
            problems.append(f"rank {rank}: its record's steps are not 0, 1, 2, ... (missing or repeated)")
    most = max((len(s) for s in steps.values()), default=0)
    epochs = -(-most // batches_per_epoch)
    clean = reference(bed, epochs, world)
    for rank, got in steps.items():
        expected = [d for epoch in clean[rank] for d in epoch]
        digests = [s["digest"] for s in got]
        wrong = [i for i, (a, b) in enumerate(zip(digests, expected, strict=False)) if a != b]
        if wrong:
            i = wrong[0]
            problems.append(
                f"rank {rank}: {len(wrong)} steps differ from a clean dump's batches, the first step {i} "
                f"(epoch {i // batches_per_epoch}, batch {i % batches_per_epoch})"
            )
        if len(digests) > len(expected):
            problems.append(f"rank {rank}: read {len(digests)} batches, more than the {len(expected)} of its epochs")
    figures = {
        "steps": {rank: len(s) for rank, s in steps.items()},
        "epochs_read": {rank: len(s) // batches_per_epoch for rank, s in steps.items()},
        "epochs_checked": epochs,
    }
    return figures, problems


STUCK_SECONDS = 60.0  # a rank that reads nothing this long, while another reads epochs, is stuck


def stuck_ranks(records: dict[int, Path], began: float, stopped_at: float, batches_per_epoch: int) -> list[str]:
    """Ranks that read nothing for ``STUCK_SECONDS`` while another rank read two epochs or more.

    Each rank waits on its own (no barrier between them), so one can hang, waiting for an epoch that will
    never come, while the run goes on: its record is then only short, not wrong. Times are wall clock,
    from when the ranks were started (``began``) to when they were told to stop (``stopped_at``).
    """
    times = {rank: [s["t"] for s in read_record(path)[0]] for rank, path in records.items()}
    problems = []
    for rank, mine in times.items():
        for done, (start, end) in enumerate(itertools.pairwise([began, *mine, stopped_at])):
            others = max((sum(start < t < end for t in ts) for r, ts in times.items() if r != rank), default=0)
            if end - start > STUCK_SECONDS and others >= 2 * batches_per_epoch:
                problems.append(
                    f"rank {rank} read nothing for {end - start:.0f} s after {done} steps, while another rank "
                    f"read {others} batches"
                )
                break
    return problems


def memory(records: dict[int, Path]) -> dict[int, dict[str, Any]]:
    """Each rank's anonymous memory over its longest life (one process), early against late.

    "Early" is the median of the second quarter of its saves (the first is warm-up: workers start, files
    are first mapped), "late" the median of the last quarter.
    """
    out = {}
    for rank, path in records.items():
        by_life: dict[int, list[dict[str, Any]]] = {}
        for save in read_record(path)[1]:
            by_life.setdefault(save["pid"], []).append(save)
        if not by_life:
            continue  # it never saved: nothing to compare
        life = max(by_life.values(), key=len)
        n = len(life)
        quarter = max(1, n // 4)
        kib = [s["rss_anon_kib"] + s["workers_rss_anon_kib"] for s in life]
        early = statistics.median(kib[quarter : 2 * quarter] or kib)
        late = statistics.median(kib[-quarter:])
        out[rank] = {
            "saves": n,
            "epochs": (life[0]["epoch"], life[-1]["epoch"]),
            "early_kib": early,
            "late_kib": late,
            "growth_kib": late - early,
            "main_kib": (life[0]["rss_anon_kib"], life[-1]["rss_anon_kib"]),
        }
    return out


def check_memory(figures: dict[int, dict[str, Any]], min_epochs: int) -> list[str]:
    """A rank whose heap grew between its early and its late epochs (over a life of ``min_epochs`` or more)."""
    return [
        f"rank {rank}: memory grew by {f['growth_kib'] / 1024:.1f} MiB across epochs {f['epochs'][0]}-{f['epochs'][1]}"
        for rank, f in figures.items()
        if f["epochs"][1] - f["epochs"][0] >= min_epochs and f["growth_kib"] > MEMORY_GROWTH_KIB
    ]


def soak_processes(bed: Bed) -> list[str]:
    """Processes still running that belong to the soak (their command line names its config or store)."""
    marks = (str(bed.config), bed.store, str(bed.root / "checkpoints"))
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().decode(errors="replace").split("\0")
            pid = int(cmdline.parent.name)
        except OSError:
            continue
        if pid != os.getpid() and any(m in argv for m in marks) and not _zombie(pid):
            found.append(f"{pid}: {' '.join(argv)[:200]}")
    return found


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def leftovers(bed: Bed) -> list[str]:
    """Locks held, leases, temporary files and partial epochs left in the store (and an S3 store's staging)."""
    store = open_store(bed.store)
    found = [f"partial epoch {e}" for e in store.partial_epochs()]
    if bed.kind == "local":
        root = Path(bed.store)
        meta = root / ".pgprefetch"
        found += [f"temporary file {p}" for p in root.rglob("*") if p.name.endswith((".tmp", ".partial"))]
        for folder in ("trash", "partial"):
            found += [f"left in {folder}/: {p.name}" for p in (meta / folder).glob("*")]
        for lock in (meta / "locks").glob("*.lock"):
            if _held(lock):
                found.append(f"lock held: {lock.name}")
    else:
        for host in range(bed.hosts):
            staging = bed.staging(host)
            for p in staging.rglob("*"):
                if p.is_file() and not (p.parent.name == "locks" and not _held(p)):  # a free lock is no leftover
                    found.append(f"staged on host {'ab'[host]}: {p.relative_to(staging)}")
        complete = set(store.epochs())
        for meta in store._list(""):  # type: ignore[attr-defined]
            key = meta["path"]
            top = key.split("/", 1)[0]
            if key.startswith(".pgprefetch/locks/"):
                found.append(f"lease left: {key}")
            elif top.startswith("epoch-") and int(top.removeprefix("epoch-")) not in complete:
                found.append(f"object of an unpublished epoch: {key}")
    return found


def _held(lock: Path) -> bool:
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def check_end_state(bed: Bed, ahead: int, keep: int, consumer: str) -> tuple[dict[str, Any], list[str]]:
    """After the clean cron run: just what --ahead and --keep say in the store, and nothing else left."""
    store = open_store(bed.store)
    problems = [f"a process of the soak still runs: {p}" for p in soak_processes(bed)]
    problems += [f"left after a clean cron run: {thing}" for thing in leftovers(bed)]
    # Each rank records its own epoch: --ahead dumps after the furthest, --keep keeps what the slowest reads.
    ranks = {name: epoch for name, epoch in store.consumers().items() if run_of(name) == consumer}
    epochs = store.epochs()
    if not ranks:
        problems.append(f"no training rank ever opened an epoch (consumer {consumer!r}); the store holds {epochs}")
    else:
        slowest, furthest = min(ranks.values()), max(ranks.values())
        if epochs != list(range(max(0, slowest - keep), furthest + ahead + 1)):
            problems.append(
                f"the consumer's ranks are at epochs {slowest}..{furthest}, so --ahead {ahead} --keep {keep} keep "
                f"epochs {max(0, slowest - keep)}..{furthest + ahead}; the store holds {epochs}"
            )
    return {"consumer_epochs": ranks, "epochs": epochs}, problems
