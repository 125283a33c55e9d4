"""The shard files an uncompressed epoch is written into, at the level of descriptors and bytes.

A shard file holds ``S`` consecutive batches (zarr inner chunks of one batch each) followed by zarr's shard
index. Every chunk has the same size, so the index is known before any batch is: :func:`create_shard`
writes it up front, and each batch is then ``pwrite``-n at its own offset, in any order, by
:func:`pwrite_all` on a descriptor :class:`OpenFiles` keeps for the file until its last batch is in. A
write that fails (a full disk) is one line, the same for every file a dump writes (:func:`io_errors`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path, PurePath, PurePosixPath

import google_crc32c
import numpy as np

from pgprefetch.store.folders import Folder
from pgprefetch.store.layout import MISSING, ArrayLayout
from pgprefetch.write.files.io import pwrite_all

SHARD_BYTES = 64 << 20  # target size of a shard file: few files, and one mapping serves many batches


def shard_batches(chunk_bytes: int, n_batches: int) -> int:
    """Batches per shard file for chunks of ``chunk_bytes`` (about 64 MiB a file, at least one batch)."""
    return max(1, min(n_batches, SHARD_BYTES // max(chunk_bytes, 1)))


class OpenFiles:
    """The shard files being written, each opened once and closed when its last batch is in.

    An ``open`` and ``close`` per ``pwrite`` cost about as much as the write itself at 64 KiB. Two writer
    threads share the descriptors; a file is closed only once all its batches are written, so no thread
    still writes to it.
    """

    def __init__(self) -> None:
        self._fds: dict[tuple[PurePath, int], int] = {}
        self._lock = threading.Lock()
        self._epoch: tuple[Folder, Path] | None = None

    def open_in(self, folder: Folder, path: Path) -> None:
        """The files are opened in ``folder``, the partial epoch at ``path`` (by its descriptor, no link followed)."""
        self._epoch = folder, path

    def get(self, layout: ArrayLayout, number: int) -> int:
        """The descriptor of ``layout``'s file ``number``, opened for writing on first use."""
        with self._lock:
            fd = self._fds.get((layout.path, number))
            if fd is None:
                assert self._epoch is not None, "open_in() names the partial epoch first"
                folder, path = self._epoch
                relative = PurePosixPath(layout.file(number * layout.per_file)[0].relative_to(path))
                fd = self._fds[layout.path, number] = folder.open(relative, os.O_WRONLY)
            return fd

    def pwrite(self, layout: ArrayLayout, number: int, data: np.ndarray, offset: int) -> None:
        """Write ``data`` at ``offset`` of ``layout``'s file ``number``, opening the file on first use."""
        pwrite_all(self.get(layout, number), data, offset)

    def close(self, layout: ArrayLayout, number: int) -> None:
        """Close ``layout``'s file ``number`` if it is open."""
        with self._lock:
            fd = self._fds.pop((layout.path, number), None)
        if fd is not None:
            os.close(fd)

    def close_all(self) -> None:
        """Close every file still open (the end of a dump, or its failure)."""
        with self._lock:
            fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def create_shard(folder: Folder, path: PurePosixPath, per_shard: int, valid: int, chunk_bytes: int) -> None:
    """Create the shard file ``path`` of ``folder`` (the partial epoch; its folders made, no link followed).

    Room for ``valid`` chunks, then zarr's index (offset, size per chunk) and its CRC32C.
    """
    index = np.full((per_shard, 2), MISSING, dtype="<u8")
    index[:valid, 0] = np.arange(valid, dtype=np.uint64) * chunk_bytes
    index[:valid, 1] = chunk_bytes
    raw = index.tobytes()
    with os.fdopen(folder.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
        f.truncate(valid * chunk_bytes)
        f.seek(valid * chunk_bytes)
        f.write(raw + google_crc32c.value(raw).to_bytes(4, "little"))


def remove_partial_chunks(folder: Folder) -> None:
    """Delete the temporary files of chunk writes a killed dump left in its partial epoch, ``folder``.

    A chunk is written to a temporary beside it and renamed (``.<chunk>.<token>.tmp`` by
    :meth:`Folder.replace`, ``<chunk>.<uuid>.partial`` by zarr's own store); killed in between, the file stays,
    and publishing the folder would carry it into the epoch. The chunk itself is rewritten, its journal
    line never having been written. Walked by descriptors, no link followed.
    """
    for _, _, files, fd in os.fwalk(".", dir_fd=folder.fd):
        for name in files:
            if name.endswith(".partial") or (name.startswith(".") and name.endswith(".tmp")):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=fd)
