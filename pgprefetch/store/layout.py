"""Where a published array's batches lie on disk, read from its ``zarr.json`` (no torch, no zarr calls).

The reader memory-maps batches itself instead of going through zarr's per-call read path (measured at
about 0.2x a raw read), so it needs to know, once per array, whether the bytes on disk are the raw
little-endian values (then a batch is a byte range of a file) or need zarr's codecs (compressed stores).
Anything this module does not recognise is read through zarr: correct first, fast where it can be.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path, PurePath
from typing import Any

import google_crc32c
import numpy as np

from pgprefetch.errors import StoreError
from pgprefetch.store.zarrjson import ZARR_JSON

_RAW = ([{"name": "bytes", "configuration": {"endian": "little"}}], [{"name": "bytes"}])
_INDEX_CODECS = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
INDEX_ENTRY = 16  # (offset, nbytes) as two little-endian uint64 per inner chunk
INDEX_CRC = 4
MISSING = 2**64 - 1  # shard index entry of an absent inner chunk
SEPARATORS = ("/", ".")  # the only chunk key separators zarr defines
_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a field's name ([fields.NAME]) and every array's


def metadata_sha256(raw: bytes) -> str:
    """The hex SHA-256 of an array's ``zarr.json`` bytes, as the manifest records it."""
    return hashlib.sha256(raw).hexdigest()


def metadata_record(epoch: Path, names: list[str]) -> dict[str, str]:
    """The manifest's record of the epoch folder's arrays ``names``: each one's ``zarr.json`` SHA-256 (#36.11).

    Written at publication, so that a reader notices an array's metadata changed afterwards.
    """
    return {name: metadata_sha256((epoch / name / ZARR_JSON).read_bytes()) for name in names}


def plain_name(name: object, where: str) -> str:
    """``name`` if it is a plain array name (a field's, or one with a known suffix); StoreError otherwise.

    An epoch's manifest names the arrays a reader opens, and a store may come from someone else (a shared
    folder, a download): a name such as ``../../x`` or ``/home/u/.pgpass`` would make the reader feed files
    from outside the store into batches.
    """
    if not isinstance(name, str) or not _PLAIN_NAME.match(name):
        raise StoreError(
            f"{where}: the manifest names an array {name!r}, not a plain name (a damaged or hostile store)"
        )
    return name


