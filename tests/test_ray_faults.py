"""The Ray executor under faults: what a failed part, a killed worker, driver or node, or lost connections
leave, and a rerun (or Ray's own retry) that keeps what was recorded and gives the single process's bytes.

The cluster is the session's ``ray_cluster`` (tests/conftest.py). Part records on S3 are kept only with
this epoch's identity and all their files; under ``--force`` nothing is kept. The long fault scenarios (a
worker killed with ``kill -9`` mid-part, the driver killed and the epoch resumed, a node removed) run under
``make chaos`` (the mark ``chaos``: ``make test`` leaves them out).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import pgprefetch
from pgprefetch.errors import SampleError

from .harness.configs import s_config
from .harness.db import execute
from .harness.dumps import chunk_bytes, dump
from .harness.faults import kill_every_connection
from .harness.raycluster import (
    fail_the_last_part,
    fault_mid_dump,
    manifest,
    on_ray,
    part_journal_lines,
    parts_running,
    parts_writing,
    single_process,
)
from .harness.s3 import S3

ROOT = Path(__file__).resolve().parent.parent


def _last_modified(s3: S3, bucket: str, prefix: str) -> dict[str, Any]:
    """When each object under ``prefix`` was last put, by key relative to it."""
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {
        item["Key"].removeprefix(prefix): item["LastModified"] for page in pages for item in page.get("Contents", [])
    }


def _records(s3: S3, bucket: str, prefix: str) -> dict[int, Any]:
    """The part records under an epoch's ``prefix``, by part."""
    from pgprefetch.store.records import PartRecord

    found = [PartRecord.decode(v) for k, v in s3.objects(bucket, prefix).items() if k.startswith("_parts/")]
    return {r.index: r for r in found if r is not None}


def test_a_rerun_on_s3_keeps_the_parts_a_failed_dump_recorded_without_uploading_them_again(
    ray_cluster: object, s_table: str, tmp_path: Path, s3: S3
) -> None:
    bucket = s3.bucket()
    config = s_config(tmp_path, store=f"s3://{bucket}/k", compression="zstd")  # a file per batch: parts of 10
    single = single_process(tmp_path, s_table, compression="zstd")
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "PGPREFETCH_"))}  # the workers' moto
    late = fail_the_last_part(s_table, single)
    with pytest.raises(SampleError, match=str(late)):
        on_ray(config, s_table, parts=3, ray_env=env)
    records = _records(s3, bucket, "k/epoch-00000/")
    assert records  # a part that finished recorded itself
    assert 2 not in records  # the one that failed did not
    kept = {f"epoch-00000/{f}" for r in records.values() for f in r.files}
    before = _last_modified(s3, bucket, "k/")
    execute(s_table, f"UPDATE s SET v = {late} * 0.5 WHERE id = {late}")  # the data fixed, the keys the same
    time.sleep(1)  # an object's LastModified is to the second
    elsewhere = {**env, "PGPREFETCH_STAGING": str(tmp_path / "new-nodes")}  # the nodes' staging is gone, too
    result = on_ray(config, s_table, parts=3, ray_env=elsewhere)
    assert result.resumed == sum(len(r.owned) for r in records.values())
    assert result.restarted is None
    after = _last_modified(s3, bucket, "k/")
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept}  # the kept parts' files: not put again
    rerun = [k for k in after if k.startswith("epoch-00000/v/") and k not in kept]
    assert rerun
    assert all(after[k] > before.get(k, after[k] - timedelta(1)) for k in rerun)  # (which the others were)
    objects = s3.objects(bucket, "k/epoch-00000/")
    assert {k: v for k, v in objects.items() if "/" in k} == chunk_bytes(Path(single.path))  # records gone too
    ours = json.loads(objects["zarr.json"])["attributes"]["pgprefetch"]
    assert ours["stats"] == manifest(single.path)["stats"]
    assert ours["resumed_batches"] == result.resumed
    assert len(ours["snapshots"]) == 2  # the kept parts' snapshot, and this run's


