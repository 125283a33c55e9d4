"""Damaged metadata is one line from every reader and from ``verify`` (#51.9), never a raw Python error.

Each test copies a real dumped epoch (the ``hostile_store`` fixture, tests/harness/hostile.py) and damages
it as a disk, a careless copy or someone who can write the store would: a byte of an array's ``zarr.json``,
its fields, a ``.`` chunk key separator in an epoch without metadata hashes, a manifest name with a newline,
a truncated shard, and a batch size rewritten consistently everywhere but in the chunks (the manifest, every
array's ``zarr.json`` and the hashes of them). The readers (EpochArrays, EpochDataset) raise one StoreError
naming the file and what is wrong; ``verify`` exits non-zero with one line, or lists the chunks.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pgprefetch import EpochArrays, EpochDataset
from pgprefetch.cli import cli
from pgprefetch.errors import StoreError
from pgprefetch.store.layout import plain_name

from .harness.hostile import SIZE, N, edit_array, edit_manifest, epoch, rehash, without_hashes
from .harness.s3 import S3

ARRAYS = ("v", "score", "score_null", "keys")  # every array a reader of the epoch opens


@pytest.fixture
def store(hostile_store: Path, tmp_path: Path) -> Path:
    """A copy of the dumped store to damage."""
    copy = tmp_path / "store.zarr"
    shutil.copytree(hostile_store, copy)
    return copy


def read_numpy(store: Path | str) -> None:
    ep = EpochArrays(store, 0, consumer=None)
    list(ep.batches(range(len(ep)), keys=True))


def read_torch(store: Path | str) -> None:
    ds = EpochDataset(store, 0, consumer=None)
    list(ds.batches(range(len(ds)), keys=True))


def refused(store: Path, *phrases: str) -> None:
    """Both readers raise one StoreError, of one line holding every phrase."""
    for read in (read_numpy, read_torch):
        with pytest.raises(StoreError) as caught:
            read(store)
        message = str(caught.value)
        assert "\n" not in message, message
        for phrase in phrases:
            assert phrase in message, (read.__name__, message)


def verify(store: Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["verify", "--store", str(store), "--epoch", "0"])
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.output


# --- a damaged byte, damaged fields ------------------------------------------------------------------------------
@pytest.mark.parametrize("hashes", [True, False], ids=["hashes", "older"])
def test_a_damaged_byte_in_an_array_zarr_json_is_one_line_naming_the_file(store: Path, hashes: bool) -> None:
    if not hashes:
        without_hashes(store)
    meta = epoch(store) / "v" / "zarr.json"
    data = bytearray(meta.read_bytes())
    data[100] = 0xFF
    meta.write_bytes(bytes(data))
    refused(store, f"{meta}: not a JSON document", "can't decode byte 0xff")
    code, output = verify(store)
    assert code == 1
    assert output.count("\n") == 1
    assert "epoch-00000/v" in output


@pytest.mark.parametrize(
    ("edit", "what"),
    [
        (lambda m: m.pop("shape"), "shape None is not a list of integers"),
        (lambda m: m.update(shape="96"), "shape '96' is not a list of integers"),
        (lambda m: m.update(shape=[6, -16]), "shape [6, -16] is not a list of integers >= 0"),
        (lambda m: m.update(data_type="no-such-type"), "data_type 'no-such-type' is not a dtype"),
        (lambda m: m.update(data_type={"name": "int64"}), "is not a dtype"),
        (lambda m: m.pop("chunk_grid"), "chunk_grid chunk_shape None is not a list"),
        (lambda m: m["chunk_grid"]["configuration"].update(chunk_shape=[6]), "does not match shape"),
        (lambda m: m.update(codecs={"name": "bytes"}), "is not a list of codecs"),
        (lambda m: m["codecs"][0].update(configuration=7), "the sharding codec has no configuration"),
        (lambda m: m.update(chunk_key_encoding="default"), "chunk_key_encoding 'default' is not one zarr defines"),
        (lambda m: m.update(chunk_key_encoding={"name": "default", "configuration": 1}), "separator None"),
        (lambda m: m.clear() or m.update(zarr_format=3), "shape None"),
    ],
    ids=["no-shape", "shape-text", "negative", "dtype", "dtype-object", "no-grid", "grid-rank", "codecs", "sharding",
         "encoding", "encoding-conf", "empty"],
)  # fmt: skip
def test_array_metadata_a_reader_cannot_use_is_one_line_naming_the_file_and_what_is_wrong(
    store: Path, edit: Callable[[dict[str, Any]], object], what: str
) -> None:
    without_hashes(store)  # the checks must hold without hashes; with them, the hash differs first
    edit_array(store, "v", edit)
    refused(store, str(epoch(store) / "v"), what)
    code, output = verify(store)
    assert code == 1
    assert output.count("\n") == 1
    assert what in output


def test_a_json_array_that_is_not_an_object_is_refused(store: Path) -> None:
    without_hashes(store)
    (epoch(store) / "v" / "zarr.json").write_text("[1, 2]")
    refused(store, "epoch-00000/v/zarr.json: is not a JSON object")


@pytest.mark.parametrize(
    "edit",
    [
        lambda m: m.update(batch_size="sixteen"),
        lambda m: m.update(n_samples=None),
        lambda m: m.update(fields=[]),
        lambda m: m["fields"].update(v=["int64"]),
        lambda m: m["fields"]["score"].update(null="nan"),
        lambda m: m["fields"]["v"].update(shape=7),
    ],
    ids=["batch-size-text", "no-samples", "fields-list", "field-entry", "null-entry", "field-shape"],
)
def test_a_manifest_a_reader_cannot_use_is_one_line(store: Path, edit: Callable[[dict[str, Any]], object]) -> None:
    edit_manifest(store, edit)
    refused(store, "epoch-00000: the manifest")


# --- a `.` separator, a name with a newline ---------------------------------------------------------------------
def test_a_dot_separator_in_an_older_epoch_names_the_missing_shard_file(store: Path) -> None:
    without_hashes(store)  # no hash to refuse the changed zarr.json: the files it names are not there
    edit_array(
        store, "v", lambda m: m.update(chunk_key_encoding={"name": "default", "configuration": {"separator": "."}})
    )
    refused(store, f"{epoch(store) / 'v' / 'c.0.0'}: the shard file is missing")
    code, output = verify(store)
    assert code == 1
    assert "v batch 0: missing (epoch-00000/v/c.0.0)" in output


@pytest.mark.parametrize("name", ["v\n", "v\nx", "\nv"], ids=["trailing", "inner", "leading"])
def test_a_manifest_name_with_a_newline_is_not_a_plain_name(store: Path, name: str) -> None:
    """``re.match`` with ``$`` passed ``"v\\n"``: the array folder of that name would be read, the line split."""
    (epoch(store) / "v").rename(epoch(store) / name)

    def rename(m: dict[str, Any]) -> None:
        m["fields"] = {name if k == "v" else k: e for k, e in m["fields"].items()}
        m["metadata_sha256"][name] = m["metadata_sha256"].pop("v")
        m["checksums"]["arrays"] = [name if a == "v" else a for a in m["checksums"]["arrays"]]

    edit_manifest(store, rename)
    refused(store, f"the manifest names an array {name!r}, not a plain name")
    code, output = verify(store)
    assert code == 1
    assert output.count("\n") == 1
    assert "not a plain name" in output
    with pytest.raises(StoreError):
        plain_name(name, "here")


# --- shards that do not hold what the metadata says -------------------------------------------------------------
def test_a_truncated_or_emptied_shard_is_one_line(store: Path) -> None:
    shard = epoch(store) / "v" / "c" / "0" / "0"
    shard.write_bytes(b"")
    refused(store, f"{shard}: 0 bytes, shorter than its shard index")
    code, output = verify(store)
    assert code == 1
    assert "v batch 0: missing" in output


def forge_batch_size(store: Path, size: int, *, hashes: bool) -> None:
    """Rewrite the batch size everywhere but in the chunks: the manifest, every array's zarr.json, their hashes."""
    edit_manifest(store, lambda m: m.update(batch_size=size, n_samples=min(N, 6 * size)))

    def resize(meta: dict[str, Any]) -> None:
        meta["shape"][1] = size
        meta["chunk_grid"]["configuration"]["chunk_shape"][1] = size
        meta["codecs"][0]["configuration"]["chunk_shape"][1] = size

    for name in ARRAYS:
        edit_array(store, name, resize)
    if hashes:
        rehash(store)
    else:
        without_hashes(store)


