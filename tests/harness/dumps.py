"""Dumps, in this process or as processes of their own, and what they leave: arrays, chunk files, journals.

A dump in process (:func:`dump`) is for comparing bytes; one as its own process (:func:`start_dump`) is for
what only a process shows: signals, ``kill -9``, exit codes, another writer on the same epoch. The CLI in
this process (:func:`run_cli`) is for what a command prints.
"""

from __future__ import annotations

import asyncio
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from click.testing import CliRunner

from pgprefetch import DumpResult, dump_epoch, load_config
from pgprefetch.cli import cli


def dump(config: Path, dsn: str, epoch: int = 0, **kwargs: Any) -> DumpResult:
    """Load ``config`` with ``dsn`` and dump one epoch."""
    force = kwargs.pop("force", False)
    cfg = load_config(config, dsn=dsn, **kwargs)
    return asyncio.run(dump_epoch(cfg, epoch, force=force))


def run_cli(*args: str) -> tuple[int, str]:
    """``pgprefetch ARGS`` run in this process (click's runner): its exit code and what it printed."""
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def epoch_group(result: DumpResult) -> zarr.Group:
    return zarr.open_group(result.path, mode="r")


def read_arrays(result: DumpResult) -> dict[str, np.ndarray]:
    g = epoch_group(result)
    return {name: g[name][:] for name in g.array_keys() if not name.startswith("_")}  # data, not bookkeeping


def chunk_bytes(epoch_path: Path) -> dict[str, bytes]:
    """Every file of a published epoch except the manifest, by relative path."""
    return {
        str(p.relative_to(epoch_path)): p.read_bytes()
        for p in sorted(epoch_path.rglob("*"))
        if p.is_file() and p.parent != epoch_path
    }


def dump_argv(cfg: Path, dsn: str, epoch: int = 0, *extra: str) -> list[str]:
    """``pgprefetch dump`` of one epoch as its own process."""
    return [
        sys.executable,
        "-m",
        "pgprefetch",
        "dump",
        "--config",
        str(cfg),
        "--epoch",
        str(epoch),
        "--dsn",
        dsn,
        *extra,
    ]


def start_dump(cfg: Path, dsn: str, epoch: int = 0, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        dump_argv(cfg, dsn, epoch, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def journal_lines(store: Path, epoch: int = 0) -> int:
    """Batches a running (or stopped) single-process dump of ``epoch`` has journaled; -1 before its journal."""
    path = store / ".pgprefetch" / "partial" / f"epoch-{epoch:05d}.journal"
    if not path.exists():
        return -1
    return sum(1 for line in path.read_text().splitlines()[1:] if not line.startswith("#"))


def wait_for(condition: Callable[[], object], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def kill_9_mid_dump(cfg: Path, dsn: str, when: Callable[[], object], epoch: int = 0) -> None:
    """Start a dump of ``epoch`` as its own process and ``kill -9`` it once ``when`` holds (a crash mid-epoch)."""
    victim = start_dump(cfg, dsn, epoch)
    wait_for(when)
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=10)  # reaped, and its pipes closed


def kill_9_after(cfg: Path, dsn: str, store: Path, batches: int = 3, epoch: int = 0) -> None:
    """:func:`kill_9_mid_dump` once the dump of ``epoch`` has journaled ``batches`` batches."""
    kill_9_mid_dump(cfg, dsn, lambda: journal_lines(store, epoch) >= batches, epoch)


def dump_on_a_full_disk(argv: list[str], limit: int, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (a dump) with its files capped at ``limit`` bytes: writes past it fail, as on a full disk.

    ``RLIMIT_FSIZE`` makes a write past the cap fail with EFBIG ("File too large") instead of killing the
    process with SIGXFSZ, which is ignored for it.
    """

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run(argv, capture_output=True, text=True, preexec_fn=small_files, timeout=timeout, check=False)


# What a dump that could not write says after its error, on any store.
RESUME_HINT = "free some space and run the dump again: it resumes where it stopped"


class StopAfter:
    """A progress hook that fails the dump after ``writes`` units were written (an interrupted dump).

    A unit is one batch only when fetching a batch is slow (``slow=True`` configs). The resumed batches a
    dump announces first (no bytes) are not a write.
    """

    def __init__(self, writes: int) -> None:
        self.left = writes

    def start(self, epoch: int, n_samples: int) -> None: ...
    def close(self) -> None: ...
    def advance(self, samples: int, nbytes: int) -> None:
        if nbytes:
            self.left -= 1
            if self.left == 0:
                raise RuntimeError("interrupted")