@pytest.mark.chaos
def test_part_records_of_other_keys_or_before_a_force_are_not_reused(
    ray_cluster: object, s_table: str, tmp_path: Path, s3: S3
) -> None:
    # (make test checks the records' matching without a cluster: the next test)
    bucket = s3.bucket()
    config = s_config(tmp_path, store=f"s3://{bucket}/o", compression="zstd")
    single = single_process(tmp_path, s_table, compression="zstd")
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "PGPREFETCH_"))}
    late = fail_the_last_part(s_table, single)
    with pytest.raises(SampleError):
        on_ray(config, s_table, parts=3, ray_env=env)
    earlier = _records(s3, bucket, "o/epoch-00000/")
    assert earlier
    with pytest.raises(SampleError, match=str(late)):  # --force: a fresh epoch, the earlier parts not kept
        on_ray(config, s_table, parts=3, ray_env=env, force=True)
    records = _records(s3, bucket, "o/epoch-00000/")
    assert records
    assert {r.snapshot for r in records.values()}.isdisjoint({r.snapshot for r in earlier.values()})
    execute(s_table, f"DELETE FROM s WHERE id = {late}")  # other keys: every batch is another
    result = on_ray(config, s_table, parts=3, ray_env=env)
    assert (result.resumed, result.restarted) == (0, "the keys changed (480 keys then, 464 now)")
    fresh = dump(s_config(tmp_path, name="fresh.toml", store="fresh.zarr", compression="zstd"), s_table)
    objects = s3.objects(bucket, "o/epoch-00000/")
    assert {k: v for k, v in objects.items() if "/" in k} == chunk_bytes(Path(fresh.path))


@pytest.mark.chaos
def test_a_scan_epoch_on_s3_resumes_the_recorded_parts_and_force_rewrites_it(
    ray_cluster: object, s_table: str, tmp_path: Path, s3: S3
) -> None:
    def scan(name: str, store: str) -> Path:
        path = tmp_path / name
        path.write_text('[samples]\ntable = "s"\nkey = ["id"]\n[fields.v]\ncolumns = ["v"]\ndtype = "float32"\n'
                        f'[batches]\nsize = 16\n[store]\npath = "{store}"\ncompression = "zstd"\n')  # fmt: skip
        return path

    bucket = s3.bucket()
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "PGPREFETCH_"))}
    single = dump(scan("single.toml", "single.zarr"), s_table)
    late = fail_the_last_part(s_table, single)
    config = scan("r.toml", f"s3://{bucket}/sc")
    with pytest.raises(SampleError):
        on_ray(config, s_table, parts=3, ray_env=env)
    records = _records(s3, bucket, "sc/epoch-00000/")
    assert records
    execute(s_table, f"UPDATE s SET v = {late} * 0.5 WHERE id = {late}")
    result = on_ray(config, s_table, parts=3, ray_env=env)
    assert result.resumed == sum(len(r.owned) for r in records.values())
    objects = s3.objects(bucket, "sc/epoch-00000/")
    assert {k: v for k, v in objects.items() if "/" in k} == chunk_bytes(Path(single.path))
    assert on_ray(config, s_table, parts=3, ray_env=env, force=True).status == "written"
    objects = s3.objects(bucket, "sc/epoch-00000/")
    assert {k: v for k, v in objects.items() if "/" in k} == chunk_bytes(Path(single.path))


