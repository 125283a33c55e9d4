"""Stores on S3, against a real S3 API (moto's server on 127.0.0.1, over HTTP): same bytes, same behaviour."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import obstore
import pytest
import torch
import zarr
from click.testing import CliRunner

from pgprefetch import EpochDataset
from pgprefetch.cli import cli
from pgprefetch.errors import EpochNotReadyError, StoreError
from pgprefetch.store.lease import Lease
from pgprefetch.store.open import open_store
from pgprefetch.store.s3 import S3Store

from .harness.configs import s_config
from .harness.dumps import chunk_bytes, dump, dump_argv, wait_for
from .harness.s3 import S3, SECRET, throttling_proxy


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def epoch_objects(s3: S3, bucket: str, prefix: str, epoch: int = 0) -> dict[str, bytes]:
    """The objects of an epoch, as ``chunk_bytes`` names a local epoch's files (its group zarr.json left out)."""
    objects = s3.objects(bucket, f"{prefix}/epoch-{epoch:05d}/")
    return {key: body for key, body in objects.items() if "/" in key}


def test_a_dump_to_s3_holds_the_local_dump_s_bytes_and_plain_zarr_opens_it(
    s_table: str, s3: S3, tmp_path: Path
) -> None:
    bucket = s3.bucket()
    local = dump(s_config(tmp_path, name="local.toml"), s_table)
    remote = dump(s_config(tmp_path, name="s3.toml", store=f"s3://{bucket}/runs/a"), s_table)
    assert remote.path == f"s3://{bucket}/runs/a/epoch-00000"
    assert epoch_objects(s3, bucket, "runs/a") == chunk_bytes(local.path)
    manifest = json.loads(s3.objects(bucket, "runs/a/epoch-00000/zarr.json")[""])["attributes"]["pgprefetch"]
    assert manifest["n_batches"] == local.n_batches
    client = obstore.store.S3Store(bucket, prefix="runs/a", client_options={"allow_http": True})
    group = zarr.open_group(zarr.storage.ObjectStore(client, read_only=True), mode="r")
    local_group = zarr.open_group(local.path, mode="r")
    assert (group["epoch-00000"]["v"][:] == local_group["v"][:]).all()
    assert not (tmp_path / "staging" / bucket).exists() or not any((tmp_path / "staging").rglob("*.journal"))


def test_the_reader_over_s3_equals_local_per_rank_fetching_its_share_and_under_workers(
    s_table: str, s3: S3, tmp_path: Path
) -> None:
    bucket = s3.bucket()
    local = dump(s_config(tmp_path, name="local.toml", size=8), s_table)
    dump(s_config(tmp_path, name="s3.toml", size=8, store=f"s3://{bucket}/r"), s_table)
    epoch_bytes = sum(len(b) for k, b in epoch_objects(s3, bucket, "r").items() if "/c/" in k)
    for rank in range(2):
        mine = EpochDataset(f"s3://{bucket}/r", 0, rank=rank, world_size=2, consumer=None)
        theirs = EpochDataset(local.path.parent, 0, rank=rank, world_size=2, consumer=None)
        assert len(mine) == len(theirs) > 0
        for a, b in zip(mine, theirs, strict=True):
            assert a.keys() == b.keys()
            assert all(torch.equal(a[k], b[k]) for k in a)
        assert mine.bytes_fetched <= 1.25 * epoch_bytes / 2  # its share, no whole-shard downloads
        assert mine.state_dict() == theirs.state_dict()
    workers = torch.utils.data.DataLoader(
        EpochDataset(f"s3://{bucket}/r", 0, consumer=None),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="spawn",  # obstore cannot run in a forked process (objectstore.S3Store.client)
    )
    whole = EpochDataset(local.path.parent, 0, consumer=None)
    got = list(workers)
    assert len(got) == len(whole)
    assert all(torch.equal(g["v"], whole[i]["v"]) for i, g in enumerate(got))


