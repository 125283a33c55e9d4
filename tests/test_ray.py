"""The Ray executor against a real two-node Ray cluster on 127.0.0.1: the same bytes as the single process.

The cluster is the session's ``ray_cluster`` (tests/conftest.py): the golden epoch, compressed epochs
locally and on S3, keys beyond memory, the single process's errors, the CLI's reports and one-line
errors, how an epoch is cut into parts. What a fault leaves (a part that failed, a worker, the driver or a
node killed, connections lost) and how the rerun resumes it is tests/test_ray_faults.py's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
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
from .harness.golden import GOLDEN, TABLE, digest, golden_config
from .harness.raycluster import manifest, on_ray
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