@dataclass(frozen=True)
class ArrayLayout:
    """One array of an epoch: shape, dtype and how batch ``b`` maps to a file and byte range."""

    path: PurePath  # the array's folder: a local Path, or a key prefix in an object store
    dtype: np.dtype
    shape: tuple[int, ...]  # (n_batches, batch_size, *sample_shape)
    per_file: int  # batches per file: the shard's length, or 1 for one chunk per file
    sharded: bool
    raw: bool  # False: the bytes need zarr's codecs (compression)
    separator: str
    prefix: str  # "c" for the default chunk key encoding, "" for v2
    metadata_sha256: str = ""  # of the zarr.json it was read from, for the manifest's record (#36.11)

    @classmethod
    def read(cls, path: Path) -> ArrayLayout:
        """Parse ``path/zarr.json``."""
        return cls.from_bytes((path / "zarr.json").read_bytes(), path)

    @classmethod
    def from_bytes(cls, raw: bytes, path: PurePath) -> ArrayLayout:
        """The layout of the ``zarr.json`` bytes ``raw``, with their SHA-256 (one read: hashed as parsed)."""
        return replace(cls.parse(json.loads(raw), path), metadata_sha256=metadata_sha256(raw))

    @classmethod
    def parse(cls, meta: dict[str, Any], path: PurePath) -> ArrayLayout:
        """The layout an array's ``zarr.json`` (``meta``) describes, for the array at ``path``."""
        shape = tuple(meta["shape"])
        dtype = np.dtype(meta["data_type"])
        outer = tuple(meta["chunk_grid"]["configuration"]["chunk_shape"])
        encoding = meta.get("chunk_key_encoding", {"name": "default"})
        default = encoding.get("name") == "default"
        separator = encoding.get("configuration", {}).get("separator", "/" if default else ".")
        if separator not in SEPARATORS:  # a separator such as "/../../" would lead out of the array's folder
            raise StoreError(f"{path}: chunk key separator {separator!r} is not one zarr defines (a damaged store)")
        codecs = meta["codecs"]
        per_file, sharded, raw = outer[0], False, codecs in _RAW
        if len(codecs) == 1 and codecs[0]["name"] == "sharding_indexed":
            conf = codecs[0]["configuration"]
            sharded = True
            raw = (
                conf["codecs"] in _RAW
                and conf.get("index_codecs") == _INDEX_CODECS
                and conf.get("index_location", "end") == "end"
                and tuple(conf["chunk_shape"]) == (1, *outer[1:])
            )
        raw = raw and outer[1:] == shape[1:] and (sharded or outer[0] == 1)
        return cls(path, dtype, shape, per_file, sharded, raw, separator, "c" if default else "")

    @property
    def batch_shape(self) -> tuple[int, ...]:
        """Shape of one batch: (batch_size, *sample_shape)."""
        return self.shape[1:]

    @cached_property
    def batch_bytes(self) -> int:
        """Bytes of one batch on disk (uncompressed); asked per batch on the write and read paths."""
        return math.prod(self.batch_shape) * self.dtype.itemsize

    @property
    def n_batches(self) -> int:
        """Batches in the array."""
        return self.shape[0]

    def file(self, batch: int) -> tuple[Any, int]:
        """The file holding ``batch``, and the batch's slot in it (0 for one chunk per file)."""
        index, slot = divmod(batch, self.per_file)
        coords = [str(index), *("0" * (len(self.shape) - 1))]
        key = self.separator.join(([self.prefix] if self.prefix else []) + coords)
        return self.path / key, slot

    def shard_index(self, tail: np.ndarray) -> np.ndarray:
        """The ``(per_file, 2)`` offsets and sizes from a shard file's last bytes (``tail`` as uint8)."""
        return tail[: self.per_file * INDEX_ENTRY].view("<u8").reshape(self.per_file, 2)

    @property
    def index_bytes(self) -> int:
        """Size of a shard's index with its checksum."""
        return self.per_file * INDEX_ENTRY + INDEX_CRC


def pread_into(path: Path, buffer: np.ndarray, offset: int) -> None:
    """Fill ``buffer`` from ``path`` at ``offset``; ``preadv`` may read less than asked (2 GiB a call)."""
    view = buffer.data  # memoryview(buffer): numpy types ndarray a Buffer only from Python 3.12
    fd = os.open(path, os.O_RDONLY)
    try:
        while view:
            n = os.preadv(fd, [view], offset)
            if n == 0:
                raise StoreError(f"{path}: the file ends before batch data it should hold (truncated?)")
            view, offset = view[n:], offset + n
    finally:
        os.close(fd)


def read_batch_bytes(layout: ArrayLayout, batch: int) -> bytes | None:
    """The bytes of ``batch`` as stored (raw values, or the compressed chunk); None when they are missing.

    A plain read, for checksums (``verify``, resume); the reader maps files instead.
    """
    path, slot = layout.file(batch)
    try:
        with open(path, "rb") as f:
            if not layout.sharded:
                return f.read()
            size = os.fstat(f.fileno()).st_size
            if size < layout.index_bytes:
                return None
            f.seek(size - layout.index_bytes)
            index = layout.shard_index(np.frombuffer(f.read(layout.index_bytes), dtype=np.uint8))
            offset, nbytes = (int(v) for v in index[slot])
            if offset == MISSING or offset + nbytes > size - layout.index_bytes:
                return None
            f.seek(offset)
            data = f.read(nbytes)
            return data if len(data) == nbytes else None
    except FileNotFoundError:
        return None


def checksum(data: bytes | np.ndarray | None) -> int:
    """CRC32C of a chunk's bytes; -1 for a missing chunk. Arrays are checksummed in place, read-only."""
    if data is None:
        return -1
    if isinstance(data, np.ndarray):
        data = data.view()
        data.flags.writeable = False  # the C extension takes read-only buffers only
    return int(google_crc32c.value(data))
