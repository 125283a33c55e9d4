"""Operating a store on S3 (moto's server on 127.0.0.1): the cron commands, one writer per epoch, faults, errors.

``ls``, ``verify`` and ``prune`` with ``--ahead``/``--keep``; the lease that lets one dump write an epoch (a
second one skips it, an expired one is taken over, a lost one stops its dump); ``kill -9`` mid-upload
and terminated database connections, resumed to the same bytes; and a bad URL, bucket or credentials as
one line that never shows the secret.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

from pgprefetch import EpochDataset
from pgprefetch.errors import EpochNotReadyError, StoreError
from pgprefetch.store.lease import Lease
from pgprefetch.store.open import open_store
from pgprefetch.store.s3 import S3Store

from .harness.configs import s_config
from .harness.dumps import chunk_bytes, dump, dump_argv, run_cli, wait_for
from .harness.s3 import S3, SECRET, epoch_objects


def test_ls_verify_prune_ahead_and_keep_on_s3(s_table: str, s3: S3, tmp_path: Path) -> None:
    bucket = s3.bucket()
    url = f"s3://{bucket}/ops"
    cfg = s_config(tmp_path, store=url)
    code, out = run_cli("dump", "--config", str(cfg), "--ahead", "2", "--dsn", s_table, "-q")
    assert (code, out) == (0, "")
    code, out = run_cli("ls", "--store", url, "--json")
    assert code == 0, out
    assert [(e["epoch"], e["state"]) for e in json.loads(out)["epochs"]] == [(0, "complete"), (1, "complete")]
    assert run_cli("verify", "--store", url, "--epoch", "1") == (0, "epoch 1: every chunk matches its checksum\n")
    key = "ops/epoch-00001/v/c/0/0"
    body = bytearray(s3.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    body[5] ^= 0x01
    s3.client().put_object(Bucket=bucket, Key=key, Body=bytes(body))
    code, out = run_cli("verify", "--store", url, "--epoch", "1")
    assert code == 1
    assert "v batch 0: checksum mismatch" in out
    EpochDataset(url, 2 - 1, consumer="train")  # training reached epoch 1: the cron keeps 0 behind it
    code, out = run_cli("dump", "--config", str(cfg), "--ahead", "1", "--keep", "0", "--dsn", s_table, "-q")
    assert code == 0, out
    assert open_store(url).epochs() == [1, 2]
    assert open_store(url).consumers() == {"train": 1}
    assert "ops/epoch-00000/zarr.json" not in s3.objects(bucket, "ops/epoch-00000")
    # A second run on the same bucket holds epoch 1 against the first run's cron, until it is forgotten.
    EpochDataset(url, 1, consumer="other")
    EpochDataset(url, 2, consumer="train")
    assert run_cli("prune", "--store", url, "--keep", "0", "--consumer", "train") == (0, "nothing to delete\n")
    assert open_store(url).epochs() == [1, 2]
    assert run_cli("forget", "--store", url, "other") == (0, "forgot consumer other (1 record)\n")
    assert open_store(url).consumers() == {"train": 2}
    assert run_cli("prune", "--store", url, "--keep", "0")[0] == 0
    assert open_store(url).epochs() == [2]


def test_kill_9_mid_upload_leaves_no_complete_epoch_and_the_rerun_resumes_and_skips_uploads(
    s_table: str, s3: S3, tmp_path: Path
) -> None:
    bucket = s3.bucket()
    url = f"s3://{bucket}/k"
    # Compressed: one object per batch, each uploaded as soon as it is written; slow: the kill lands mid-dump.
    cfg = s_config(tmp_path, store=url, slow=True, compression="zstd")
    env = {**os.environ}
    proc = subprocess.Popen(dump_argv(cfg, s_table), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: len(s3.objects(bucket, "k/epoch-00000/v/c")) >= 3)
    proc.kill()
    proc.communicate()
    assert open_store(url).epochs() == []
    assert open_store(url).partial_epochs() == [0]
    with pytest.raises(EpochNotReadyError):
        EpochDataset(url, 0, consumer=None)
    before = {
        item["Key"]: item["LastModified"]
        for item in s3.client().list_objects_v2(Bucket=bucket, Prefix="k/epoch-00000/v/c")["Contents"]
    }
    rerun = subprocess.run([*dump_argv(cfg, s_table), "--json"], env=env, capture_output=True, text=True, check=False)
    assert rerun.returncode == 0, rerun.stderr
    assert json.loads(rerun.stdout).get("resumed_batches", 0) >= 3, rerun.stdout + rerun.stderr
    after = {
        item["Key"]: item["LastModified"]
        for item in s3.client().list_objects_v2(Bucket=bucket, Prefix="k/epoch-00000/v/c")["Contents"]
    }
    assert sum(after[k] == t for k, t in before.items()) >= len(before) - 2  # uploaded ones were not sent again
    clean = dump(s_config(tmp_path, name="clean.toml", store="clean.zarr", slow=True, compression="zstd"), s_table)
    assert epoch_objects(s3, bucket, "k") == chunk_bytes(clean.path)
    remote, local = EpochDataset(url, 0, consumer=None), EpochDataset(clean.path.parent, 0, consumer=None)
    assert all(torch.equal(a["v"], b["v"]) for a, b in zip(remote, local, strict=True))  # zstd, through zarr


def test_a_second_dump_of_an_epoch_being_written_exits_0_and_says_so(s_table: str, s3: S3, tmp_path: Path) -> None:
    bucket = s3.bucket()
    cfg = s_config(tmp_path, store=f"s3://{bucket}/two", slow=True)
    first = subprocess.Popen(dump_argv(cfg, s_table), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: "two/.pgprefetch/locks/epoch-00000.lease" in {
        f"two/{k}" for k in s3.objects(bucket, "two")
    })  # fmt: skip
    second = subprocess.run(dump_argv(cfg, s_table), capture_output=True, text=True, check=False)
    assert second.returncode == 0, second.stderr
    assert "another dump is writing it" in second.stdout + second.stderr
    first.communicate(timeout=120)
    assert first.returncode == 0
    assert open_store(f"s3://{bucket}/two").epochs() == [0]


def test_a_lease_whose_holder_stopped_renewing_is_taken_over_after_it_expires(s3: S3) -> None:
    bucket = s3.bucket()
    client = S3Store(f"s3://{bucket}/lease").client
    dead = Lease(client, "l.lease", "epoch 0", seconds=1.0)
    assert dead.acquire()
    other = Lease(client, "l.lease", "epoch 0", seconds=1.0)
    assert not other.acquire()  # held and renewed
    time.sleep(0.8)
    assert not other.acquire()  # renewed past its first expiry
    dead._stop.set()  # the holder hangs (or dies): no more renewals
    dead._thread.join()  # type: ignore[union-attr]
    time.sleep(1.2)
    assert other.acquire()  # expired: taken over
    assert not dead.renew()  # its next renewal finds the lease taken
    with pytest.raises(StoreError, match="lost the lease on epoch 0: another dump took it over"):
        dead.check()
    other.release()


def test_unsupported_schemes_and_unreachable_or_missing_buckets_are_one_line_with_no_secret(
    s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out = run_cli("ls", "--store", "gs://bucket/x")
    assert code != 0
    assert out.strip().splitlines() == [
        "Error: store: unsupported store URL gs://...: use a local folder or s3://bucket/prefix"
    ]
    code, out = run_cli("ls", "--store", "s3://no-such-bucket-here/x")
    assert code == 1
    assert out.strip() == "Error: s3://no-such-bucket-here/x: bucket 'no-such-bucket-here' does not exist"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    code, out = run_cli("ls", "--store", "s3://bucket/x")
    assert code == 1
    assert len(out.strip().splitlines()) == 1
    assert "cannot reach the object store at http://127.0.0.1:9" in out
    assert SECRET not in out


def test_an_s3_prefix_without_a_store_is_a_usage_error_exit_2(s3: S3) -> None:
    url = f"s3://{s3.bucket()}/nothing/here"
    for command in (["ls"], ["verify", "--epoch", "0"], ["prune", "--keep", "1"], ["stats", "--epoch", "0"]):
        code, out = run_cli(*command, "--store", url)
        assert (code, out) == (2, f"Error: no store at {url} (nothing there, or not a pgprefetch store)\n"), command
        code, out = run_cli(*command, "--store", url, "--json")
        assert (code, json.loads(out)["exit_code"]) == (2, 2), command
    open_store(url).create()  # the same prefix once it holds an empty store: nothing to list, no error
    assert run_cli("ls", "--store", url, "--json") == (0, '{"epochs": [], "consumers": []}\n')


def test_wrong_credentials_are_one_line_exit_1_with_no_secret(s3: S3) -> None:
    import urllib.request

    bucket = s3.bucket()

    def require_auth(count: str) -> None:  # moto's switch: check signatures after `count` more requests
        request = urllib.request.Request(
            f"{s3.endpoint}/moto-api/reset-auth", data=count.encode(), headers={"Content-Type": "text/plain"}
        )
        urllib.request.urlopen(request).read()

    require_auth("0")  # from now on: our access key is unknown to the server, as a wrong one would be
    try:
        code, out = run_cli("ls", "--store", f"s3://{bucket}/x")
    finally:
        require_auth("inf")
    assert code == 1
    assert len(out.strip().splitlines()) == 1
    assert out.startswith(f"Error: s3://{bucket}/x: access denied")
    assert "check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN" in out
    assert SECRET not in out


def test_a_dump_that_loses_its_lease_stops_and_publishes_nothing(s_table: str, s3: S3, tmp_path: Path) -> None:
    bucket = s3.bucket()
    cfg = s_config(tmp_path, store=f"s3://{bucket}/lost", slow=True, compression="zstd")
    env = {**os.environ, "PGPREFETCH_LEASE_SECONDS": "3"}  # renewed every second
    proc = subprocess.Popen(dump_argv(cfg, s_table), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lease = "lost/.pgprefetch/locks/epoch-00000.lease"
    wait_for(lambda: len(s3.objects(bucket, "lost/epoch-00000/v/c")) >= 2)
    taken = json.dumps({"holder": "elsewhere 1", "expires": time.time() + 60}).encode()
    s3.client().put_object(Bucket=bucket, Key=lease, Body=taken)  # another dump took the lease over
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "lost the lease on" in err
    assert "another dump took it over" in err
    assert open_store(f"s3://{bucket}/lost").epochs() == []
    assert s3.objects(bucket, lease)[""] == taken  # the other dump's lease is left alone


def test_an_s3_dump_survives_terminated_database_connections_with_the_same_bytes(
    s_table: str, s3: S3, tmp_path: Path
) -> None:
    from .harness.faults import kill_every_connection

    bucket = s3.bucket()
    cfg = s_config(tmp_path, store=f"s3://{bucket}/pg", slow=True)
    journal = open_store(f"s3://{bucket}/pg").partial_path(0).with_name("epoch-00000.journal")
    proc = subprocess.Popen(
        [*dump_argv(cfg, s_table), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    wait_for(lambda: journal.exists() and len(journal.read_text().splitlines()) >= 5)
    kill_every_connection(s_table)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)["retries"] == 1
    local = dump(s_config(tmp_path, name="local.toml", slow=True), s_table)
    assert epoch_objects(s3, bucket, "pg") == chunk_bytes(local.path)
