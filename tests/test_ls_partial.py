"""``pgprefetch ls`` on a partial epoch says what the rerun then keeps: its batches and their samples (#37).

A partial epoch is made the way a user meets one: a dump stopped part-way by a NULL in a late batch (the
rest written and journaled), once by the single process and twice by the Ray executor, whose parts journal
beside the epoch's own journal on a local store and leave records in the bucket on S3. The rerun (the NULL
fixed) reports the batches it resumed; ``ls`` before it must have said the same, and counted the samples
of those batches, not the epoch's total.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pgprefetch
from pgprefetch.errors import SampleError

from .harness.configs import s_config
from .harness.db import execute
from .harness.dumps import dump, read_arrays
from .harness.raycluster import fail_the_last_part, single_process
from .harness.s3 import S3

ROOT = Path(__file__).resolve().parent.parent
SIZE = 100  # 480 rows, drop_last = false: batches 0-3 of 100 samples and a short batch 4 of 80


def _null_in_last_batch(dsn: str, tmp_path: Path) -> int:
    """Make one sample of the epoch's last batch NULL (found from a clean dump of the same order)."""
    clean = dump(s_config(tmp_path, name="clean.toml", store="clean.zarr", size=SIZE, drop_last=False), dsn)
    sample = round(float(read_arrays(clean)["v"][-1][0]) * 2)  # v = id / 2
    execute(dsn, "ALTER TABLE s ALTER COLUMN v DROP NOT NULL", f"UPDATE s SET v = NULL WHERE id = {sample}")
    return sample


def _ls_json(store: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "pgprefetch", "ls", "--store", str(store), "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    )
    (entry,) = json.loads(out.stdout)["epochs"]
    return entry


def test_ls_of_a_stopped_single_process_dump_shows_the_batches_and_samples_the_rerun_keeps(
    s_table: str, tmp_path: Path
) -> None:
    sample = _null_in_last_batch(s_table, tmp_path)
    config = s_config(tmp_path, size=SIZE, drop_last=False)
    with pytest.raises(SampleError):
        dump(config, s_table)
    entry = _ls_json(tmp_path / "store.zarr")
    (info,) = pgprefetch.ls(tmp_path / "store.zarr")
    execute(s_table, f"UPDATE s SET v = id * 0.5 WHERE id = {sample}")
    rerun = dump(config, s_table)
    assert rerun.resumed > 0  # the stopped dump got somewhere
    assert entry["state"] == "partial"
    assert entry["batches_written"] == info.batches_written == rerun.resumed
    assert entry["n_batches"] == 5
    # The last (short) batch failed: the kept batches are full ones.
    assert entry["n_samples"] == info.n_samples == rerun.resumed * SIZE
    assert entry["n_samples_total"] == 480


def test_ls_of_a_failed_ray_dump_counts_the_batches_the_parts_journaled(
    ray_cluster: object, s_table: str, tmp_path: Path
) -> None:
    sample = _null_in_last_batch(s_table, tmp_path)
    config = s_config(tmp_path, size=16)  # 30 batches in two parts of 15; the NULL in batch 25 or so
    with pytest.raises(SampleError):
        pgprefetch.dump(config, epochs=0, dsn=s_table, executor="ray", parts=2)
    (info,) = pgprefetch.ls(tmp_path / "store.zarr")
    execute(s_table, f"UPDATE s SET v = id * 0.5 WHERE id = {sample}")
    (rerun,) = pgprefetch.dump(config, epochs=0, dsn=s_table, executor="ray", parts=2)
    assert rerun.resumed > 0
    assert info.state == "partial"
    assert (info.batches_written, info.n_batches) == (rerun.resumed, 30)
    assert info.n_samples == rerun.resumed * 16
    assert info.n_samples_total == 480


@pytest.mark.scale  # make chaos: ls of a failed Ray dump stays in make test (above); S3's records add 22 s there
def test_ls_of_a_failed_ray_dump_into_s3_counts_the_batches_the_parts_recorded(
    ray_cluster: object, s_table: str, tmp_path: Path, s3: S3
) -> None:
    bucket = s3.bucket()
    store = f"s3://{bucket}/k"
    config = s_config(tmp_path, store=store, compression="zstd")  # a file per batch: 30 batches, parts of 10
    single = single_process(tmp_path, s_table, compression="zstd")
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "PGPREFETCH_"))}  # the workers' moto
    late = fail_the_last_part(s_table, single)
    for _ in range(3):  # Ray runs the last part after another has finished, almost always: not by contract
        with pytest.raises(SampleError):
            pgprefetch.dump(config, epochs=0, dsn=s_table, executor="ray", parts=3, ray_env=env)
        (info,) = pgprefetch.ls(store)
        if info.batches_written:
            break
    execute(s_table, f"UPDATE s SET v = {late} * 0.5 WHERE id = {late}")
    (rerun,) = pgprefetch.dump(config, epochs=0, dsn=s_table, executor="ray", parts=3, ray_env=env)
    assert rerun.resumed > 0
    assert (info.state, info.batches_written, info.n_batches) == ("partial", rerun.resumed, 30)
    assert (info.n_samples, info.n_samples_total) == (rerun.resumed * 16, 480)
