"""The Zarr side: the store layout, writing an epoch's batches, and publishing it atomically.

Layout (plain Zarr v3; ``zarr.open_group(store)["epoch-00003"]["x"][7]`` is batch 7)::

    <store>/zarr.json                 root group, attribute pgprefetch_store = {"format_version": 1}
    <store>/epoch-00003/zarr.json     epoch group; attribute "pgprefetch" is the manifest
    <store>/epoch-00003/<field>/      (n_batches, size, *sample_shape), one batch per (inner) chunk
    <store>/epoch-00003/keys/         (n_batches, size, n_key_columns) int64
    <store>/.pgprefetch/partial/      epochs being written (not part of the Zarr hierarchy)

An epoch is written under ``.pgprefetch/partial/epoch-00003`` and becomes visible only through
:func:`publish_epoch`: one filesystem sync, then a rename into place. A reader therefore never sees a
partial epoch under the final name. On object storage (no rename) the same function will write a
completion marker last; nothing else in pgprefetch knows how publication happens.

Uncompressed arrays are sharded (about 64 MiB per file, one batch per inner chunk) and written as raw
little-endian bytes at fixed offsets, byte for byte what zarr writes, without its per-call overhead;
the reader memory-maps a shard once for many batches. Compressed arrays go through zarr's codecs.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

from .errors import EpochNotFoundError, EpochNotReadyError, FormatVersionError, StoreError

FORMAT_VERSION = 1
KEYS_ARRAY = "keys"
META_DIR = ".pgprefetch"
_EPOCH = re.compile(r"^epoch-([0-9]{5,})$")


def epoch_name(epoch: int) -> str:
    """The group name of an epoch: ``epoch-00003``."""
    return f"epoch-{epoch:05d}"


def _compressors(compression: str) -> Any:
    if compression == "zstd":
        return [ZstdCodec(level=3)]
    if compression == "lz4":
        return [BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")]
    return None


@dataclass(frozen=True)
class ArraySpec:
    """One array of an epoch: a field or the keys."""

    name: str
    dtype: np.dtype
    sample_shape: tuple[int, ...]


class Store:
    """A folder holding epochs of one config."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def meta(self) -> Path:
        """Pgprefetch's own folder in the store: partial epochs, and later locks and consumers."""
        return self.path / META_DIR

    def epoch_path(self, epoch: int) -> Path:
        """Where a published epoch lives."""
        return self.path / epoch_name(epoch)

    def partial_path(self, epoch: int) -> Path:
        """Where an epoch is written before it is published."""
        return self.meta / "partial" / epoch_name(epoch)

    def create(self) -> None:
        """Create the store (root group) if needed; refuse a path that is something else."""
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"store path {self.path} is a file, not a folder")
        root = self.path / "zarr.json"
        if self.path.is_dir() and not root.exists() and any(p.name != META_DIR for p in self.path.iterdir()):
            raise StoreError(f"store path {self.path} is a non-empty folder that is not a pgprefetch store")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            if not root.exists():
                zarr.open_group(
                    self.path, mode="a", attributes={"pgprefetch_store": {"format_version": FORMAT_VERSION}}
                )
            self.meta.mkdir(exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create store {self.path}: {e.strerror or e}") from None

    def epochs(self) -> list[int]:
        """The published epochs, in order."""
        if not self.path.is_dir():
            return []
        found = (_EPOCH.match(p.name) for p in self.path.iterdir())
        return sorted(int(m[1]) for m in found if m and (self.path / m[0] / "zarr.json").exists())

    def manifest(self, epoch: int) -> dict[str, Any]:
        """The manifest of a published epoch.

        Raises:
            EpochNotFoundError: not published (lists the epochs that are).
            EpochNotReadyError: it exists only as a partial epoch (being written, or its dump died).
            FormatVersionError: written by a pgprefetch with a newer format.
        """
        path = self.epoch_path(epoch) / "zarr.json"
        if not path.exists():
            if self.partial_path(epoch).exists():
                raise EpochNotReadyError(f"epoch {epoch} in {self.path} is still being written (or its dump died)")
            present = ", ".join(map(str, self.epochs())) or "none"
            raise EpochNotFoundError(f"epoch {epoch} is not in {self.path} (epochs present: {present})")
        manifest = zarr.open_group(self.epoch_path(epoch), mode="r").attrs.get("pgprefetch")
        if not isinstance(manifest, dict):
            raise StoreError(f"{self.epoch_path(epoch)} has no pgprefetch manifest")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise FormatVersionError(
                f"{self.epoch_path(epoch)} has format version {manifest.get('format_version')}; "
                f"this pgprefetch reads version {FORMAT_VERSION}"
            )
        return manifest

    def is_complete(self, epoch: int) -> bool:
        """True when the epoch is published (publication is atomic, so published means complete)."""
        return (self.epoch_path(epoch) / "zarr.json").exists()


SHARD_BYTES = 64 << 20  # target size of a shard file: few files, and one mapping serves many batches
_MISSING = 2**64 - 1  # index entry of an inner chunk past the end of the array


def shard_batches(chunk_bytes: int, n_batches: int) -> int:
    """Batches per shard file for chunks of ``chunk_bytes`` (about 64 MiB a file, at least one batch)."""
    return max(1, min(n_batches, SHARD_BYTES // max(chunk_bytes, 1)))


class EpochWriter:
    """Writes one epoch's batches into its partial folder; :meth:`publish` makes it visible.

    Uncompressed arrays are sharded: each shard file holds ``S`` consecutive batches (inner chunks of one
    batch each) followed by zarr's shard index. Every chunk has the same size, so the index is known up
    front: the files are created with their index at the start, and each batch is ``pwrite``-n at its own
    offset, in any order, by any thread, with no read-modify-write and nothing buffered. Compressed chunks
    vary in size, so compressed arrays keep one file per batch and go through zarr's codecs.
    """

    def __init__(
        self,
        store: Store,
        epoch: int,
        *,
        n_batches: int,
        batch_size: int,
        arrays: list[ArraySpec],
        compression: str,
    ) -> None:
        self.store = store
        self.epoch = epoch
        self.path = store.partial_path(epoch)
        self.compressed = compression != "none"
        if self.path.exists():  # left by a dump that died; resume comes with the operations work
            shutil.rmtree(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.group = zarr.open_group(self.path, mode="w-")
        self.arrays: dict[str, zarr.Array] = {}
        self._shards: dict[str, tuple[int, int]] = {}  # array -> (batches per shard, chunk bytes)
        for spec in arrays:
            chunk = (1, batch_size, *spec.sample_shape)
            chunk_bytes = int(np.prod(chunk)) * spec.dtype.itemsize
            per_shard = shard_batches(chunk_bytes, n_batches)
            self.arrays[spec.name] = array = self.group.create_array(
                spec.name,
                shape=(n_batches, *chunk[1:]),
                chunks=chunk,
                shards=None if self.compressed else (per_shard, *chunk[1:]),
                dtype=spec.dtype,
                compressors=_compressors(compression),
                fill_value=0,
                dimension_names=["batch", "sample", *(f"dim{i}" for i in range(len(spec.sample_shape)))],
                config={"write_empty_chunks": True},  # a chunk for every batch, zeros included
            )
            if not self.compressed:
                self._shards[spec.name] = (per_shard, chunk_bytes)
                for shard in range(-(-n_batches // per_shard)):
                    valid = min(per_shard, n_batches - shard * per_shard)
                    _create_shard(self._file(array, shard), per_shard, valid, chunk_bytes)

    def _file(self, array: zarr.Array, index: int) -> Path:
        """The file of chunk (or shard) ``index`` along the batch axis."""
        return self.path / array.basename / array.metadata.encode_chunk_key((index, *(0,) * (array.ndim - 1)))

    def write_batch(self, batch: int, arrays: dict[str, np.ndarray]) -> int:
        """Write batch ``batch`` of every array (blocking: call it from a worker thread); return bytes."""
        written = 0
        for name, data in arrays.items():
            if self.compressed:
                self.arrays[name][batch] = data
            else:
                per_shard, chunk_bytes = self._shards[name]
                shard, slot = divmod(batch, per_shard)
                raw = np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("<"))
                fd = os.open(self._file(self.arrays[name], shard), os.O_WRONLY)
                try:
                    os.pwrite(fd, raw.data, slot * chunk_bytes)
                finally:
                    os.close(fd)
            written += data.nbytes
        return written

    def publish(self, manifest: dict[str, Any]) -> Path:
        """Record the manifest and publish the epoch atomically; return its final path."""
        self.group.attrs["pgprefetch"] = manifest
        return publish_epoch(self.path, self.store.epoch_path(self.epoch))

    def discard(self) -> None:
        """Remove the partial epoch."""
        shutil.rmtree(self.path, ignore_errors=True)


def _create_shard(path: Path, per_shard: int, valid: int, chunk_bytes: int) -> None:
    """Create a shard file: room for ``valid`` chunks, then zarr's index (offset, size per chunk) + CRC32C."""
    index = np.full((per_shard, 2), _MISSING, dtype="<u8")
    index[:valid, 0] = np.arange(valid, dtype=np.uint64) * chunk_bytes
    index[:valid, 1] = chunk_bytes
    raw = index.tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(valid * chunk_bytes)
        f.seek(valid * chunk_bytes)
        f.write(raw + google_crc32c.value(raw).to_bytes(4, "little"))


def publish_epoch(partial: Path, final: Path) -> Path:
    """Make a fully written epoch visible under its final name, atomically.

    One sync of the filesystem (not an fsync per chunk on the hot path), then a rename, then an fsync of
    the parent folder so the rename itself is durable. An epoch already there (``--force``) is moved aside
    first and removed after.
    """
    _sync_filesystem(partial)
    old = None
    if final.exists():
        old = partial.with_name(partial.name + ".replaced")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(partial, final)
    _fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _sync_filesystem(path: Path) -> None:
    """``syncfs`` the filesystem holding ``path`` (Linux); elsewhere fall back to a global ``sync``."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(path, os.O_RDONLY)
        try:
            if libc.syncfs(fd) == 0:
                return
        finally:
            os.close(fd)
    except (OSError, AttributeError):
        pass
    os.sync()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
