"""A local store as zarr reads it, opening every file the way the readers do: no link followed below the store.

What goes through zarr on a local store (compressed arrays, an epoch's ``_longest`` table, ``verify``'s
``_checksums``) would otherwise be read by zarr's ``LocalStore``, which opens ``root / key`` and follows
any link planted on the way. This subclass reads each key with :func:`~pgprefetch.store.beneath.open_below`,
so zarr's reads keep the readers' promise; it is read-only. :class:`FolderStore` is the writing side, for
the dump's compressed chunks: every key relative to the partial epoch's open folder. Imported only where
zarr is (a dump of an uncompressed epoch never loads zarr).
"""

from __future__ import annotations

import asyncio
import io
import os
import stat
from collections.abc import AsyncIterator, Iterable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.core.buffer.core import default_buffer_prototype
from zarr.storage import LocalStore

from pgprefetch.store.beneath import open_below
from pgprefetch.store.folders import Folder

if TYPE_CHECKING:
    from zarr.core.common import AccessModeLiteral


class _DescriptorReads(LocalStore):
    """zarr's reads of a local store, each key opened by :meth:`_fd` (no link followed) and read by descriptor."""

    def _fd(self, key: str) -> int | None:
        """A read-only descriptor of the regular file ``key``, or None when it is not there."""
        raise NotImplementedError

    async def get(
        self, key: str, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """``key``'s bytes (``byte_range`` of them), as zarr's own ``LocalStore`` reads them; None: not there."""
        if not self._is_open:
            await self._open()
        return await asyncio.to_thread(self._read, key, prototype or default_buffer_prototype(), byte_range)

    def get_sync(
        self, key: str, *, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """:meth:`get`, for zarr's synchronous paths."""
        self._ensure_open_sync()
        return self._read(key, prototype or default_buffer_prototype(), byte_range)

    async def get_partial_values(
        self, prototype: BufferPrototype, key_ranges: Iterable[tuple[str, ByteRequest | None]]
    ) -> list[Buffer | None]:
        """Each ``(key, range)`` as :meth:`get` reads it (a shard's chunks, say)."""
        return list(await asyncio.gather(*(self.get(key, prototype, r) for key, r in key_ranges)))

    async def exists(self, key: str) -> bool:
        """Whether ``key`` is a regular file reached as :meth:`get` reaches it."""
        return await asyncio.to_thread(self._size, key) is not None

    async def getsize(self, key: str) -> int:
        """The size of ``key``, reached as :meth:`get` reaches it."""
        size = await asyncio.to_thread(self._size, key)
        if size is None:
            raise FileNotFoundError(f"{self.root / key}")
        return size

    def _size(self, key: str) -> int | None:
        fd = self._fd(key)
        if fd is None:
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def _read(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None) -> Buffer | None:
        fd = self._fd(key)
        return None if fd is None else _ranged(fd, prototype, byte_range)


class LinklessStore(_DescriptorReads):
    """zarr's ``LocalStore`` over a store's folder, read-only, reading every key with no link followed below it."""

    def __init__(self, root: Path | str, *, read_only: bool = True) -> None:
        super().__init__(root, read_only=True)  # never written through: readers only

    def _fd(self, key: str) -> int | None:
        try:
            return open_below(self.root, self.root / key)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None


class FolderStore(_DescriptorReads):
    """zarr's ``LocalStore`` over an open :class:`~pgprefetch.store.folders.Folder`, no link followed.

    Every key is read, written and removed relative to the folder's descriptor.

    The writer's compressed chunks go through zarr's codecs, and zarr's own ``LocalStore`` writes
    ``root / key`` by path: a link swapped in for ``.pgprefetch/partial`` (or any folder on the way) while
    the dump runs would be written through. Here the partial epoch's folder is the one the dump opened, and
    each chunk is put in place as :meth:`Folder.replace` puts a file (a temporary beside it, renamed over
    it), so the bytes are zarr's and the place is the descriptor's. The caller keeps the folder open while
    the store is used.
    """

    def __init__(self, folder: Folder, *, read_only: bool = False) -> None:
        super().__init__(folder.path, read_only=read_only)
        self.folder = folder

    def with_read_only(self, read_only: bool = False) -> FolderStore:
        """This store over the same open folder, read-only or not."""
        return FolderStore(self.folder, read_only=read_only)

    async def _open(self, *, mode: AccessModeLiteral | None = None) -> None:
        self._is_open = True  # the folder is open already: nothing is made by path

    def _ensure_open_sync(self) -> None:
        self._is_open = True

    async def clear(self) -> None:
        """Refused: a partial epoch is removed by the writer, through its parent's descriptor."""
        raise NotImplementedError("a FolderStore is never cleared")

    async def move(self, dest_root: Path | str) -> None:
        """Refused: an epoch is published by the store, not moved by zarr."""
        raise NotImplementedError("a FolderStore is never moved")

    # --- reading ------------------------------------------------------------------------------------------
    def _fd(self, key: str) -> int | None:
        try:
            return self.folder.open(key, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    async def exists(self, key: str) -> bool:
        """Whether ``key`` is a regular file in the folder, its links not followed."""
        return self.folder.kind(key) == "file"

    async def list(self) -> AsyncIterator[str]:
        """Every file below the folder, walked by descriptors."""
        for key in _files(self.folder, ""):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        """Every file below ``prefix``, walked by descriptors."""
        for key in _files(self.folder, prefix.rstrip("/")):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        """The names in the folder ``prefix``."""
        below = self.folder.find(prefix.rstrip("/")) if prefix.strip("/") else self.folder.folder(".")
        if below is not None:
            with below:
                for name in below.names():
                    yield name

    # --- writing ------------------------------------------------------------------------------------------
    async def set(self, key: str, value: Buffer) -> None:
        """Put ``value`` at ``key`` (a temporary beside it, renamed over it), relative to the descriptor."""
        await asyncio.to_thread(self.set_sync, key, value)

    def set_sync(self, key: str, value: Buffer) -> None:
        """:meth:`set`, for zarr's synchronous paths."""
        self._check_writable()
        self.folder.replace(key, bytes(value.as_buffer_like()))

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        """:meth:`set` unless a file is at ``key``."""
        if self.folder.kind(key) is None:
            await self.set(key, value)

    async def delete(self, key: str) -> None:
        """Remove ``key`` (a folder with all it holds), never through a link."""
        self.delete_sync(key)

    def delete_sync(self, key: str) -> None:
        """:meth:`delete`, for zarr's synchronous paths."""
        self._check_writable()
        self.folder.remove(key)

    async def delete_dir(self, prefix: str) -> None:
        """Remove the folder ``prefix`` with all it holds, never through a link."""
        self._check_writable()
        self.folder.remove(prefix.rstrip("/"))


def _files(folder: Folder, prefix: str) -> list[str]:
    """Every regular file below ``prefix`` in ``folder`` (keys, as zarr names them), walked by descriptors."""
    below = folder.find(prefix) if prefix else folder.folder(".")
    if below is None:
        return []
    with below:
        return [
            str(PurePosixPath(prefix, top, name)).removeprefix("./")
            for top, _, files, fd in os.fwalk(".", dir_fd=below.fd)
            for name in files
            if stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        ]


def _ranged(fd: int, prototype: BufferPrototype, byte_range: ByteRequest | None) -> Buffer:
    """``byte_range`` of the open file ``fd`` (all of it if None), as zarr's ``LocalStore`` reads it; closes it."""
    with os.fdopen(fd, "rb") as f:
        if byte_range is None:
            return prototype.buffer.from_bytes(f.read())
        size = f.seek(0, io.SEEK_END)
        if isinstance(byte_range, RangeByteRequest):
            f.seek(byte_range.start)
            return prototype.buffer.from_bytes(f.read(byte_range.end - byte_range.start))
        if isinstance(byte_range, OffsetByteRequest):
            f.seek(byte_range.offset)
        elif isinstance(byte_range, SuffixByteRequest):
            f.seek(max(0, size - byte_range.suffix))
        else:
            raise TypeError(f"unexpected byte range {byte_range!r}")
        return prototype.buffer.from_bytes(f.read())
