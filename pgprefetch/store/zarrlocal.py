"""A local store as zarr reads it, opening every file the way the readers do: no link followed below the store.

What goes through zarr on a local store (compressed arrays, an epoch's ``_longest`` table, ``verify``'s
``_checksums``) would otherwise be read by zarr's ``LocalStore``, which opens ``root / key`` and follows
any link planted on the way. This subclass reads each key with :func:`~pgprefetch.store.beneath.open_below`,
so zarr's reads keep the readers' promise; it is read-only. Imported only where zarr is (a dump of an
uncompressed epoch never loads zarr).
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Iterable
from pathlib import Path

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.core.buffer.core import default_buffer_prototype
from zarr.storage import LocalStore

from pgprefetch.store.beneath import open_below


class LinklessStore(LocalStore):
    """zarr's ``LocalStore`` over a store's folder, read-only, reading every key with no link followed below it."""

    def __init__(self, root: Path | str, *, read_only: bool = True) -> None:
        super().__init__(root, read_only=True)  # never written through: readers only

    async def get(
        self, key: str, prototype: BufferPrototype | None = None, byte_range: ByteRequest | None = None
    ) -> Buffer | None:
        """``key``'s bytes, read with no link followed below the store; None when it is not there."""
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
        """Whether ``key`` is a file reached with no link followed (a link is a StoreError, not a yes)."""
        return await asyncio.to_thread(self._size, key) is not None

    async def getsize(self, key: str) -> int:
        """The size of ``key``, reached as :meth:`get` reaches it."""
        size = await asyncio.to_thread(self._size, key)
        if size is None:
            raise FileNotFoundError(f"{self.root / key}")
        return size

    def _size(self, key: str) -> int | None:
        try:
            fd = open_below(self.root, self.root / key)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def _read(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None) -> Buffer | None:
        """``key``'s bytes (``byte_range`` of them), as zarr's own ``LocalStore`` reads them; None: not there."""
        try:
            fd = open_below(self.root, self.root / key)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
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
