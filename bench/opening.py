"""The OPENING benchmark: opening and listing an epoch of 10^5 batches against one of 100 (issue #13).

Target: opening an epoch of 10^5 batches takes at most twice the time of opening one of 100, and the same
for ``ls``. Two epochs of batches of 10 samples (a float32 field of 16 values, an int64 label and the keys)
are written through :class:`pgprefetch.write.files.writer.EpochWriter`, as a dump writes them (no PostgreSQL), each in
a store of its own, with a manifest holding what the dump's holds. Then, in rounds that alternate the two
sizes (so that drift weighs on both alike), after one untimed warm-up call of each:

- *EpochDataset(...)*: ``EpochDataset(store, epoch, consumer=None)``, construction only (``CALLS`` calls
  in a row per round: one takes well under a millisecond);
- *list_epochs*: :func:`pgprefetch.store.maintenance.list_epochs` of the store, what ``pgprefetch ls`` calls
  (also ``CALLS`` in a row);
- *ls CLI*: ``python -m pgprefetch ls --json --store ...`` as a subprocess, wall time (interpreter start-up
  included, which is most of it: the extra milliseconds are the column to read), in a phase after the
  in-process ones (a subprocess just before a sub-millisecond call leaves it cold caches).

Each figure is the median of its rounds. ``python -m bench.opening`` runs it alone; ``--profile`` then
prints cProfile's top calls of opening and listing the large epoch.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from pgprefetch import EpochDataset
from pgprefetch._version import __version__
from pgprefetch.store.base import FORMAT_VERSION, KEYS_ARRAY, ArraySpec, Store, epoch_name
from pgprefetch.store.maintenance import list_epochs
from pgprefetch.store.open import open_store

from . import log

SIZES = {"small": 100, "large": 100_000}  # batches per epoch
BATCH_SIZE = 10
EMB = 16  # values of the float32 field per sample
EPOCH = 3
REPEATS = 11  # in-process rounds
CALLS = 20  # calls per in-process round, averaged: one call takes well under a millisecond
CLI_REPEATS = 7  # subprocess rounds (each is an interpreter start)
TARGET = 2.0
BEGIN = "<!-- opening bench: begin -->"
END = "<!-- opening bench: end -->"


def specs() -> list[ArraySpec]:
    return [
        ArraySpec("emb", np.dtype("float32"), (EMB,)),
        ArraySpec("label", np.dtype("int64"), ()),
        ArraySpec(KEYS_ARRAY, np.dtype("int64"), (1,)),
    ]


def manifest(epoch: int, n_batches: int, seconds: float) -> dict:
    """A manifest with every key ``pgprefetch.write.manifest.epoch_manifest`` and ``_write_epoch`` put in one."""
    n_samples = n_batches * BATCH_SIZE
    per_sample = EMB * 4 + 8 + 8
    return {
        "format_version": FORMAT_VERSION,
        "pgprefetch_version": __version__,
        "epoch": epoch,
        "seed": 0,
        "batch_size": BATCH_SIZE,
        "n_batches": n_batches,
        "n_samples": n_samples,
        "drop_last": False,
        "n_keys": n_samples,
        "duplicates_dropped": 0,
        "fraction": 1.0,
        "rows": 1,
        "fields": {
            "emb": {"dtype": "float32", "shape": [EMB], "columns": ["emb"]},
            "label": {"dtype": "int64", "shape": [], "columns": ["label"]},
        },
        "key_columns": ["id"],
        "keys_sha256": "0" * 64,
        "compression": "none",
        "config_sha256": "0" * 64,
        "config": {
            "keys": "SELECT id FROM train_items",
            "query": "SELECT emb, label FROM items WHERE id = $1",
            "rows": 1,
            "fraction": 1.0,
            "duplicates": "error",
        },
        "mode": "query",
        "snapshot": "00000003-00000002-1",
        "server_version": "PostgreSQL 18 (bench: no server)",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "seconds": round(seconds, 3),
        "bytes": n_samples * per_sample,
        "complete": True,
        "resumed_batches": 0,
        "snapshots": ["00000003-00000002-1"],
    }


def build_epoch(store: Store, epoch: int, n_batches: int) -> float:
    """Write and publish an uncompressed epoch of ``n_batches`` batches of ``BATCH_SIZE``; return seconds."""
    from pgprefetch.write.files.writer import EpochWriter

    started = time.perf_counter()
    store.create()
    n_keys = n_batches * BATCH_SIZE
    writer = EpochWriter(
        store,
        epoch,
        n_batches=n_batches,
        batch_size=BATCH_SIZE,
        arrays=specs(),
        compression="none",
        identity={"bench": "opening", "n_keys": n_keys},
    )
    try:
        writer.begin("00000003-00000002-1")
        base = np.random.default_rng(epoch).standard_normal((BATCH_SIZE, EMB), dtype=np.float32)
        emb = np.empty_like(base)
        label = np.empty(BATCH_SIZE, dtype=np.int64)
        keys = np.empty((BATCH_SIZE, 1), dtype=np.int64)
        for b in range(n_batches):
            np.add(base, np.float32(b), out=emb)  # different bytes in every batch, cheap to make
            keys[:, 0] = np.arange(b * BATCH_SIZE, (b + 1) * BATCH_SIZE)
            np.remainder(keys[:, 0], 7, out=label)
            writer.write_batch(b, {"emb": emb, "label": label, KEYS_ARRAY: keys})
        writer.publish(manifest(epoch, n_batches, time.perf_counter() - started))
    except BaseException:
        writer.discard()
        raise
    return time.perf_counter() - started


def open_dataset(store: Path) -> EpochDataset:
    return EpochDataset(store, EPOCH, consumer=None)


def list_store(store: Path) -> list:
    return list_epochs(open_store(store))


def ls_cli(store: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "pgprefetch", "ls", "--json", "--store", str(store)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def timed(call: Callable[[], object], calls: int = 1) -> float:
    """Seconds per call of ``calls`` calls in a row."""
    started = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - started) / calls


@dataclass
class OpeningCase:
    """One epoch size: its seconds per call of each operation."""

    label: str
    n_batches: int
    write_s: float
    manifest_bytes: int  # the epoch group's zarr.json (the manifest is its "pgprefetch" attribute)
    files: int  # files in the epoch's folder (what ``ls`` walks for its size)
    dataset_s: list[float] = field(default_factory=list)
    list_s: list[float] = field(default_factory=list)
    cli_s: list[float] = field(default_factory=list)


@dataclass
class OpeningResults:
    """Both sizes, and how long the whole part took."""

    cases: list[OpeningCase] = field(default_factory=list)
    seconds: float = 0.0

    def ratios(self) -> dict[str, float]:
        """Median seconds of the large epoch over the small one's, per operation."""
        small, large = self.cases
        return {
            what: statistics.median(getattr(large, what)) / statistics.median(getattr(small, what))
            for what in ("dataset_s", "list_s", "cli_s")
        }


