"""Where a published array's batches lie on disk, read from its ``zarr.json`` (no torch, no zarr calls).

The reader memory-maps batches itself instead of going through zarr's per-call read path (measured at
about 0.2x a raw read), so it needs to know, once per array, whether the bytes on disk are the raw
little-endian values (then a batch is a byte range of a file) or need zarr's codecs (compressed stores).
Anything this module does not recognise is read through zarr: correct first, fast where it can be.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import stat
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path, PurePath
from typing import Any

import google_crc32c
import numpy as np

from pgprefetch.errors import StoreError
from pgprefetch.store.beneath import open_below, read_below
from pgprefetch.store.folders import Folder
from pgprefetch.store.zarrjson import ZARR_JSON

_RAW = ([{"name": "bytes", "configuration": {"endian": "little"}}], [{"name": "bytes"}])
_INDEX_CODECS = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
INDEX_ENTRY = 16  # (offset, nbytes) as two little-endian uint64 per inner chunk
INDEX_CRC = 4
MISSING = 2**64 - 1  # shard index entry of an absent inner chunk
SEPARATORS = ("/", ".")  # the only chunk key separators zarr defines
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # a field's name ([fields.NAME]) and every array's: fullmatch


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
    if not isinstance(name, str) or not _PLAIN_NAME.fullmatch(name):  # fullmatch: "$" would let "x\n" through
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
    # A published local epoch's store folder: its files are opened from there down with no link followed
    # (pgprefetch.store.beneath). None: opened by path, the last component no link and no FIFO.
    root: Path | None = None

    @classmethod
    def read(cls, path: Path, root: Path | None = None) -> ArrayLayout:
        """Parse ``path/zarr.json``; with ``root`` (a local store's folder) read with no link followed below it.

        Under ``root`` a missing or unreadable ``zarr.json`` is a one-line StoreError, like damaged metadata.
        """
        meta = path / ZARR_JSON
        if root is None:
            return cls.from_bytes(meta.read_bytes(), path)
        try:
            raw = read_below(root, meta)
        except OSError as e:
            raise StoreError(f"cannot read {meta}: {e.strerror or e}") from None
        if raw is None:
            raise StoreError(f"{path}: the array is missing (the epoch is damaged)")
        return replace(cls.from_bytes(raw, path), root=root)

    @classmethod
    def from_bytes(cls, raw: bytes, path: PurePath) -> ArrayLayout:
        """The layout of the ``zarr.json`` bytes ``raw``, with their SHA-256 (one read: hashed as parsed)."""
        try:
            meta = json.loads(raw)
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError: a damaged byte
            raise StoreError(f"{path}/{ZARR_JSON}: not a JSON document ({e}; a damaged store)") from None
        return replace(cls.parse(meta, path), metadata_sha256=metadata_sha256(raw))

    @classmethod
    def parse(cls, meta: object, path: PurePath) -> ArrayLayout:
        """The layout an array's ``zarr.json`` (``meta``) describes, for the array at ``path``.

        Every value is checked before it is used: the file is the store's, and a store may be damaged or
        someone else's, so what is wrong is a StoreError naming the file, never a KeyError or TypeError.
        Anything valid that pgprefetch does not lay out itself is read through zarr (``raw`` False).
        """
        where = f"{path}/{ZARR_JSON}"
        if not isinstance(meta, dict):
            raise _damaged(where, "is not a JSON object")
        shape = _sizes(meta.get("shape"), where, "shape", least=0)
        if len(shape) < 2:
            raise _damaged(where, f"shape {list(shape)} has no (batches, batch size) dimensions")
        dtype = _data_type(meta.get("data_type"), where)
        grid = meta.get("chunk_grid")
        conf = grid.get("configuration") if isinstance(grid, dict) else None
        outer = _sizes(conf.get("chunk_shape") if isinstance(conf, dict) else None, where, "chunk_grid chunk_shape")
        if len(outer) != len(shape):
            raise _damaged(where, f"chunk_grid chunk_shape {list(outer)} does not match shape {list(shape)}")
        separator, default = _key_encoding(meta.get("chunk_key_encoding", {"name": "default"}), path, where)
        sharded, raw = _codecs(meta.get("codecs"), outer, where)
        raw = raw and outer[1:] == shape[1:] and (sharded or outer[0] == 1)
        return cls(path, dtype, shape, outer[0], sharded, raw, separator, "c" if default else "")

    def open_file(self, path: PurePath) -> int:
        """A read-only descriptor of ``path``, one of this array's files; the caller closes it.

        Below a published local epoch's store (``root``) no link is followed (a link is a StoreError naming
        it); a missing file is ``FileNotFoundError`` (or ``NotADirectoryError``) for the caller to word.
        """
        if self.root is None:
            return _open_regular(path)
        return open_below(self.root, path)

    def wrong_size(self, stored: int) -> str | None:
        """What is wrong with a stored chunk of ``stored`` bytes of this array, or None when nothing is.

        An uncompressed chunk is exactly one batch of the shape: a batch size rewritten in the metadata
        (with the manifest, and the hashes recomputed) is caught here, where the chunks still hold what the
        dump wrote. A compressed chunk's size says nothing.
        """
        if not self.raw or stored == self.batch_bytes:
            return None
        return (
            f"a chunk of {stored} bytes where its zarr.json's batches of {self.batch_shape[0]} samples take "
            f"{self.batch_bytes} (the metadata's batch size or shape is not what the files hold)"
        )

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


def _open_regular(path: PurePath) -> int:
    """A read-only descriptor of the regular file ``path``, its last component no link, a FIFO no hang.

    Outside a published local epoch (no store folder to walk from) the file's own name is still guarded:
    a link or a FIFO planted there is one line, not bytes from elsewhere or an open that never returns.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENXIO):
            raise
        fd = -1
    if fd >= 0 and stat.S_ISREG(os.fstat(fd).st_mode):
        return fd
    if fd >= 0:
        os.close(fd)
    raise StoreError(f"{path}: not a regular file where the store keeps one (a link or FIFO planted?)")