def test_a_part_record_is_kept_only_with_this_epoch_s_identity_and_range_and_all_its_files(s3: S3) -> None:
    import numpy as np

    from pgprefetch.store.open import open_store
    from pgprefetch.store.records import PartRecord, put_record, record_key, usable

    store = open_store(f"s3://{s3.bucket()}/u")
    store.create()
    header = {"config_sha256": "c1", "n_keys": 64, "keys_sha256": "k1", "n_batches": 4, "batch_size": 16,
              "compression": "zstd", "arrays": {"v": ["<f4", []]}}  # fmt: skip
    ranges = [range(0, 2), range(2, 4)]
    store.put("epoch-00000/v/c/0/0", b"ab")  # part 1's two files are up; part 2's only one
    store.put("epoch-00000/v/c/2/0", b"cd")
    rows = np.array([[[16, 0.5, np.nan, -1.0, 2.0]], [[16, 1.5, 3.0, 0.0, np.inf]]])

    def put(index: int, owned: range, files: dict[str, int], **changed: Any) -> PartRecord:
        batches = np.arange(owned.start, owned.stop)
        record = PartRecord(index, owned, {**header, **changed}, "snap-1", batches, np.array([[7, 8]], dtype=np.uint32),
                            (rows, {"v_length": np.array([3, 4])}), files)  # fmt: skip
        put_record(store, 0, record)
        return record

    first = put(0, ranges[0], {"v/c/0/0": 2, "v/c/1/0": 2})
    store.put("epoch-00000/v/c/1/0", b"ef")
    put(1, ranges[1], {"v/c/2/0": 2, "v/c/3/0": 2})
    kept, why = usable(store, 0, header, ranges)  # type: ignore[arg-type]
    assert why == "a part's file is missing from the store (v/c/3/0)"
    assert [r.index for r in kept] == [0]
    (record,) = kept
    assert (record.owned, record.header, record.snapshot, record.files) == (first.owned, header, "snap-1", first.files)
    assert np.array_equal(record.checksums, first.checksums)
    assert np.array_equal(record.figures[0], rows, equal_nan=True)  # the statistics partials, bit for bit
    assert np.array_equal(record.figures[1]["v_length"], [3, 4])
    assert store.read(record_key(0, 1)) is None  # a record not kept is deleted: its part runs again

    assert usable(store, 0, header, [range(0, 1), range(1, 4)])[1] == "it was split into other parts (2 now)"
    put(0, ranges[0], first.files, keys_sha256="k0")
    assert usable(store, 0, header, ranges) == ([], "the keys changed (64 keys then, 64 now)")
    put(0, ranges[0], first.files, config_sha256="c0")
    assert usable(store, 0, header, ranges) == ([], "the config changed")
    store.put(record_key(0, 0), b"cut short")
    assert usable(store, 0, header, ranges) == ([], "a part's record is unreadable")
    assert usable(store, 0, header, ranges) == ([], None)  # none left


def test_under_force_a_part_whose_node_or_staged_files_were_lost_is_written_again_not_published_short(
    ray_cluster: Any, s3: S3
) -> None:
    import numpy as np
    import ray

    from pgprefetch.store.open import open_store
    from pgprefetch.write.ray.part import PartResult, PartSpec
    from pgprefetch.write.ray.staged import upload_staged

    store = open_store(f"s3://{s3.bucket()}/f")
    store.create()
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "PGPREFETCH_"))}
    specs = [PartSpec(i, 2, range(2 * i, 2 * i + 2), (2 * i, 2 * i + 1), None, 0, store.location, "snap", "",  # type: ignore[arg-type]
                      None, None, (), {}, {}, True) for i in range(2)]  # type: ignore[arg-type]  # fmt: skip
    figures = (np.zeros((2, 0, 5)), {})
    here = ray.get_runtime_context().get_node_id()
    gone = "ab" * 28  # a node no longer in the cluster
    results = [
        PartResult(0, np.arange(0, 2), np.zeros((1, 2), np.uint32), figures, ("v/c/0/0",), "127.0.0.1", here),
        PartResult(1, np.arange(2, 4), np.zeros((1, 2), np.uint32), figures, ("v/c/2/0",), "127.0.0.1", gone),
    ]
    again = upload_staged(store, specs, results, {}, {"runtime_env": {"env_vars": env}})  # type: ignore[arg-type]
    assert [(spec.index, spec.defer) for spec in again] == [(0, False), (1, False)]  # staging gone; node gone
    assert open_store(store.location).sizes("epoch-00000") == {}  # nothing uploaded, no part recorded


