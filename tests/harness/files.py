"""Folders a test makes and compares: a folder of its own under /tmp with a given mode, and every entry below one.

The store-link tests compare a folder by :func:`tree`; the server and shared-folder tests need folders whose
mode says who may enter (0700 as ``mktemp -d``, 0711 for the server's user, 1777 as /tmp): :func:`tmp_folder`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tmp_folder(prefix: str, mode: int = 0o700) -> Iterator[Path]:
    """A new folder under /tmp (short: unix socket paths are capped) with ``mode``, removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(mode)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def tree(root: Path) -> dict[str, object]:
    """Everything below ``root``, links not followed: each entry's kind, bytes, mode and modification time."""
    out: dict[str, object] = {}
    for folder, folders, files, fd in os.fwalk(root):
        for name in (*folders, *files):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            path = os.path.relpath(os.path.join(folder, name), root)
            if os.path.islink(os.path.join(folder, name)):
                out[path] = ("link", os.readlink(name, dir_fd=fd))
            elif name in folders:
                out[path] = ("folder", st.st_mode, st.st_mtime_ns)
            else:
                out[path] = (Path(folder, name).read_bytes(), st.st_mode, st.st_mtime_ns)
    return out
