"""A hostile store (#36.4, #36.11): what readers and ``verify`` refuse in a store someone else can write.

Each test copies a real dumped epoch (the ``hostile_store`` fixture, tests/harness/hostile.py), tampers with it
as someone who can write the store would (an array named outside it, links, array metadata that disagrees
with the manifest, locally and on S3, and as the Ray executor publishes it), and runs the real readers
(EpochArrays, EpochDataset) and ``pgprefetch verify`` against it. Links planted in ``.pgprefetch`` for a
dump or prune to follow are tests/test_security_store_links.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from pgprefetch import EpochArrays, EpochDataset
from pgprefetch.cli import cli
from pgprefetch.errors import EpochNotFoundError, StoreError
from pgprefetch.store.local import LocalStore
from pgprefetch.store.open import open_store

from .harness.configs import s_config
from .harness.dumps import dump
from .harness.hostile import SIZE, N
from .harness.raycluster import single_process
from .harness.s3 import S3


@pytest.fixture
def hostile(hostile_store: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the store to tamper with, and beside it an ``outside`` array holding other bytes."""
    store = tmp_path / "store.zarr"
    shutil.copytree(hostile_store, store)
    outside = tmp_path / "outside" / "arr"
    shutil.copytree(store / "epoch-00000" / "v", outside)
    for shard in (p for p in outside.rglob("*") if p.is_file() and p.name != "zarr.json"):
        data = bytearray(shard.read_bytes())
        data[: N * 8] = np.full(N, 0x5EC12E7, dtype="<i8").tobytes()  # "secret" values a reader must never see
        shard.write_bytes(bytes(data))
    return store, outside


def edit_manifest(store: Path, edit: object) -> None:
    path = store / "epoch-00000" / "zarr.json"
    doc = json.loads(path.read_text())
    edit(doc["attributes"]["pgprefetch"])  # type: ignore[operator]
    path.write_text(json.dumps(doc))


def rename_field(manifest: dict, new: str) -> None:
    manifest["fields"] = {new if k == "v" else k: e for k, e in manifest["fields"].items()}