def struck_mid_dump(
    s_table: str,
    tmp_path: Path,
    when: Callable[[Path], object],
    fault: Callable[[], object],
    *,
    parts: int = 2,
    join: float = 120,
) -> pgprefetch.DumpResult:
    """A slow dump of ``s`` on Ray, struck by ``fault`` once ``when(store)``; its bytes the single process's."""
    config = s_config(tmp_path, slow=True)
    single = single_process(tmp_path, s_table)
    store = tmp_path / "store.zarr"
    result = fault_mid_dump(lambda: on_ray(config, s_table, parts=parts), lambda: when(store), fault, join=join)
    assert chunk_bytes(Path(result.path)) == chunk_bytes(Path(single.path))
    return result


@pytest.mark.chaos
def test_a_worker_killed_with_kill_9_mid_part_is_retried_by_ray_and_the_epoch_is_unchanged(
    ray_cluster: Any, s_table: str, tmp_path: Path
) -> None:
    result = struck_mid_dump(
        s_table,
        tmp_path,
        lambda store: part_journal_lines(store) >= 2,  # mid-part: some batches written, most not
        lambda: os.kill(parts_running(ray_cluster)[0].pid, 9),
    )
    assert sum(result.part_retries) == 1


@pytest.mark.chaos
def test_a_driver_killed_with_kill_9_is_resumed_from_the_parts_journals_byte_identical(
    ray_cluster: Any, s_table: str, tmp_path: Path
) -> None:
    config = s_config(tmp_path, slow=True)
    single = single_process(tmp_path, s_table)
    code = "import sys; from pgprefetch.cli import cli; cli(sys.argv[1:])"
    argv = ["dump", "--config", str(config), "--dsn", s_table, "--epoch", "0", "--executor", "ray", "--parts", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ray_cluster.address}
    driver = subprocess.Popen([sys.executable, "-c", code, *argv], cwd=tmp_path, env=env)
    journals = tmp_path / "store.zarr"
    deadline = time.monotonic() + 60
    while part_journal_lines(journals) < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    driver.kill()
    driver.wait()
    while parts_running(ray_cluster) and time.monotonic() < deadline + 30:  # Ray stops a dead driver's tasks
        time.sleep(0.1)
    result = on_ray(config, s_table, parts=2)
    assert result.resumed >= 4
    assert chunk_bytes(Path(result.path)) == chunk_bytes(Path(single.path))
    assert not list(journals.rglob("*.journal*"))


@pytest.mark.chaos
def test_a_driver_killed_with_kill_9_on_s3_is_resumed_from_the_parts_records_byte_identical(
    ray_cluster: Any, s_table: str, tmp_path: Path, s3: S3
) -> None:
    bucket = s3.bucket()
    config = s_config(tmp_path, slow=True, store=f"s3://{bucket}/d", compression="zstd")
    single = single_process(tmp_path, s_table, compression="zstd")
    workers = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "PGPREFETCH_"))}
    code = (
        "import sys, json, pgprefetch\n"
        "pgprefetch.dump(sys.argv[1], epochs=0, dsn=sys.argv[2], executor='ray', parts=3,"
        " ray_env=json.loads(sys.argv[3]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ray_cluster.address,
           "PGPREFETCH_LEASE_SECONDS": "3"}  # fmt: skip  # (its lease outlives it by that much)
    driver = subprocess.Popen([sys.executable, "-c", code, str(config), s_table, json.dumps(workers)], cwd=tmp_path,
                              env=env)  # fmt: skip
    deadline = time.monotonic() + 90
    while not _records(s3, bucket, "d/epoch-00000/") and time.monotonic() < deadline:
        time.sleep(0.1)  # a part finished: its files are up and recorded, the third part is yet to run
    driver.kill()
    driver.wait()
    records = _records(s3, bucket, "d/epoch-00000/")
    assert records
    assert len(records) < 3
    kept = {f"epoch-00000/{f}" for r in records.values() for f in r.files}
    before = _last_modified(s3, bucket, "d/")
    while parts_running(ray_cluster) and time.monotonic() < deadline + 30:  # Ray stops a dead driver's tasks
        time.sleep(0.1)
    records = _records(s3, bucket, "d/epoch-00000/")  # (one may have finished meanwhile)
    while True:  # until the dead driver's lease expires
        result = on_ray(config, s_table, parts=3, ray_env=workers)
        if result.status != "busy":
            break
        assert time.monotonic() < deadline + 60
        time.sleep(0.5)
    assert result.resumed == sum(len(r.owned) for r in records.values())
    assert result.resumed > 0
    after = _last_modified(s3, bucket, "d/")
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept}  # the finished parts' files: not put again
    objects = s3.objects(bucket, "d/epoch-00000/")
    assert {k: v for k, v in objects.items() if "/" in k} == chunk_bytes(Path(single.path))
    assert json.loads(objects["zarr.json"])["attributes"]["pgprefetch"]["stats"] == manifest(single.path)["stats"]


