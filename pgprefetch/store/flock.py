"""One writer per folder on this machine: a non-blocking ``flock`` that names its holder.

A local store's epoch lock, and an object store's staging folder: both are a folder on this machine that
only one dump may write. The kernel drops a ``flock`` when its holder dies, even by ``kill -9``, so nothing
is left to clean up; and a holder that is merely stalled (stopped, swapping) keeps it, so no other dump on
this machine writes into the folder under it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from pgprefetch.store.folders import Folder


@contextmanager
def holding(folder: Folder, name: str) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on the file ``name`` in ``folder`` while the block runs; yields False if taken.

    The file (created if needed) then names its holder, "host pid". It holds on local filesystems and on
    NFSv4 (Linux turns ``flock`` into a byte-range lock the server enforces); on NFSv3 without a lock
    manager it does not.
    """
    fd = open_lock(folder, name)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise
            yield False
            return
        with contextlib.suppress(OSError):  # who holds it is a courtesy; a full disk must not stop the dump
            os.ftruncate(fd, 0)  # a regular file: open_lock refuses anything else
            os.pwrite(fd, f"{socket.gethostname()} {os.getpid()}\n".encode(), 0)
        yield True
    finally:
        os.close(fd)


def open_lock(folder: Folder, name: str) -> int:
    """Open (creating) the lock file ``name`` in ``folder``, read-write; never through a link, only a file.

    A store's ``.pgprefetch`` is writable by every dump and reader of it: a link planted at a lock's name
    must not make the dump truncate and overwrite the file it points at, and a FIFO or device there is
    refused before it is written (:meth:`Folder.open`: a StoreError, one line). A link is refused rather
    than replaced: two dumps replacing it at once could each end up holding a lock on a file of its own.
    """
    return folder.open(name, os.O_RDWR | os.O_CREAT)


def holder(folder: Folder | None, name: str) -> str:
    """Who holds (or last held) the lock ``name`` in ``folder``: "host pid"."""
    raw = folder.read(name) if folder is not None else None
    return (raw or b"").decode(errors="replace").strip() or "unknown"
