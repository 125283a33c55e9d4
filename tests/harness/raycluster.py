"""Ray for the tests: the session's two-node cluster on 127.0.0.1, its parts' processes and journals, faults.

The long fault scenarios (a worker killed with ``kill -9`` mid-part, the driver killed and the epoch
resumed, a node removed) run under ``make chaos`` (marked ``chaos``); :func:`fault_mid_dump`
is their common shape: a dump on Ray in a thread, a fault struck once it is under way.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import zarr

import pgprefetch

from .configs import s_config
from .db import execute
from .dumps import dump


@contextmanager
def two_node_cluster() -> Iterator[Any]:
    """A real two-node Ray cluster (a raylet of one CPU each) on 127.0.0.1, joined by this process.

    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (set by tests/conftest.py before Ray is imported) keeps Ray on
    the loopback address; a temp folder of its own keeps a stale ``/tmp/ray`` of another run out of it.
    """
    import ray
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="pgpf-ray-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = temp  # where Ray records the cluster this host runs (ray_current_cluster)
    os.makedirs(f"{temp}/ray")
    cluster = Cluster()
    try:
        cluster.add_node(num_cpus=1, temp_dir=f"{temp}/ray", include_dashboard=False)  # the head
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        # As the dump joins a cluster (write/ray/cluster.py): the raylets' and workers' own lines (a full disk's
        # warning, say) stay in their logs, not in the stderr of whichever test this worker runs next.
        ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def manifest(path: Path | str) -> dict[str, Any]:
    """An epoch's pgprefetch manifest (its ``zarr.json`` attributes)."""
    return dict(zarr.open_group(str(path), mode="r").attrs["pgprefetch"])


def on_ray(config: Path, dsn: str, epoch: int = 0, parts: int = 2, **kwargs: Any) -> pgprefetch.DumpResult:
    (result,) = pgprefetch.dump(config, epochs=epoch, dsn=dsn, executor="ray", parts=parts, **kwargs)
    return result


def fail_the_last_part(s_table: str, single: pgprefetch.DumpResult) -> int:
    """A NULL in the epoch's last batch: the last of three parts (run once one of two CPUs is free) fails on it."""
    late = int(zarr.open_group(str(single.path), mode="r")["keys"][-1, 0, 0])
    execute(s_table, "ALTER TABLE s ALTER COLUMN v DROP NOT NULL", f"UPDATE s SET v = NULL WHERE id = {late}")
    return late


def parts_running(cluster: Any, task: str = "run_part") -> list[Any]:
    """The worker processes of this session's cluster running ``task`` now (never another test run's)."""
    import psutil

    raylets = [
        info.process.pid
        for node in [cluster.head_node, *cluster.worker_nodes]
        for info in node.all_processes.get("raylet", [])
    ]
    found = []
    for pid in raylets:
        for child in psutil.Process(pid).children(recursive=True):
            try:
                if " ".join(child.cmdline()).startswith(f"ray::{task}"):
                    found.append(child)
            except psutil.Error:
                continue
    return found


def part_journal_lines(store: Path) -> int:
    """Batches the parts have journaled so far."""
    return sum(len(p.read_text().splitlines()) - 1 for p in store.rglob("*.journal.part-*"))


def parts_writing(store: Path) -> int:
    """Parts that have journaled a batch so far."""
    return sum(len(p.read_text().splitlines()) > 1 for p in store.rglob("*.journal.part-*"))


def fault_mid_dump(
    run: Callable[[], pgprefetch.DumpResult],
    when: Callable[[], object],
    fault: Callable[[], object],
    *,
    join: float = 120,
    step: float = 0.05,
) -> pgprefetch.DumpResult:
    """``run`` (a dump on Ray) in a thread; ``fault`` once ``when`` holds (or after 60 s); its result.

    The wait does not fail by itself: a fault that came too early or too late shows in the test's
    assertions on the result (retries, resumed batches, bytes), which say more than a timeout would.
    """
    results: list[pgprefetch.DumpResult] = []
    thread = threading.Thread(target=lambda: results.append(run()))
    thread.start()
    deadline = time.monotonic() + 60
    while not when() and time.monotonic() < deadline:
        time.sleep(step)
    fault()
    thread.join(join)
    (result,) = results
    return result


def single_process(folder: Path, s_table: str, **settings: Any) -> pgprefetch.DumpResult:
    """The single process's epoch 0 of ``s`` (``single.zarr``): the bytes a spread dump must equal."""
    return dump(s_config(folder, name="single.toml", store="single.zarr", **settings), s_table)
