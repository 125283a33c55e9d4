"""``pgprefetch dump`` as a whole process: its wall time, and its peak RSS through a tiny wrapper."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr

from .datasets import Dataset

PGPREFETCH = Path(sys.executable).parent / "pgprefetch"

# Runs the dump as its only child and reports that child's peak RSS (KiB on Linux) on a last line.
RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:]).returncode\n"
    "print(f'MAXRSS_KIB {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss} RC {rc}', flush=True)\n"
)


@dataclass(frozen=True)
class DumpRun:
    """One dump: samples written, wall seconds around the process, peak RSS (bytes, 0 if not measured)."""

    samples: int
    seconds: float
    dump_seconds: float  # as the dump reports it (no process start-up)
    max_rss: int = 0
    # The epoch's `keys` array as the dump wrote it, (n_key_columns, samples), to check the ceilings' batches.
    keys: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def rate(self) -> float:
        """Samples per second of wall time."""
        return self.samples / self.seconds if self.seconds else 0.0


def dump(
    ds: Dataset,
    dsn: str,
    workdir: Path,
    *,
    fraction: float = 1.0,
    measure_rss: bool = False,
    keep_keys: bool = False,
    config: str | None = None,
    read_keys: Callable[[Path], np.ndarray] | None = None,
    env: dict[str, str] | None = None,
    keep_store: bool = False,
) -> DumpRun:
    """Write a config for ``ds`` (or ``config``), dump epoch 0 in a subprocess, delete the store.

    ``keep_keys`` reads the epoch's keys before the store goes: through zarr, or ``read_keys(store)``,
    which returns them ``(samples, n_key_columns)``. A ``config`` names its own store path. ``env`` is
    the dump's whole environment (default: this process's); ``keep_store`` leaves the store to the caller.
    """
    store = workdir / f"store-{ds.name}"
    text = ds.config(store, fraction) if config is None else config
    if config is not None:
        store = Path(text.split('[store]\npath = "', 1)[1].split('"', 1)[0])
    path = workdir / f"{ds.name}.toml"
    path.write_text(text, encoding="utf-8")
    argv = [str(PGPREFETCH), "dump", "--config", str(path), "--epoch", "0", "--force", "--json", "--dsn", dsn]
    if measure_rss:
        argv = [sys.executable, "-c", RSS_WRAPPER, *argv]
    keys = None
    try:
        started = time.perf_counter()
        p = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
        seconds = time.perf_counter() - started
        if keep_keys and p.returncode == 0:
            if read_keys is None:
                written = zarr.open_array(store / "epoch-00000" / "keys", mode="r")[:]  # (n_batches, size, k)
            else:
                written = read_keys(store)
            keys = written.reshape(-1, written.shape[-1]).T
    finally:
        if not keep_store:
            shutil.rmtree(store, ignore_errors=True)
    lines = p.stdout.strip().splitlines()
    rss = 0
    if measure_rss:
        *lines, last = lines or ["MAXRSS_KIB 0 RC -1"]
        _, kib, _, rc = last.split()
        rss = int(kib) * 1024
        failed = int(rc) != 0
    else:
        failed = p.returncode != 0
    if failed or not lines:
        raise RuntimeError(f"pgprefetch dump of {ds.name} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    result = json.loads(lines[-1])
    samples = int(result["n_samples"])
    return DumpRun(
        samples=samples,
        seconds=seconds,
        dump_seconds=float(result["seconds"]),
        max_rss=rss,
        keys=None if keys is None else np.ascontiguousarray(keys[:, :samples]),
    )