def check(store: Path, n_batches: int) -> None:
    """The epoch opens, lists and reads as written: the right sizes, and the last batch's keys."""
    ds = open_dataset(store)
    last = ds.batch_keys(n_batches - 1).numpy()[:, 0]
    if len(ds) != n_batches or not np.array_equal(last, np.arange(n_batches * BATCH_SIZE)[-BATCH_SIZE:]):
        raise RuntimeError(f"{store}: the epoch does not read back as written")
    listed = ls_cli(store)["epochs"]
    if [(e["epoch"], e["n_batches"], e["state"]) for e in listed] != [(EPOCH, n_batches, "complete")]:
        raise RuntimeError(f"{store}: ls --json lists {listed}")
    if [(i.epoch, i.n_batches) for i in list_store(store)] != [(EPOCH, n_batches)]:
        raise RuntimeError(f"{store}: list_epochs disagrees")


def run(repeats: int = REPEATS, cli_repeats: int = CLI_REPEATS, profile: bool = False) -> OpeningResults:
    """Write both epochs in a temp folder, time the three operations on each, remove the folder."""
    started = time.perf_counter()
    results = OpeningResults()
    root = Path(tempfile.mkdtemp(prefix="pgpf-bench-opening-"))
    try:
        stores = {}
        for label, n in SIZES.items():
            stores[label] = root / label
            write_s = build_epoch(open_store(stores[label]), EPOCH, n)
            epoch = stores[label] / epoch_name(EPOCH)
            results.cases.append(
                OpeningCase(
                    label,
                    n,
                    write_s,
                    (epoch / "zarr.json").stat().st_size,
                    sum(1 for p in epoch.rglob("*") if p.is_file()),
                )
            )
            log(f"opening: wrote {n:,} batches of {BATCH_SIZE} in {write_s:.1f} s")
            check(stores[label], n)  # also the untimed warm-up of each operation
        # In-process calls first, in a phase of their own: a subprocess just before one leaves it cold caches.
        for r in range(repeats):
            for case in results.cases if r % 2 == 0 else results.cases[::-1]:
                store = stores[case.label]
                case.dataset_s.append(timed(lambda s=store: open_dataset(s), CALLS))
                case.list_s.append(timed(lambda s=store: list_store(s), CALLS))
        for r in range(cli_repeats):
            for case in results.cases if r % 2 == 0 else results.cases[::-1]:
                case.cli_s.append(timed(lambda s=stores[case.label]: ls_cli(s)))
        if profile:
            profile_large(stores["large"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    results.seconds = time.perf_counter() - started
    return results


def profile_large(store: Path, top: int = 15) -> None:
    """cProfile's top calls (by cumulative time) of opening and listing ``store`` 20 times each."""
    for name, call in (("EpochDataset(...)", open_dataset), ("list_epochs", list_store)):
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(20):
            call(store)
        profiler.disable()
        print(f"\n### cProfile: {name} x 20, {store}\n", file=sys.stderr)
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(top)


def _ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e3


def render(results: OpeningResults, *, revision: str = "") -> str:
    """The opening bench's section, between markers so that ``--opening-only`` can replace it in RESULTS.md."""
    from .machine import code_revision, cpu_model

    small, large = results.cases
    ratios = results.ratios()
    out = [
        BEGIN,
        "## Opening: an epoch of 10^5 batches against one of 100",
        "",
        f"Two epochs of batches of {BATCH_SIZE} samples (float32 `emb` of {EMB}, int64 `label`, int64 keys), "
        f"{small.n_batches:,} and {large.n_batches:,} batches, written by `EpochWriter` without PostgreSQL "
        "(uncompressed, sharded; the per-chunk checksums in the epoch's `_checksums` array), each in a store of "
        "its own. *EpochDataset(...)*: `EpochDataset(store, epoch, consumer=None)`, construction only. "
        "*list_epochs*: `pgprefetch.store.maintenance.list_epochs(open_store(store))`, what `pgprefetch ls` calls. "
        "*ls CLI*: "
        "`python -m pgprefetch ls --json --store ...` as a subprocess, wall time including the interpreter's "
        "start-up (most of it: *extra ms* is what the epoch's size costs). One untimed call of each first, then "
        f"rounds alternating the two sizes: the median of {len(small.dataset_s)} rounds of {CALLS} calls in a row "
        f"(in process; ms per call), then of {len(small.cli_s)} rounds of one call each (CLI). Page cache warm.",
        "",
        f"| operation | {small.n_batches:,} batches ms | {large.n_batches:,} batches ms | extra ms | ratio "
        "| target | verdict |",
        "|---|--:|--:|--:|--:|--:|---|",
    ]
    for name, what in (("EpochDataset(...)", "dataset_s"), ("list_epochs", "list_s"), ("ls CLI", "cli_s")):
        a, b, ratio = _ms(getattr(small, what)), _ms(getattr(large, what)), ratios[what]
        out.append(
            f"| {name} | {a:.2f} | {b:.2f} | {b - a:+.2f} | {ratio:.2f}x | <= {TARGET:g}x "
            f"| {'PASS' if ratio <= TARGET else 'MISS'} |"
        )
    out += [
        "",
        f"Epoch group `zarr.json` (the manifest): {small.manifest_bytes:,} bytes at {small.n_batches:,} batches, "
        f"{large.manifest_bytes:,} at {large.n_batches:,}; files in the epoch folder: {small.files} and "
        f"{large.files}. Writing the epochs took {small.write_s:.1f} s and {large.write_s:.1f} s.",
        "",
        f"Opening bench: {cpu_model()}, Python {sys.version.split()[0]}, pgprefetch {revision or code_revision()}; "
        f"{results.seconds:.0f} s including writing the epochs.",
        END,
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.opening", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=REPEATS, help=f"in-process rounds (default {REPEATS})")
    parser.add_argument("--cli-repeats", type=int, default=CLI_REPEATS, help=f"CLI rounds (default {CLI_REPEATS})")
    parser.add_argument("--profile", action="store_true", help="cProfile opening and listing the large epoch")
    args = parser.parse_args(argv)
    print(render(run(args.repeats, args.cli_repeats, args.profile)))


if __name__ == "__main__":
    main()
