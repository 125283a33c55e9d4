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
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def holding(path: Path) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` while the block runs; yields False (holding nothing) if taken.

    The file (created if needed) then names its holder, "host pid". It holds on local filesystems and on
    NFSv4 (Linux turns ``flock`` into a byte-range lock the server enforces); on NFSv3 without a lock
    manager it does not.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = open_lock(path)
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


def open_lock(path: Path) -> int:
    """Open (creating) the lock file ``path``, read-write; never through a link, never anything but a file.

    A store's ``.pgprefetch`` is writable by every dump and reader of it: a link planted at a lock's name
    must not make the dump truncate and overwrite the file it points at (``O_NOFOLLOW``: ELOOP), and a
    FIFO or device there is refused before it is written (``O_NONBLOCK`` so opening a FIFO cannot hang).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, f"{path} is a symbolic link, not a lock file (planted?)") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    return fd


def holder(path: Path) -> str:
    """Who holds (or last held) the lock at ``path``: "host pid"."""
    try:
        return path.read_text().strip() or "unknown"
    except OSError:
        return "unknown"
