"""The Ray executor against a real two-node Ray cluster on 127.0.0.1: the same bytes as the single process.

The cluster is the session's ``ray_cluster`` (tests/conftest.py). The long fault scenarios (a worker killed
with ``kill -9`` mid-part, the driver killed and the epoch resumed) run under ``make chaos``
(the mark ``chaos``: ``make test`` leaves them out).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import pgprefetch
from pgprefetch.cli import cli
from pgprefetch.errors import SampleError
from pgprefetch.write.ray.driver import split

from .harness.configs import s_config
from .harness.db import execute
from .harness.dumps import chunk_bytes, dump
from .harness.faults import kill_every_connection
from .harness.golden import GOLDEN, TABLE, digest, golden_config
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
from .harness.spill import TINY_MEMORY, numbers_config

ROOT = Path(__file__).resolve().parent.parent


def test_an_epoch_dumped_on_a_two_node_cluster_is_the_golden_epoch_byte_for_byte(
    ray_cluster: object, db: str, tmp_path: Path
) -> None:
    execute(db, *TABLE)  # padded arrays, a NULL mask, "auto" categories, a padded last batch
    result = on_ray(golden_config(tmp_path), db, epoch=2, parts=3)
    assert digest(Path(result.path)) == GOLDEN["query"]  # every array, keys, _checksums and _longest
    assert (result.executor, result.parts) == ("ray", 3)
    single = dump(golden_config(tmp_path, store="single.zarr", name="s.toml"), db, epoch=2)
    ours, theirs = manifest(result.path), manifest(single.path)
    assert ours["stats"] == theirs["stats"]
    assert ours["longest"] == theirs["longest"]
    assert (ours["executor"], ours["parts"]) == ("ray", 3)
    assert pgprefetch.verify(tmp_path / "store.zarr", 2) == []


def test_compressed_epochs_on_ray_equal_the_single_process_locally_and_on_s3_and_force_rewrites_them(
    ray_cluster: object, db: str, tmp_path: Path, s3: S3
) -> None:
    execute(db, *TABLE)
    bucket = s3.bucket()
    single = dump(golden_config(tmp_path, compression="zstd", name="s.toml", store="single.zarr"), db)
    local = on_ray(golden_config(tmp_path, compression="zstd"), db)
    assert chunk_bytes(Path(local.path)) == chunk_bytes(Path(single.path))
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "PGPREFETCH_"))}  # the workers' moto
    remote_cfg = golden_config(tmp_path, compression="zstd", name="r.toml", store=f"s3://{bucket}/ray")
    (remote,) = pgprefetch.dump(remote_cfg, epochs=0, dsn=db, executor="ray", parts=2, ray_env=env)
    assert remote.parts == 2
    objects = s3.objects(bucket, "ray/epoch-00000/")
    assert {k: v for k, v in objects.items() if "/" in k} == chunk_bytes(Path(single.path))
    assert json.loads(objects["zarr.json"])["attributes"]["pgprefetch"]["stats"] == manifest(single.path)["stats"]
    # --force: the parts stage apart from the driver (as on other machines), their files go up from their nodes.
    apart = {**env, "PGPREFETCH_STAGING": str(tmp_path / "parts-staging")}
    (forced,) = pgprefetch.dump(remote_cfg, epochs=0, dsn=db, executor="ray", parts=2, ray_env=apart, force=True)
    assert (forced.status, forced.parts) == ("written", 2)
    again = s3.objects(bucket, "ray/epoch-00000/")
    assert {k: v for k, v in again.items() if "/" in k} == chunk_bytes(Path(single.path))  # no part record left
    ours = json.loads(again["zarr.json"])["attributes"]["pgprefetch"]
    assert ours["snapshots"] != json.loads(objects["zarr.json"])["attributes"]["pgprefetch"]["snapshots"]
    assert ours["stats"] == manifest(single.path)["stats"]


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


def test_a_null_met_by_a_part_is_the_single_process_error_and_nothing_is_published(
    ray_cluster: object, s_table: str, tmp_path: Path
) -> None:
    execute(s_table, "ALTER TABLE s ALTER COLUMN v DROP NOT NULL", "UPDATE s SET v = NULL WHERE id = 400")
    config = s_config(tmp_path)
    with pytest.raises(SampleError) as single:
        dump(config, s_table)
    with pytest.raises(SampleError) as spread:
        on_ray(config, s_table, parts=2)
    assert str(spread.value) == str(single.value)
    assert "400" in str(spread.value)
    assert pgprefetch.ls(tmp_path / "store.zarr")[0].state == "partial"  # kept for a rerun, not published


def test_json_reports_the_parts_in_both_modes_and_a_missing_ray_is_a_one_line_error(
    ray_cluster: object, s_table: str, tmp_path: Path
) -> None:
    config = s_config(tmp_path)
    args = ["dump", "--config", str(config), "--dsn", s_table, "--epoch", "0", "--executor", "ray", "--parts", "2"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.splitlines()[-1])
    assert (summary["executor"], summary["parts"], summary["part_retries"]) == ("ray", 2, [0, 0])
    scan = tmp_path / "scan.toml"
    scan.write_text('[samples]\ntable = "s"\nkey = ["id"]\n[fields.v]\ncolumns = ["v"]\ndtype = "float32"\n'
                    '[batches]\nsize = 16\n[store]\npath = "scan.zarr"\n')  # fmt: skip
    result = CliRunner().invoke(cli, ["dump", "--config", str(scan), "--dsn", s_table, "--epoch", "0",
                                      "--executor", "ray", "--parts", "2", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.splitlines()[-1])
    assert (summary["executor"], summary["parts"], summary["rows_read"]) == ("ray", 2, 480)
    # Without Ray installed; and the CLI and the API never import Ray unless asked to.
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import pgprefetch.api, pgprefetch.cli.commands, pgprefetch.cli.dump\n"
        "assert not any(m == 'ray' or m.startswith('ray.') for m in sys.modules if sys.modules[m] is not None)\n"
        "from pgprefetch.cli import cli; cli([*sys.argv[1:]])\n"
    )
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert run.returncode == 1, run.stderr
    expected = "Error: --executor ray needs Ray, which is not installed: pip install 'pgprefetch[ray]'"
    assert run.stderr.strip() == expected


def test_a_piped_dump_on_ray_logs_one_progress_stream_naming_the_parts_done(
    ray_cluster: object, s_table: str, tmp_path: Path
) -> None:
    config = s_config(tmp_path, slow=True)  # about 2 s: several of the driver's polls
    args = ["dump", "--config", str(config), "--dsn", s_table, "--epoch", "0", "--executor", "ray", "--parts", "2",
            "--log-every", "0.1"]  # fmt: skip
    result = CliRunner().invoke(cli, args)  # stderr is not a terminal: log lines, no bar
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if "samples/s, ETA" in line]
    assert lines
    for line in lines:
        assert re.search(r"samples \(\d+%\), [\d,]+ samples/s, ETA \d+ s, parts [0-2]/2$", line), line
    done = [int(re.search(r"parts (\d)/2$", line)[1]) for line in lines]  # type: ignore[index]
    assert done == sorted(done)
    assert lines[-1].endswith("parts 2/2")  # a part that finished is logged then, whatever the interval
    rates = [int(re.search(r"([\d,]+) samples/s", line)[1].replace(",", "")) for line in lines]  # type: ignore[index]
    assert min(rates) > 0  # the parts' samples are in the rate, not taken for batches an earlier run kept


def test_parts_are_contiguous_and_on_an_object_store_end_where_every_array_s_files_do() -> None:
    assert split(10, 3) == [range(0, 3), range(3, 6), range(6, 10)]
    assert split(10, 4, step=4) == [range(0, 4), range(4, 8), range(8, 10)]
    assert split(5, 8) == [range(i, i + 1) for i in range(5)]
    assert split(7, 2, step=7) == [range(0, 7)]


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


def test_a_part_on_a_node_that_cannot_see_a_local_store_is_one_line_naming_the_node(
    ray_cluster: Any, tmp_path: Path
) -> None:
    import numpy as np
    import ray

    from pgprefetch.errors import StoreError
    from pgprefetch.write.ray.cluster import Tracker
    from pgprefetch.write.ray.part import PartSpec, run_part

    # As a worker on another machine finds it: the store's folder is not there (not a shared filesystem).
    spec = PartSpec(0, 2, range(0, 4), (0, 1, 2, 3), None, 0, str(tmp_path / "elsewhere.zarr"), "", "",  # type: ignore[arg-type]
                    None, None, (), {}, {})  # type: ignore[arg-type]  # fmt: skip
    tracker = Tracker.remote()  # type: ignore[attr-defined]
    try:
        with pytest.raises(StoreError, match=r"part 1 of 2 \(batches 0-3\): node 127\.0\.0\.1 cannot see the partial"):
            ray.get(run_part.options(max_retries=0).remote(spec, np.empty((1, 0), dtype=np.int64), tracker))
    finally:
        ray.kill(tracker)


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


def test_an_address_where_no_cluster_answers_is_a_one_line_error_not_a_wait(s_table: str, tmp_path: Path) -> None:
    # Ray itself retries an unreachable cluster without end; a cron run with a mistyped RAY_ADDRESS would hang.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    config = s_config(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "pgprefetch", "dump", "--config", str(config), "--dsn", s_table, "--epoch", "0",
         "--executor", "ray"],
        capture_output=True, text=True, cwd=tmp_path, timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": f"127.0.0.1:{port}"},
    )  # fmt: skip
    assert run.returncode != 0
    assert run.stderr.strip().splitlines() == [
        f"Error: cannot join the Ray cluster at 127.0.0.1:{port}: nothing answers there (Connection refused); "
        "start it with `ray start --head`, or unset RAY_ADDRESS to start one on this host"
    ]
    assert not (tmp_path / "store.zarr").exists() or not list((tmp_path / "store.zarr").glob("epoch-*"))


def test_keys_beyond_memory_reach_the_parts_a_part_at_a_time_with_the_in_memory_bytes(
    ray_cluster: object, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pgprefetch.write.order.keyfile import OrderedKeys

    read: list[int] = []  # how many keys the driver takes from the ordered key file at once
    columns = OrderedKeys.columns
    monkeypatch.setattr(OrderedKeys, "columns", lambda self, a, b: read.append(b - a) or columns(self, a, b))
    spread = on_ray(numbers_config(tmp_path / "r"), db, parts=4, memory=TINY_MEMORY)
    whole = dump(numbers_config(tmp_path / "w"), db)
    assert chunk_bytes(Path(spread.path)) == chunk_bytes(Path(whole.path))
    assert max(read) == 50_000  # a part's keys (200,000 keys in 4 parts), never all of them