def verify(store: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pgprefetch", "verify", "--store", str(store), "--epoch", "0"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def readers_refuse(store: Path) -> None:
    """Both readers raise StoreError on ``store`` (before reading a byte of a batch)."""
    with pytest.raises(StoreError):
        list(EpochArrays(store, 0, consumer=None))
    with pytest.raises(StoreError):
        list(EpochDataset(store, 0, consumer=None))


# --- #36.4: reading outside the store ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["relative", "absolute"])
def test_a_manifest_naming_an_array_outside_the_store_is_refused_by_readers_and_verify(
    hostile: tuple[Path, Path], kind: str
) -> None:
    store, outside = hostile
    name = "../../outside/arr" if kind == "relative" else str(outside)
    edit_manifest(store, lambda m: rename_field(m, name))
    readers_refuse(store)
    result = verify(store)
    assert result.returncode != 0, result.stdout
    assert "not a plain name" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_null_mask_name_leading_out_of_the_store_is_refused(hostile: tuple[Path, Path]) -> None:
    store, _ = hostile

    def edit(m: dict) -> None:
        m["fields"]["score"]["null"]["mask"] = "../../outside/arr"

    edit_manifest(store, edit)
    readers_refuse(store)
    assert verify(store).returncode != 0


def test_verify_flags_an_array_the_checksums_do_not_cover(hostile: tuple[Path, Path]) -> None:
    """A plain name of an array the dump did not checksum (copied in by someone) is not "clean"."""
    store, outside = hostile
    shutil.copytree(outside, store / "epoch-00000" / "planted")
    edit_manifest(store, lambda m: rename_field(m, "planted"))
    result = verify(store)
    assert result.returncode == 1
    assert "planted: the manifest names it but no checksum covers it" in result.stdout


def test_a_chunk_key_separator_leading_out_of_the_array_is_refused(hostile: tuple[Path, Path]) -> None:
    store, _ = hostile
    meta_path = store / "epoch-00000" / "v" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["chunk_key_encoding"] = {"name": "v2", "configuration": {"separator": "/../../../outside/"}}
    meta_path.write_text(json.dumps(meta))
    (store / "epoch-00000" / "v" / "0").mkdir()
    readers_refuse(store)
    result = verify(store)
    assert result.returncode != 0
    assert "separator" in result.stderr


def test_an_array_folder_linked_out_of_the_epoch_or_a_linked_shard_is_refused(hostile: tuple[Path, Path]) -> None:
    store, outside = hostile
    array = store / "epoch-00000" / "v"
    shard = next(p for p in array.rglob("*") if p.is_file() and p.name != "zarr.json")
    shard.unlink()
    shard.symlink_to(outside / shard.relative_to(array))  # a same-layout shard: its index checksum is good
    with pytest.raises(StoreError, match="symbolic link"):
        list(EpochArrays(store, 0, consumer=None))
    shutil.rmtree(array)
    array.symlink_to(outside)
    with pytest.raises(StoreError, match="leads out of the epoch"):
        EpochArrays(store, 0, consumer=None)


# --- #37.13 -------------------------------------------------------------------------------------------------
def test_a_reader_and_the_cli_say_the_same_when_there_is_no_store(tmp_path: Path) -> None:
    missing = tmp_path / "nope.zarr"
    with pytest.raises(EpochNotFoundError) as caught:
        EpochArrays(missing, 0, consumer=None)
    result = CliRunner().invoke(cli, ["ls", "--store", str(missing)])
    assert result.exit_code == 2
    assert str(caught.value) == f"no store at {missing} (nothing there)"
    assert result.output.strip() == f"Error: {caught.value}"


# --- #36.11: array metadata against the manifest -------------------------------------------------------------
@pytest.fixture
def older(hostile: tuple[Path, Path]) -> Path:
    """The copy as an older pgprefetch published it: no SHA-256 of the arrays' zarr.json in the manifest."""
    store, _ = hostile
    edit_manifest(store, lambda m: m.pop("metadata_sha256"))
    return store


def edit_array(store: Path, name: str, edit: object) -> None:
    path = store / "epoch-00000" / name / "zarr.json"
    meta = json.loads(path.read_text())
    edit(meta)  # type: ignore[operator]
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "tamper",
    [
        lambda s: edit_array(s, "score", lambda m: m.update(data_type="float64")),  # silently wrong values before
        lambda s: edit_array(s, "v", lambda m: m.update(shape=[m["shape"][0], 10**9])),
        lambda s: edit_array(s, "score_null", lambda m: m.update(data_type="|O")),
        lambda s: edit_manifest(s, lambda m: m.update(batch_size=10**12)),
        lambda s: edit_manifest(s, lambda m: m.update(batch_size=0)),
        lambda s: edit_manifest(s, lambda m: m.update(n_samples=-5)),
        lambda s: edit_manifest(s, lambda m: m["fields"]["v"].update(shape=[10**6])),
    ],
    ids=["dtype", "sample-dim", "object", "batch-size-huge", "batch-size-zero", "negative-samples", "field-shape"],
)
def test_array_metadata_that_disagrees_with_the_manifest_is_refused(older: Path, tamper: object) -> None:
    store = older  # no metadata hashes: the checks against the manifest alone must hold
    tamper(store)  # type: ignore[operator]
    readers_refuse(store)
    result = verify(store)
    assert result.returncode != 0, result.stdout
    assert result.stderr.startswith("Error: ")
    assert "Traceback" not in result.stderr


def test_verify_refuses_a_checksums_table_larger_than_the_manifest_says(older: Path) -> None:
    store = older
    edit_array(store, "_checksums", lambda m: m.update(shape=[m["shape"][0], 10**10]))
    result = verify(store)
    assert result.returncode == 1
    assert "the checksums are" in result.stderr