def test_a_missing_object_is_a_clear_error_naming_it(s_table: str, s3: S3, tmp_path: Path) -> None:
    bucket = s3.bucket()
    dump(s_config(tmp_path, store=f"s3://{bucket}/m"), s_table)
    s3.client().delete_object(Bucket=bucket, Key="m/epoch-00000/v/c/0/0")
    ds = EpochDataset(f"s3://{bucket}/m", 0, consumer=None)
    with pytest.raises(StoreError, match=r"epoch-00000/v/c/0/0: the object is missing"):
        ds[0]


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
    assert first.wait(timeout=120) == 0
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
    assert run_cli("ls", "--store", url, "--json") == (0, '{"epochs": []}\n')


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


def test_throttling_and_5xx_are_retried_by_the_dump_and_the_reader(
    s_table: str, s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = s3.bucket()
    local = dump(s_config(tmp_path, name="local.toml"), s_table)
    with throttling_proxy(s3.endpoint, every=3) as (endpoint, refused):
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("PGPREFETCH_S3_RETRIES", "3")
        remote = dump(s_config(tmp_path, name="s3.toml", store=f"s3://{bucket}/t"), s_table)
        batches = list(EpochDataset(f"s3://{bucket}/t", 0, consumer=None))
    assert refused[0] >= 5  # one request in three was refused with 503 SlowDown, and retried
    assert remote.n_batches == local.n_batches
    assert epoch_objects(s3, bucket, "t") == chunk_bytes(local.path)
    whole = EpochDataset(local.path.parent, 0, consumer=None)
    assert all(torch.equal(b["v"], whole[i]["v"]) for i, b in enumerate(batches))


def test_padded_fields_reach_s3_through_refused_requests_with_their_lengths_and_longest(
    s_table: str, s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Arrays and text of any length (the row-wise statement), and each batch's longest sample (_longest)
    bucket = s3.bucket()
    padded = {
        "query": "SELECT array(SELECT generate_series(1, id % 7)) AS a, repeat('é', id % 5) AS t FROM s WHERE id = $1",
        "fields": {
            "a": (["a"], "int32", {"max_length": 4, "truncate": "left"}),
            "t": (["t"], "uint8", {"max_length": 5, "truncate": "right"}),
        },
    }
    local = dump(s_config(tmp_path, name="local.toml", **padded), s_table)
    with throttling_proxy(s3.endpoint, every=3) as (endpoint, refused):
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        monkeypatch.setenv("PGPREFETCH_S3_RETRIES", "6")  # five arrays a batch in flight: a GET may meet 3 refusals
        dump(s_config(tmp_path, name="s3.toml", store=f"s3://{bucket}/p", **padded), s_table)
        remote = EpochDataset(f"s3://{bucket}/p", 0, consumer=None)
        longest = remote.longest
        batches = list(remote)
    assert refused[0] >= 5
    assert epoch_objects(s3, bucket, "p") == chunk_bytes(local.path)  # _longest among them
    whole = EpochDataset(local.path.parent, 0, consumer=None)
    assert longest.keys() == whole.longest.keys() == {"a_length", "t_length"}
    for name, values in whole.longest.items():
        assert longest[name].tolist() == values.tolist()
        assert values.tolist() == [int(whole[i][name].max()) for i in range(len(whole))]
    assert all(torch.equal(b["t"], whole[i]["t"]) and torch.equal(b["a"], whole[i]["a"]) for i, b in enumerate(batches))


def test_force_rewrites_a_published_s3_epoch_in_full(s_table: str, s3: S3, tmp_path: Path) -> None:
    bucket = s3.bucket()
    cfg = s_config(tmp_path, store=f"s3://{bucket}/f")
    first = dump(cfg, s_table)
    before = open_store(f"s3://{bucket}/f").manifest(0)["snapshot"]
    rewritten = dump(cfg, s_table, force=True)
    assert rewritten.status == "written"
    assert first.path == rewritten.path
    assert open_store(f"s3://{bucket}/f").manifest(0)["snapshot"] != before  # a new epoch, on a new snapshot
    local = dump(s_config(tmp_path, name="local.toml"), s_table)
    assert epoch_objects(s3, bucket, "f") == chunk_bytes(local.path)


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


def test_objects_of_an_abandoned_attempt_do_not_end_up_in_the_published_epoch(
    s_table: str, s3: S3, tmp_path: Path
) -> None:
    bucket = s3.bucket()
    open_store(f"s3://{bucket}/st").create()
    s3.client().put_object(Bucket=bucket, Key="st/epoch-00000/old/c/0/0", Body=b"left by a dump of another config")
    dump(s_config(tmp_path, store=f"s3://{bucket}/st"), s_table)
    assert not any(key.startswith("old/") for key in s3.objects(bucket, "st/epoch-00000/"))


def test_a_store_url_is_normalised_the_same_way_everywhere() -> None:
    store = open_store("S3://bkt/runs//a/")
    assert isinstance(store, S3Store)
    assert (store.location, store.bucket, store.prefix) == ("s3://bkt/runs/a", "bkt", "runs/a")
    assert store.staging.name.startswith("runs__a-")  # the dump's staging, whichever spelling named the store
    with pytest.raises(StoreError, match="unsupported store URL gs://"):
        open_store("gs://bkt/x")


def test_wait_opens_an_s3_epoch_once_a_dump_publishes_it(s_table: str, s3: S3, tmp_path: Path) -> None:
    import threading

    bucket = s3.bucket()
    url = f"s3://{bucket}/w"
    cfg = s_config(tmp_path, store=url)
    open_store(url).create()
    later = threading.Timer(1.0, lambda: dump(cfg, s_table))
    later.start()
    try:
        ds = EpochDataset(url, 0, wait=True, timeout=60, consumer="train")
    finally:
        later.join()
    assert len(ds) == open_store(url).manifest(0)["n_batches"]
    assert open_store(url).consumers() == {"train": 0}
    with pytest.raises(EpochNotReadyError, match="gave up waiting"):
        EpochDataset(url, 1, wait=True, timeout=0.5, consumer=None)


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


def test_the_stream_over_s3_equals_the_local_stream_across_epochs(s_table: str, s3: S3, tmp_path: Path) -> None:
    from pgprefetch import EpochStream

    bucket = s3.bucket()
    for epoch in (0, 1):
        dump(s_config(tmp_path, name="local.toml", size=8), s_table, epoch=epoch)
        dump(s_config(tmp_path, name="s3.toml", size=8, store=f"s3://{bucket}/st"), s_table, epoch=epoch)
    for kwargs in ({}, {"batch_size": 12, "keys": True}):
        remote = EpochStream(f"s3://{bucket}/st", 0, 2, consumer=None, **kwargs)
        local = EpochStream(tmp_path / "store.zarr", 0, 2, consumer=None, **kwargs)
        pairs = list(zip(remote, local, strict=True))
        assert len(pairs) == 2 * -(-480 // kwargs.get("batch_size", 8))
        for a, b in pairs:
            assert a.keys() == b.keys()
            assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_numpy_reader_and_grains_source_over_s3_equal_the_local_store(s_table: str, s3: S3, tmp_path: Path) -> None:
    import numpy as np

    from pgprefetch import ArrayStream, EpochArrays
    from pgprefetch.grain import EpochSource

    bucket = s3.bucket()
    for epoch in (0, 1):
        dump(s_config(tmp_path, name="local.toml", size=8), s_table, epoch=epoch)
        dump(s_config(tmp_path, name="s3.toml", size=8, store=f"s3://{bucket}/np"), s_table, epoch=epoch)
    url, local = f"s3://{bucket}/np", tmp_path / "store.zarr"
    for rank in range(2):
        remote = EpochArrays(url, 0, rank=rank, world_size=2, batch_size=12, consumer=None)
        here = EpochArrays(local, 0, rank=rank, world_size=2, batch_size=12, consumer=None)
        pairs = list(zip(remote, here, strict=True))
        assert len(pairs) == len(here) > 0
        for a, b in pairs:
            assert all(np.array_equal(a[k], b[k]) and not a[k].flags.writeable for k in b)
        assert remote.state_dict() == here.state_dict()
    streamed = [b["v"].tolist() for b in ArrayStream(url, 0, 2, keys=True, consumer=None)]
    assert streamed == [b["v"].tolist() for b in ArrayStream(local, 0, 2, consumer=None)]
    source = EpochSource(url, 1, consumer=None, prefetch=3)
    got = source._getitems(list(range(len(source))))  # Grain's batched read: 3 ranged GETs in flight
    assert [g["v"].tolist() for g in got] == [b["v"].tolist() for b in EpochArrays(local, 1, consumer=None)]