@pytest.mark.chaos
def test_connections_lost_in_the_parts_are_retried_as_today_keeping_the_parts_batches(
    ray_cluster: Any, s_table: str, tmp_path: Path
) -> None:
    result = struck_mid_dump(
        s_table, tmp_path, lambda store: part_journal_lines(store) >= 4, lambda: kill_every_connection(s_table)
    )
    assert result.retries == 1  # a new snapshot, the keys unchanged: the parts' batches kept
    assert result.resumed >= 4


@pytest.mark.chaos
def test_a_node_removed_mid_epoch_has_its_part_rerun_elsewhere_and_the_epoch_is_unchanged(
    ray_cluster: Any, s_table: str, tmp_path: Path
) -> None:
    node = ray_cluster.add_node(num_cpus=1)  # a third node, not the one this process (the driver) is attached to
    ray_cluster.wait_for_nodes()
    result = struck_mid_dump(
        s_table,
        tmp_path,
        lambda store: parts_writing(store) >= 3,  # every part has written a batch: the new node's too
        lambda: ray_cluster.remove_node(node),  # its raylet and workers gone: its part runs again on another node
        parts=3,
        join=180,
    )
    assert sum(result.part_retries) >= 1


@pytest.mark.chaos
@pytest.mark.parametrize("packed", [False, True], ids=["mixed", "packed-mix"])
def test_connections_lost_in_a_mixed_epochs_parts_are_retried_to_the_single_process_bytes(
    ray_cluster: Any, db: str, tmp_path: Path, packed: bool
) -> None:
    """A mix on Ray (a query source a part fetches, a scan source the driver sends it), its connections killed."""
    from .harness.db import execute
    from .harness.mixing import CODE_SCAN, MIX_TABLES, WEB, mix_config
    from .harness.packing import CODE_DOCS, DOCS, mixed_config

    if packed:
        execute(db, *DOCS, *CODE_DOCS)
        slow = "SELECT tokens FROM docs, pg_sleep(0.002) WHERE id = $1"

        def config(name: str) -> Path:
            path = mixed_config(tmp_path, 2, 1, name=f"{name}.toml", store=f"{name}.zarr")
            path.write_text(path.read_text().replace("SELECT tokens FROM docs WHERE id = $1", slow))
            return path
    else:
        execute(db, *MIX_TABLES)
        web = {**WEB, "query": "SELECT a, b, tag FROM web, pg_sleep(0.002) WHERE id = $1"}

        def config(name: str) -> Path:
            sources = {"web": {"weight": 3, **web}, "code": {"weight": 1, **CODE_SCAN}}
            return mix_config(tmp_path, sources, size=4, store=f"{name}.zarr", name=f"{name}.toml")

    single = dump(config("single"), db)
    store = tmp_path / "ray.zarr"
    result = fault_mid_dump(
        lambda: on_ray(config("ray"), db, parts=3), lambda: part_journal_lines(store) >= 2,
        lambda: kill_every_connection(db),
    )  # fmt: skip
    assert result.retries >= 1
    assert chunk_bytes(Path(result.path)) == chunk_bytes(Path(single.path))