def test_the_manifest_records_each_array_metadata_file_and_a_changed_one_is_refused_by_name(
    hostile: tuple[Path, Path],
) -> None:
    store, _ = hostile
    epoch = store / "epoch-00000"
    recorded = json.loads((epoch / "zarr.json").read_text())["attributes"]["pgprefetch"]["metadata_sha256"]
    arrays = sorted(p.parent.name for p in epoch.glob("*/zarr.json"))
    assert sorted(recorded) == arrays  # every array of the epoch, _checksums included
    assert all(recorded[a] == hashlib.sha256((epoch / a / "zarr.json").read_bytes()).hexdigest() for a in arrays)
    # A change the checks against the manifest cannot see (same dtype and shape): the fill value.
    edit_array(store, "score", lambda m: m.update(fill_value=7.0))
    for reader in (EpochArrays, EpochDataset):
        with pytest.raises(StoreError, match=r"epoch-00000/score: the array's zarr.json is not the one"):
            list(reader(store, 0, consumer=None))
    result = verify(store)
    assert result.returncode == 1
    assert result.stderr.startswith("Error: ")
    assert "epoch-00000/score: the array's zarr.json" in result.stderr
    assert "Traceback" not in result.stderr


def test_verify_refuses_a_changed_checksums_metadata_file_before_reading_it(hostile: tuple[Path, Path]) -> None:
    store, _ = hostile
    edit_array(store, "_checksums", lambda m: m.update(shape=[m["shape"][0], 10**10]))
    result = verify(store)
    assert result.returncode == 1
    assert "epoch-00000/_checksums: the array's zarr.json is not the one the manifest records" in result.stderr


def test_an_epoch_of_an_older_pgprefetch_without_metadata_hashes_still_opens_and_verifies(older: Path) -> None:
    assert len(list(EpochArrays(older, 0, consumer=None))) == N // SIZE
    result = verify(older)
    assert result.returncode == 0, result.stderr


def test_a_changed_array_metadata_object_in_an_s3_store_is_refused(s_table: str, s3: S3, tmp_path: Path) -> None:
    location = f"s3://{s3.bucket()}/meta"
    assert dump(s_config(tmp_path, store=location), s_table).status == "written"
    bucket, key = location[5:].split("/")[0], "meta/epoch-00000/keys/zarr.json"
    meta = json.loads(s3.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    meta["attributes"] = {"changed": True}
    s3.client().put_object(Bucket=bucket, Key=key, Body=json.dumps(meta).encode())
    with pytest.raises(StoreError, match=r"epoch-00000/keys: the array's zarr.json is not the one"):
        EpochArrays(location, 0, consumer=None)
    result = CliRunner().invoke(cli, ["verify", "--store", location, "--epoch", "0"])
    assert result.exit_code == 1
    assert "epoch-00000/keys: the array's zarr.json is not the one" in result.output


def test_an_epoch_published_by_the_ray_executor_records_the_same_metadata_hashes_and_opens(
    ray_cluster: object, s_table: str, s3: S3, tmp_path: Path
) -> None:
    import pgprefetch

    single = single_process(tmp_path, s_table)
    location = f"s3://{s3.bucket()}/ray"
    env = {k: v for k, v in os.environ.items() if k.startswith(("AWS_", "PGPREFETCH_"))}  # the workers' moto
    apart = {**env, "PGPREFETCH_STAGING": str(tmp_path / "parts-staging")}  # parts upload from their own nodes
    (result,) = pgprefetch.dump(
        s_config(tmp_path, store=location), epochs=0, dsn=s_table, executor="ray", parts=2, ray_env=apart
    )
    assert (result.status, result.executor) == ("written", "ray")
    ours = open_store(location).manifest(0)["metadata_sha256"]
    assert ours == LocalStore(Path(single.path).parent).manifest(0)["metadata_sha256"]
    assert len(list(EpochArrays(location, 0, consumer=None))) > 0
    assert pgprefetch.verify(location, 0) == []
