"""Readers follow no link below a store (#51.3, review N4): every path they open stays inside its epoch.

Each test copies a real dumped epoch (the ``hostile_store`` fixture, tests/harness/hostile.py), puts a
same-layout copy of one of its folders (or files) outside the store with other bytes in its shards ("secret"
values a reader must never hand out), and replaces the store's folder by a link to the copy: the epoch
folder itself, an array's folder, its ``c``, ``c/0``, a shard's folder of a 3-D array, a shard file, an
array's ``zarr.json``. Every reader (EpochArrays, EpochDataset, ArrayStream, EpochStream, ``verify``) must
refuse it in one line naming the link, before handing out a batch. What ``.pgprefetch`` links do to writes
is tests/test_security_store_links.py's.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from pgprefetch import ArrayStream, EpochArrays, EpochDataset, EpochStream
from pgprefetch.cli import cli
from pgprefetch.errors import StoreError

from .harness.configs import write_config
from .harness.dumps import dump
from .harness.hostile import SIZE, N

SECRET = 0x5EC12E7  # what the shards outside the store hold: a reader that hands it out read outside

# Below epoch-00000: folders (and two files) a reader opens on its way to a batch.
LINKED = [
    "",  # the epoch folder itself
    "v",  # an array's folder
    "v/c",
    "v/c/0",
    "keys/c/0/0",  # a shard's own folder (keys are 3-D: c/0/0/0)
    "score_null/c",
    "v/c/0/0",  # the shard file
    "v/zarr.json",  # an array's metadata
]


# Each reader reads every batch with its keys: the keys array is opened only when they are asked for.
def _read_numpy(store: Path) -> list[Any]:
    ep = EpochArrays(store, 0, consumer=None)
    return list(ep.batches(range(len(ep)), keys=True))


def _read_torch(store: Path) -> list[Any]:
    ds = EpochDataset(store, 0, consumer=None)
    return list(ds.batches(range(len(ds)), keys=True))


def _stream_numpy(store: Path) -> list[Any]:
    return list(ArrayStream(store, 0, 1, keys=True, consumer=None))


def _stream_torch(store: Path) -> list[Any]:
    return list(EpochStream(store, 0, 1, keys=True, consumer=None))


def _verify(store: Path) -> list[Any]:
    result = CliRunner().invoke(cli, ["verify", "--store", str(store), "--epoch", "0"])
    assert result.exit_code == 1, result.output
    raise StoreError(result.output.removeprefix("Error: ").rstrip("\n"))  # the line the user reads


READERS: dict[str, Callable[[Path], list[Any]]] = {
    "EpochArrays": _read_numpy,
    "EpochDataset": _read_torch,
    "ArrayStream": _stream_numpy,
    "EpochStream": _stream_torch,
    "verify": _verify,
}


def _plant_secret(shard: Path) -> None:
    """Overwrite half the data of a shard file; its index, and the index's checksum, stay as they are."""
    data = bytearray(shard.read_bytes())
    n = (len(data) - 4) // 16
    data[: n * 8] = np.full(n, SECRET, dtype="<i8").tobytes()
    shard.write_bytes(bytes(data))


def link_out(store: Path, rel: str, outside: Path, *, secret: bool = True) -> Path:
    """Replace ``epoch-00000/rel`` by a link to a same-layout copy in ``outside``; the link.

    ``secret``: the copy's shards hold other bytes (a compressed copy keeps its bytes: it must decode). A
    ``zarr.json`` is copied as it is, so its hash still matches the manifest's.
    """
    here = store / "epoch-00000" / rel if rel else store / "epoch-00000"
    outside.mkdir(parents=True, exist_ok=True)
    copy = outside / (rel.replace("/", "_") or "epoch")
    if here.is_dir():
        shutil.copytree(here, copy)
        shards = [p for p in copy.rglob("*") if p.is_file() and p.name != "zarr.json"]
        shutil.rmtree(here)
    else:
        shutil.copy(here, copy)
        shards = [copy] if copy.name != "zarr.json" else []
        here.unlink()
    for shard in shards if secret else []:
        _plant_secret(shard)
    here.symlink_to(copy, target_is_directory=copy.is_dir())
    return here


@pytest.fixture
def store(hostile_store: Path, tmp_path: Path) -> Path:
    """A copy of the dumped store to plant links in."""
    copy = tmp_path / "store.zarr"
    shutil.copytree(hostile_store, copy)
    return copy


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("rel", LINKED, ids=[r or "epoch" for r in LINKED])
def test_every_reader_refuses_a_link_below_the_store_naming_it(
    store: Path, tmp_path: Path, rel: str, reader: str
) -> None:
    link = link_out(store, rel, tmp_path / "outside")
    with pytest.raises(StoreError) as caught:
        READERS[reader](store)
    message = str(caught.value)
    assert f"{link} is a symbolic link" in message
    assert "\n" not in message
    assert "Traceback" not in message


def test_the_same_store_without_a_link_reads_and_verifies(store: Path) -> None:
    """The control: the copy the links are planted in reads whole, and verify passes it."""
    for name, read in READERS.items():
        if name != "verify":
            assert len(read(store)) == N // SIZE, name
    result = CliRunner().invoke(cli, ["verify", "--store", str(store), "--epoch", "0"])
    assert result.exit_code == 0, result.output


def test_stats_and_ls_read_only_manifests_and_refuse_a_linked_epoch_folder(store: Path, tmp_path: Path) -> None:
    ok = CliRunner().invoke(cli, ["stats", "--store", str(store), "--epoch", "0"])
    assert ok.exit_code == 0, ok.output
    link = link_out(store, "", tmp_path / "outside")
    for command in (["stats", "--epoch", "0"], ["ls"]):
        result = CliRunner().invoke(cli, [*command, "--store", str(store)])
        assert result.exit_code == 1, command
        assert result.output.startswith(f"Error: {link} is a symbolic link"), command


def test_verify_reads_the_checksums_with_no_link_followed(store: Path, tmp_path: Path) -> None:
    """``_checksums`` is read through zarr: zarr's reads of a local store keep the readers' promise."""
    link = link_out(store, "_checksums/c", tmp_path / "outside")
    result = CliRunner().invoke(cli, ["verify", "--store", str(store), "--epoch", "0"])
    assert result.exit_code == 1
    assert f"{link} is a symbolic link" in result.output


def test_a_compressed_array_read_through_zarr_refuses_a_linked_folder(hostile_db: str, tmp_path: Path) -> None:
    fields = {"v": (["v"], "int64"), "score": (["score"], "float32", {"null": "nan"})}
    config = write_config(
        tmp_path, keys="SELECT id FROM r", query="SELECT v, score FROM r WHERE id = $1", fields=fields, size=SIZE,
        compression="zstd",
    )  # fmt: skip
    dump(config, hostile_db, epoch=0)
    store = tmp_path / "store.zarr"
    assert len(_read_numpy(store)) == N // SIZE
    meta = json.loads((store / "epoch-00000" / "v" / "zarr.json").read_text())
    assert meta["codecs"][-1]["name"] == "zstd"  # read by zarr, not mapped
    link = link_out(store, "v/c", tmp_path / "outside", secret=False)
    for name in ("EpochArrays", "EpochDataset"):
        with pytest.raises(StoreError, match=f"{link} is a symbolic link"):
            READERS[name](store)
