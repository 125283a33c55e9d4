"""The Zarr side: the store layout, writing an epoch's batches, and publishing it atomically.

Layout (plain Zarr v3; ``zarr.open_group(store)["epoch-00003"]["x"][7]`` is batch 7)::

    <store>/zarr.json                 root group, attribute pgprefetch_store = {"format_version": 1}
    <store>/epoch-00003/zarr.json     epoch group; attribute "pgprefetch" is the manifest
    <store>/epoch-00003/<field>/      (n_batches, size, *sample_shape), one batch per (inner) chunk
    <store>/epoch-00003/keys/         (n_batches, size, n_key_columns) int64
    <store>/.pgprefetch/partial/      epochs being written, with their journals (not part of the Zarr hierarchy)
    <store>/.pgprefetch/locks/        one lock file per epoch: one writer at a time
    <store>/.pgprefetch/consumers/    the epoch each training run (consumer) opened last

An epoch is written under ``.pgprefetch/partial/epoch-00003`` and becomes visible only through
:func:`publish_epoch`: one filesystem sync, then a rename into place. A reader therefore never sees a
partial epoch under the final name. On object storage (no rename) the same function will write a
completion marker last; nothing else in pgprefetch knows how publication happens.

How batches are written is :mod:`pgprefetch.writer`'s business; this module knows where things are.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import re
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec, ZstdCodec

from .errors import EpochNotFoundError, EpochNotReadyError, FormatVersionError, StoreError

FORMAT_VERSION = 1
KEYS_ARRAY = "keys"
META_DIR = ".pgprefetch"
_EPOCH = re.compile(r"^epoch-([0-9]{5,})$")
_CONSUMER = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def epoch_name(epoch: int) -> str:
    """The group name of an epoch: ``epoch-00003``."""
    return f"epoch-{epoch:05d}"


def compressors(compression: str) -> Any:
    """Zarr's compressors for a ``[store] compression`` setting (None: raw, memory-mappable chunks)."""
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
        """Pgprefetch's own folder in the store: partial epochs, locks and consumer records."""
        return self.path / META_DIR

    def epoch_path(self, epoch: int) -> Path:
        """Where a published epoch lives."""
        return self.path / epoch_name(epoch)

    def partial_path(self, epoch: int) -> Path:
        """Where an epoch is written before it is published."""
        return self.meta / "partial" / epoch_name(epoch)

    def journal_path(self, epoch: int) -> Path:
        """The journal of a partial epoch: what it holds and the checksum of every batch written."""
        return self.meta / "partial" / f"{epoch_name(epoch)}.journal"

    def partial_epochs(self) -> list[int]:
        """Epochs with a partial folder: being written, or left by a dump that died."""
        folder = self.meta / "partial"
        found = (_EPOCH.match(p.name) for p in folder.iterdir()) if folder.is_dir() else ()
        return sorted(int(m[1]) for m in found if m)

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

    def require(self) -> Store:
        """This store, if it exists; a one-line StoreError naming the path otherwise (a typo, a wrong mount)."""
        if not (self.path / "zarr.json").is_file():
            what = "a folder that is not a pgprefetch store" if self.path.is_dir() else "nothing there"
            raise StoreError(f"no store at {self.path} ({what})")
        return self

    def remove_if_unused(self) -> None:
        """Remove a store that holds no epoch, complete or partial (one a failed first dump created)."""
        if self.epochs() or self.partial_epochs():
            return
        shutil.rmtree(self.path, ignore_errors=True)

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
        manifest = json.loads(path.read_text()).get("attributes", {}).get("pgprefetch")
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

    @contextmanager
    def writer_lock(self, epoch: int) -> Iterator[bool]:
        """Hold the epoch's lock while the block runs; yields False (holding nothing) if another dump has it.

        An advisory ``flock`` on ``.pgprefetch/locks/epoch-N.lock``: the kernel drops it when the holder
        dies, even by ``kill -9``, so there are no stale locks to clean up. It holds on local filesystems
        and on NFSv4 (Linux turns ``flock`` into a byte-range lock the server enforces); on NFSv3 without
        a lock manager it does not, so run the dumps of one store from one host there.
        """
        path = self.meta / "locks" / f"{epoch_name(epoch)}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                    raise
                yield False
                return
            with contextlib.suppress(OSError):  # who holds it is a courtesy; a full disk must not stop the dump
                os.ftruncate(fd, 0)
                os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
            yield True
        finally:
            os.close(fd)

    def lock_holder(self, epoch: int) -> str:
        """Who holds (or last held) an epoch's lock: "host pid"."""
        path = self.meta / "locks" / f"{epoch_name(epoch)}.lock"
        try:
            return path.read_text().strip() or "unknown"
        except OSError:
            return "unknown"

    def record_consumer(self, name: str, epoch: int) -> None:
        """Note, atomically, that consumer ``name`` (a training run) opened ``epoch``."""
        if not _CONSUMER.match(name):
            raise StoreError(f"consumer name {name!r}: use 1-64 letters, digits, '_', '.' or '-'")
        folder = self.meta / "consumers"
        folder.mkdir(parents=True, exist_ok=True)
        record = {
            "consumer": name,
            "epoch": epoch,
            "updated": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(record) + "\n")
        os.replace(tmp, folder / f"{name}.json")

    def consumers(self) -> dict[str, int]:
        """The epoch each consumer opened last."""
        folder = self.meta / "consumers"
        out = {}
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
            try:
                out[path.stem] = int(json.loads(path.read_text())["epoch"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a record being replaced, or damaged: the next open rewrites it
        return out


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