@pytest.mark.parametrize("size", [2 * SIZE, SIZE // 2], ids=["double", "half"])
@pytest.mark.parametrize("hashes", [True, False], ids=["hashes", "older"])
def test_a_consistent_forgery_of_the_batch_size_is_caught_by_the_readers_and_verify(
    store: Path, size: int, hashes: bool
) -> None:
    """The manifest, every array's zarr.json and their hashes agree on another batch size; the chunks do not.

    Doubled, a reader raised a raw ValueError; halved, it handed out half of each stored batch. ``verify``
    said every chunk matches its checksum, as the chunks are what the dump wrote.
    """
    forge_batch_size(store, size, hashes=hashes)
    shard = epoch(store) / "v" / "c" / "0" / "0"
    wrong = f"a chunk of {SIZE * 8} bytes where its zarr.json's batches of {size} samples take {size * 8}"
    refused(store, f"{shard}: {wrong}")
    code, output = verify(store)
    assert code == 1, output
    assert f"v batch 0: {wrong}" in output
    assert "every chunk matches" not in output


@pytest.mark.parametrize("size", [2 * SIZE, SIZE // 2], ids=["double", "half"])
def test_a_consistent_forgery_of_the_batch_size_in_an_s3_store_is_caught_by_the_readers_and_verify(
    store: Path, s3: S3, size: int
) -> None:
    """An object store's reader fetches ranges the metadata computes: the shard files' sizes tell the forgery."""
    forge_batch_size(store, size, hashes=True)
    bucket = s3.bucket()
    client = s3.client()
    for path in (p for p in store.rglob("*") if p.is_file() and ".pgprefetch" not in p.parts):
        client.put_object(Bucket=bucket, Key=f"forged/{path.relative_to(store)}", Body=path.read_bytes())
    location = f"s3://{bucket}/forged"
    want = f"{location}/epoch-00000/v/c/0/0: {6 * SIZE * 8 + 6 * 16 + 4} bytes where 6 batches of {size} samples take"
    for read in (read_numpy, read_torch):
        with pytest.raises(StoreError, match=re.escape(want)):
            read(location)
    result = CliRunner().invoke(cli, ["verify", "--store", location, "--epoch", "0"])
    assert result.exit_code == 1, result.output
    assert f"v batch 0: a chunk of {SIZE * 8} bytes where its zarr.json's batches of {size} samples" in result.output
