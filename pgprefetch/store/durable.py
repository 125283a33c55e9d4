"""Making what a dump wrote durable: its own files' data and entries, and nothing of anyone else's.

An epoch is published by a rename, and the rename must not reach the disk before the files it names do:
a crash would then leave a published epoch with holes. ``syncfs`` did that in one call, but it writes
back every dirty page of the filesystem, other processes' too: a training job's checkpoint written beside
the store, or the output a previous job left in the page cache, made each publication wait for it (0.8 s
for another process's 458 MB here). A dump knows which files it wrote, so it syncs those: each shard file as
soon as it is finished (:class:`WriteBack`, the local store's :class:`~pgprefetch.store.base.Uploader`,
while the writers go on), then at publication every file and folder of the epoch (:func:`sync_tree`),
which costs little for files already written back (about 50 us each).
"""

from __future__ import annotations

import errno
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from pgprefetch.store.base import Uploader
from pgprefetch.store.folders import Folder


def sync_data(fd: int) -> None:
    """Write an open file's data back to disk: ``fdatasync`` where there is one, else ``fsync``."""
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def sync_dir(fd: int) -> None:
    """Make a folder's entries (files created, renamed or removed in it) durable: the folder open as ``fd``."""
    os.fsync(fd)


def sync_tree(folder: Folder) -> None:
    """Make every file below ``folder``, and every folder's entries, durable (before a rename publishes it).

    Walked by descriptors (:mod:`pgprefetch.store.folders`), no link followed: an entry that is not a
    file of the epoch's own is not the dump's to sync.
    """
    for _, _, files, fd in os.fwalk(".", dir_fd=folder.fd):
        for name in files:
            try:
                file = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENXIO):
                    continue  # a link or a FIFO: nothing of the dump's
                raise
            try:
                sync_data(file)
            finally:
                os.close(file)
        sync_dir(fd)


def sync_file(path: Path) -> None:
    """Write a closed file's data back to disk (the file itself, never what a link there points at)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        sync_data(fd)
    finally:
        os.close(fd)


class WriteBack(Uploader):
    """A local store's uploader: each finished file written back to disk on a thread, while the dump goes on.

    Made durable only at publication, an epoch's data is written back after its last batch, all of it,
    while the dump waits (0.8 s for the 458 MB of a 440k-window epoch here); file by file, as the writer
    finishes each, the write-back runs beside the writers' work instead. :meth:`finish` waits and raises
    the first failure (an I/O error found at write-back), so the epoch is not published; leaving the block
    on a failure waits for what is in flight and raises nothing more.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="pgprefetch-writeback")
        self._futures: list[Future[None]] = []

    def __enter__(self) -> WriteBack:
        return self

    def __exit__(self, kind: object, error: object, tb: object) -> None:
        if kind is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            return
        self.finish()

    def submit(self, path: Path) -> None:
        """Write ``path`` (closed: no one writes to it any more) back to disk on the pool's thread."""
        self._futures.append(self._pool.submit(self._write_back, path))

    def _write_back(self, path: Path) -> None:
        sync_file(path)

    def finish(self) -> None:
        """Wait until every submitted file is on disk; raise the first failure."""
        self._pool.shutdown(wait=True)
        for future in self._futures:
            future.result()
