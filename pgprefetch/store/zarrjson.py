"""The Zarr v3 metadata of an epoch (``zarr.json`` of its groups and arrays), written without zarr.

Importing zarr costs a dump about 0.25-0.5 s of start-up (its codec registry, numcodecs, its async store
layer), while an uncompressed epoch's chunk bytes are ours already (:mod:`pgprefetch.write.files.shardfiles`). So
the dump writes the metadata documents itself: the same JSON, byte for byte, as zarr 3 writes for the same
arrays (``tests/test_zarrjson.py`` compares them, every dtype and compression), and the small uncompressed
``_checksums`` / ``_longest`` arrays with their chunk files. Compressed chunks still go through zarr's
codecs, imported only by a dump that writes them.

The format is the Zarr v3 specification's: a ``zarr.json`` per node (``node_type`` group or array), chunk
files under ``c/`` joined by ``/``, little-endian ``bytes`` codec (no ``endian`` for one-byte types).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from pgprefetch.store.folders import Folder

ZARR_JSON = "zarr.json"


def _dumps(document: dict[str, Any]) -> bytes:
    """A document as zarr serialises it (``json_indent`` 2, NaN allowed)."""
    return json.dumps(document, indent=2, allow_nan=True).encode()


def group_json(attributes: dict[str, Any] | None = None) -> bytes:
    """A group's ``zarr.json`` with these attributes."""
    return _dumps({"attributes": attributes or {}, "zarr_format": 3, "node_type": "group"})


def group_attributes(folder: Folder) -> dict[str, Any]:
    """The attributes of the group in ``folder`` as they are (a publish replaces the manifest among them)."""
    attributes: dict[str, Any] = json.loads(folder.read(ZARR_JSON) or b"{}").get("attributes", {})
    return attributes


def _bytes_codec(dtype: np.dtype) -> dict[str, Any]:
    if dtype.itemsize == 1:
        return {"name": "bytes"}
    return {"name": "bytes", "configuration": {"endian": "little"}}


def compressor_codecs(compression: str, dtype: np.dtype) -> list[dict[str, Any]]:
    """The codecs after ``bytes`` for a ``[store] compression`` setting (the ones :func:`compressors` names)."""
    if compression == "zstd":
        return [{"name": "zstd", "configuration": {"level": 3, "checksum": False}}]
    if compression == "lz4":
        conf = {"typesize": dtype.itemsize, "cname": "lz4", "clevel": 5, "shuffle": "shuffle", "blocksize": 0}
        return [{"name": "blosc", "configuration": conf}]
    if compression == "none":
        return []
    raise ValueError(f"unknown compression {compression!r}")


def _fill(dtype: np.dtype, value: int) -> bool | int | float:
    if dtype.kind == "b":
        return bool(value)
    if dtype.kind == "f":
        return float(value)
    return int(value)


def array_json(
    shape: Sequence[int],
    dtype: np.dtype,
    chunks: Sequence[int],
    dimension_names: Sequence[str],
    *,
    shards: Sequence[int] | None = None,
    compression: str = "none",
) -> bytes:
    """An array's ``zarr.json``, as zarr's ``create_array(..., fill_value=0, dimension_names=...)`` writes it.

    Sharded arrays are uncompressed (the epoch's layout), their index at the end.
    """
    codecs: list[dict[str, Any]] = [_bytes_codec(dtype), *compressor_codecs(compression, dtype)]
    outer = chunks
    if shards is not None:
        if compression != "none":
            raise ValueError("sharded arrays are written uncompressed")
        index = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
        conf = {"chunk_shape": list(chunks), "codecs": codecs, "index_codecs": index, "index_location": "end"}
        codecs, outer = [{"name": "sharding_indexed", "configuration": conf}], shards
    return _dumps(
        {
            "shape": list(shape),
            "data_type": np.dtype(dtype).name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(outer)}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "fill_value": _fill(np.dtype(dtype), 0),
            "codecs": codecs,
            "attributes": {},
            "dimension_names": list(dimension_names),
            "zarr_format": 3,
            "node_type": "array",
            "storage_transformers": [],
        }
    )


def guess_chunks(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    """The chunk shape zarr picks for ``chunks="auto"`` (``zarr.core.chunk_grids._guess_chunks``, from h5py).

    Halve the axes in turn until a chunk is under a target that grows with the array's size (128 KiB to
    64 MiB). Copied, not imported: the ``_checksums`` of a large epoch is chunked by it.
    """
    chunks = np.maximum(np.array(shape, dtype="=f8"), 1)
    target = 256 * 1024 * (2 ** np.log10(np.prod(chunks) * itemsize / (1024.0 * 1024)))
    target = min(max(target, 128 * 1024), 64 * 1024 * 1024)
    idx = 0
    while True:
        chunk_bytes = np.prod(chunks) * itemsize
        if (chunk_bytes < target or abs(chunk_bytes - target) / target < 0.5) and chunk_bytes < 64 * 1024 * 1024:
            break
        if np.prod(chunks) == 1:
            break
        chunks[idx % len(shape)] = math.ceil(chunks[idx % len(shape)] / 2.0)
        idx += 1
    return tuple(int(x) for x in chunks)


def write_array(parent: Folder, name: str, data: np.ndarray, dimension_names: Sequence[str]) -> None:
    """An uncompressed 2-D array ``name`` in ``parent`` holding ``data``, replacing one there (``create_array``).

    Chunked as zarr chunks it; a chunk whose values are all the fill value (0) is not written (zarr's
    default ``write_empty_chunks=False``); edge chunks are padded with zeros to the whole chunk. Written
    through the folder's descriptor (:mod:`pgprefetch.store.folders`): it goes into an epoch being staged.
    """
    if data.ndim != 2:
        raise ValueError("write_array writes 2-D arrays")
    data = np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<"))
    chunks = guess_chunks(data.shape, data.dtype.itemsize)
    with parent.fresh(name, mode=0o777) as folder:
        for i in range(-(-data.shape[0] // chunks[0])):
            for j in range(-(-data.shape[1] // chunks[1])):
                block = data[i * chunks[0] : (i + 1) * chunks[0], j * chunks[1] : (j + 1) * chunks[1]]
                if not block.any():
                    continue
                chunk = np.zeros(chunks, dtype=data.dtype)
                chunk[: block.shape[0], : block.shape[1]] = block
                folder.write(f"c/{i}/{j}", chunk.tobytes())
        folder.write(ZARR_JSON, array_json(data.shape, data.dtype, chunks, dimension_names))
