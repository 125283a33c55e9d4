"""The epoch's Zarr metadata, written without zarr, is byte for byte what zarr writes; a dump does not import zarr."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from zarr.codecs import BloscCodec, ZstdCodec

from pgprefetch.config.model import DTYPES
from pgprefetch.store.folders import Folder
from pgprefetch.store.zarrjson import array_json, group_json, guess_chunks, write_array

from .harness.configs import s_config
from .harness.properties import attributes, costly, same_json, texts

ZARR_COMPRESSORS: dict[str, Any] = {
    "none": None,
    "zstd": [ZstdCodec(level=3)],  # what the writer gave zarr for [store] compression = "zstd"
    "lz4": [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")],
}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
@pytest.mark.parametrize("dtype", [*DTYPES, "int32"])
@pytest.mark.parametrize("sample_shape", [(), (16,), (64, 2)])
def test_an_epoch_array_s_metadata_is_what_zarr_writes(
    tmp_path: Path, compression: str, dtype: str, sample_shape: tuple[int, ...]
) -> None:
    n_batches, size = 37, 8
    chunk = (1, size, *sample_shape)
    shards = None if compression != "none" else (5, size, *sample_shape)
    names = ["batch", "sample", *(f"x_dim{i}" for i in range(len(sample_shape)))]
    group = zarr.open_group(tmp_path / "by-zarr", mode="w-")
    group.create_array(
        "x",
        shape=(n_batches, *chunk[1:]),
        chunks=chunk,
        shards=shards,
        dtype=np.dtype(dtype),
        compressors=ZARR_COMPRESSORS[compression],
        fill_value=0,
        dimension_names=names,
        config={"write_empty_chunks": True},
    )
    ours = array_json((n_batches, *chunk[1:]), np.dtype(dtype), chunk, names, shards=shards, compression=compression)
    assert ours == (tmp_path / "by-zarr" / "x" / "zarr.json").read_bytes()


@pytest.mark.parametrize(
    ("attributes", "mode"),
    [
        (None, "w-"),
        ({"pgprefetch_store": {"format_version": 1}}, "a"),
        ({"pgprefetch": {"mean": float("nan"), "max": float("inf"), "name": "été", "shape": [3], "x": None}}, "w-"),
    ],
)
def test_a_group_s_metadata_is_what_zarr_writes(tmp_path: Path, attributes: dict[str, Any] | None, mode: str) -> None:
    zarr.open_group(tmp_path / "g", mode=mode, attributes=attributes)  # type: ignore[arg-type]
    assert group_json(attributes) == (tmp_path / "g" / "zarr.json").read_bytes()


@given(attrs=attributes)
def test_any_group_attributes_are_written_as_zarr_writes_them_and_read_back(attrs: dict[str, Any]) -> None:
    """Unicode of every kind (lone surrogates too), NaN and the infinities, integers of any size, nesting."""
    ours = group_json(attrs)
    assert same_json(json.loads(ours), {"attributes": attrs, "zarr_format": 3, "node_type": "group"})
    with tempfile.TemporaryDirectory() as scratch:
        zarr.open_group(Path(scratch) / "by-zarr", mode="w-", attributes=attrs)
        assert ours == (Path(scratch) / "by-zarr" / "zarr.json").read_bytes()
        (Path(scratch) / "ours").mkdir()
        (Path(scratch) / "ours" / "zarr.json").write_bytes(ours)
        assert same_json(zarr.open_group(Path(scratch) / "ours", mode="r").attrs.asdict(), attrs)


@costly
@given(
    n_batches=st.integers(1, 2**40),
    size=st.integers(1, 4096),
    sample_shape=st.lists(st.integers(1, 64), max_size=2),
    dtype=st.sampled_from([*DTYPES, "int32"]),
    names=st.lists(texts, min_size=4, max_size=4),
    sharded=st.booleans(),
)
def test_any_epoch_array_s_metadata_is_what_zarr_writes(
    n_batches: int, size: int, sample_shape: list[int], dtype: str, names: list[str], sharded: bool
) -> None:
    """Any shape, and field and dimension names in any script: the bytes zarr writes."""
    chunk = (1, size, *sample_shape)
    shards = (min(n_batches, 5), size, *sample_shape) if sharded else None
    names = names[: len(chunk)]
    ours = array_json((n_batches, *chunk[1:]), np.dtype(dtype), chunk, names, shards=shards)
    with tempfile.TemporaryDirectory() as scratch:
        zarr.open_group(Path(scratch), mode="a").create_array(
            "x",
            shape=(n_batches, *chunk[1:]),
            chunks=chunk,
            shards=shards,
            dtype=np.dtype(dtype),
            compressors=None,
            fill_value=0,
            dimension_names=names,
            config={"write_empty_chunks": True},
        )
        assert ours == (Path(scratch) / "x" / "zarr.json").read_bytes()


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((3, 1954), "<u4"), ((3, 1), "<u4"), ((1, 40_000), "<i4"), ((5, 100_000), "<u4"), ((2, 300_001), "<i4")],
)
@costly
@given(data=st.data())
def test_the_checksums_array_is_what_zarr_writes_chunk_files_and_all(
    shape: tuple[int, int], dtype: str, data: st.DataObject
) -> None:
    info = np.iinfo(np.dtype(dtype))
    values = data.draw(hnp.arrays(np.dtype(dtype), shape, elements=st.integers(int(info.min), int(info.max))))
    # Runs of zeros in every row or in one (a chunk zero in one row only is still written).
    spans = st.tuples(st.integers(0, shape[1]), st.integers(0, shape[1]), st.none() | st.integers(0, shape[0] - 1))
    zeros = data.draw(st.just([(0, shape[1] // 3, None)]) | st.lists(spans, max_size=3))
    for lo, hi, row in zeros:  # whole chunks of zeros: zarr leaves them unwritten
        values[slice(None) if row is None else row, min(lo, hi) : max(lo, hi)] = 0
    names = ["_checksums_array", "batch"]
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        zarr.open_group(folder / "by-zarr", mode="w-").create_array(
            "a", data=values, compressors=None, dimension_names=names
        )
        (folder / "ours" / "a").mkdir(parents=True)
        (folder / "ours" / "a" / "stale").write_bytes(b"left by a publish that failed")  # replaced, as overwrite=True
        with Folder.anchor(folder / "ours") as ours:
            write_array(ours, "a", values, names)
        assert _files(folder / "ours" / "a") == _files(folder / "by-zarr" / "a")


def test_chunks_are_guessed_as_zarr_guesses_them() -> None:
    from zarr.core.chunk_grids import _guess_chunks

    for n_arrays in (1, 2, 3, 7, 40):
        for n_batches in (1, 2, 1954, 10_000, 33_333, 100_000, 1_000_000, 10_000_000):
            for itemsize in (4, 8):
                assert guess_chunks((n_arrays, n_batches), itemsize) == _guess_chunks((n_arrays, n_batches), itemsize)


@given(n_arrays=st.integers(1, 2**10), n_batches=st.integers(1, 2**40), itemsize=st.sampled_from([1, 2, 4, 8]))
def test_chunks_are_guessed_as_zarr_guesses_them_for_any_shape(n_arrays: int, n_batches: int, itemsize: int) -> None:
    from zarr.core.chunk_grids import _guess_chunks

    assert guess_chunks((n_arrays, n_batches), itemsize) == _guess_chunks((n_arrays, n_batches), itemsize)


def _imports_after(argv: list[str], tmp_path: Path) -> list[str]:
    """Run the CLI on ``argv`` in a fresh interpreter; return which of zarr and its codecs it imported."""
    code = (
        "import sys\nfrom pgprefetch.cli import cli\n"
        f"try:\n    cli({argv!r})\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'zarr', 'numcodecs'}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]  # type: ignore[return-value]


@pytest.mark.parametrize("mode", ["query", "scan"])
def test_a_dump_of_an_uncompressed_local_epoch_and_ls_do_not_import_zarr(
    s_table: str, tmp_path: Path, mode: str
) -> None:
    cfg = s_config(tmp_path)
    if mode == "scan":  # the same samples, read by scanning the table
        cfg.write_text(
            '[samples]\ntable = "s"\nkey = ["id"]\n[fields.v]\ncolumns = ["v"]\ndtype = "float32"\n'
            '[batches]\nsize = 16\nseed = 0\n[store]\npath = "store.zarr"\ncompression = "none"\n'
        )
    assert _imports_after(["dump", "--config", str(cfg), "--epoch", "0", "--dsn", s_table], tmp_path) == "[]"
    assert _imports_after(["ls", "--config", str(cfg)], tmp_path) == "[]"
    epoch = zarr.open_group(tmp_path / "store.zarr" / "epoch-00000", mode="r")  # and zarr reads what was written
    assert epoch["v"].shape == (30, 16)
    assert epoch["v"][1].dtype == np.float32
    assert epoch.attrs["pgprefetch"]["n_samples"] == 480
