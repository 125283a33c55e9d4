"""Stores on S3, against a real S3 API (moto's server on 127.0.0.1, over HTTP): same bytes, same behaviour.

A dump to S3 holds the local dump's bytes (through refused requests too, and rewritten under ``--force``),
and every reader over it (per rank, under workers, the stream, numpy, Grain, waiting for an epoch) gives
the local store's batches. The commands, the one writer a lease allows, faults and the one-line errors
on S3 are tests/test_s3_operations.py's.
"""

from __future__ import annotations

import json
from pathlib import Path

import obstore
import pytest
import torch
import zarr

from pgprefetch import EpochDataset
from pgprefetch.errors import EpochNotReadyError, StoreError
from pgprefetch.store.open import open_store
from pgprefetch.store.s3 import S3Store

from .harness.configs import s_config
from .harness.dumps import chunk_bytes, dump
from .harness.s3 import S3, epoch_objects, throttling_proxy


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
