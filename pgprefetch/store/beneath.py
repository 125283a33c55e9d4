"""How a reader opens a published epoch's files: from the store's folder down, never through a link.

A store may be written by someone else (a shared folder, a download), and a link planted anywhere below it
(an epoch's folder, an array's, ``c/``, ``c/0``, a shard file, a ``zarr.json``) would make a reader hand
out the bytes of whatever it points at as batches. ``O_NOFOLLOW`` on the file guards its last component
only, and resolving a path and comparing it before opening it leaves a gap in which a folder can become a
link. So every file a reader opens below a local store is reached by :func:`open_below`: the store's folder
is opened as the user named it (links and all: it is their choice), then each component below it with
``O_NOFOLLOW`` relative to the descriptor of the one above (``O_DIRECTORY`` for folders), and the file
itself must be a regular file. A link met on the way is a one-line :class:`StoreError` naming it; a
missing name stays an ``OSError`` (``FileNotFoundError``, ``NotADirectoryError``) for the caller to word.

Writes below a store walk the same way but meet a link with another rule (:mod:`pgprefetch.store.folders`:
the store's own folder is remade in the link's place). A reader changes nothing in a store, which may not
be its own to change, and a link where an epoch's file belongs means the epoch is not what was published,
so it refuses and names the link.

The cost is one ``openat`` per component, paid when a file is opened: readers open a shard once a pass and
map it, so no batch pays it.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path, PurePath

from pgprefetch.errors import StoreError

_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # O_NONBLOCK: a planted FIFO cannot hang the open


def open_below(root: Path, path: PurePath) -> int:
    """A read-only descriptor of the regular file ``path``, reached from ``root`` with no link followed.

    ``root`` (a local store's folder) is opened as named; ``path`` must lie below it, and none of its
    components below ``root`` may be a link (StoreError naming it) or ``..``. Missing components raise
    ``FileNotFoundError`` (``NotADirectoryError`` where a file stands for a folder, ``IsADirectoryError``
    when ``path`` is a folder). The caller closes the descriptor.
    """
    parts = PurePath(path).relative_to(root).parts
    if not parts or any(p in ("", ".", "..") for p in parts):
        raise StoreError(f"{path}: not a file below {root} (a damaged or hostile store)")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            try:
                inner = os.open(name, _FILE if last else _FOLDER, dir_fd=fd)
            except OSError as e:
                _explain(e, fd, name, root.joinpath(*parts[: i + 1]))
                raise
            os.close(fd)
            fd = inner
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
        if not stat.S_ISREG(mode):
            raise StoreError(f"{path}: not a regular file where the store keeps one (a damaged or hostile store)")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_below(root: Path, path: PurePath) -> bytes | None:
    """The bytes of the file ``path`` below ``root`` (:func:`open_below`); None when it is not there."""
    try:
        fd = open_below(root, path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read()


def _explain(error: OSError, fd: int, name: str, path: Path) -> None:
    """Raise StoreError naming ``path`` when the open of ``name`` failed because it is a link; else return.

    Linux says ``ELOOP`` for a link opened with ``O_NOFOLLOW`` and ``ENOTDIR`` for one opened with
    ``O_DIRECTORY`` as well, which a file in a folder's place says too: ``lstat`` tells them apart.
    """
    if error.errno not in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
        error.filename = str(path)
        return
    try:
        mode = os.lstat(name, dir_fd=fd).st_mode
    except OSError:
        return
    if stat.S_ISLNK(mode):
        raise StoreError(
            f"{path} is a symbolic link: readers follow no link inside a store, since one leads out of the "
            "epoch (a damaged or hostile store)"
        ) from None
    error.filename = str(path)