def read_batch_bytes(layout: ArrayLayout, batch: int, epoch: Folder | None = None) -> bytes | None:
    """The bytes of ``batch`` as stored (raw values, or the compressed chunk); None when they are missing.

    A plain read, for checksums (``verify``, resume); the reader maps files instead. In a published local
    epoch nothing is read through a link (:meth:`ArrayLayout.open_file`); in the partial epoch a dump
    writes (``epoch``, its open folder) the file is opened relative to that folder's descriptor, so what
    is checksummed is what the dump wrote there.
    """
    path, slot = layout.file(batch)
    try:
        fd = (
            layout.open_file(path)
            if epoch is None
            else epoch.open(PurePath(path).relative_to(epoch.path).as_posix(), os.O_RDONLY)
        )
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    with os.fdopen(fd, "rb") as f:
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


def checksum(data: bytes | np.ndarray | None) -> int:
    """CRC32C of a chunk's bytes; -1 for a missing chunk. Arrays are checksummed in place, read-only."""
    if data is None:
        return -1
    if isinstance(data, np.ndarray):
        data = data.view()
        data.flags.writeable = False  # the C extension takes read-only buffers only
    return int(google_crc32c.value(data))


def _damaged(where: str, what: str) -> StoreError:
    return StoreError(f"{where}: {what} (a damaged store)")


def _shown(value: object) -> str:
    """``value`` as a message quotes it: its repr, cut short (a message is one line)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _sizes(value: object, where: str, what: str, *, least: int = 1) -> tuple[int, ...]:
    """``value`` as a tuple of integers >= ``least`` (a shape), or a StoreError naming ``what`` in ``where``."""
    if not isinstance(value, list) or not all(type(v) is int and v >= least for v in value):
        raise _damaged(where, f"{what} {_shown(value)} is not a list of integers >= {least}")
    return tuple(value)


def _data_type(data_type: object, where: str) -> np.dtype:
    """The array's dtype, from the plain string form pgprefetch writes (zarr's other forms are not its)."""
    try:
        if not isinstance(data_type, str):
            raise TypeError(data_type)
        return np.dtype(data_type)
    except (TypeError, ValueError, SyntaxError):
        raise _damaged(where, f"data_type {_shown(data_type)} is not a dtype") from None


def _key_encoding(encoding: object, path: PurePath, where: str) -> tuple[str, bool]:
    """The chunk keys' separator, and whether they are zarr v3's default (``c/0/0``) rather than v2's (``0.0``)."""
    if not isinstance(encoding, dict) or encoding.get("name") not in ("default", "v2"):
        raise _damaged(where, f"chunk_key_encoding {_shown(encoding)} is not one zarr defines")
    default = encoding.get("name") == "default"
    options = encoding.get("configuration", {})
    separator = options.get("separator", "/" if default else ".") if isinstance(options, dict) else None
    if not isinstance(separator, str) or separator not in SEPARATORS:  # "/../../" would leave the array
        raise StoreError(f"{path}: chunk key separator {separator!r} is not one zarr defines (a damaged store)")
    return separator, default


def _codecs(codecs: object, outer: tuple[int, ...], where: str) -> tuple[bool, bool]:
    """Whether the chunks are shards, and whether their bytes are pgprefetch's raw layout (else zarr reads them)."""
    if not isinstance(codecs, list) or not all(isinstance(c, dict) and type(c.get("name")) is str for c in codecs):
        raise _damaged(where, f"codecs {_shown(codecs)} is not a list of codecs")
    if not (len(codecs) == 1 and codecs[0]["name"] == "sharding_indexed"):
        return False, codecs in _RAW
    inner = codecs[0].get("configuration")
    if not isinstance(inner, dict):
        raise _damaged(where, "the sharding codec has no configuration")
    raw = (
        inner.get("codecs") in _RAW
        and inner.get("index_codecs") == _INDEX_CODECS
        and inner.get("index_location", "end") == "end"
        and inner.get("chunk_shape") == [1, *outer[1:]]
    )
    return True, raw
