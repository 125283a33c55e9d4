"""What a test compares a folder by: every entry below it, links not followed (the store-link tests)."""

from __future__ import annotations

import os
from pathlib import Path


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
