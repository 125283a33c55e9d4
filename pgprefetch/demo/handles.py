"""Who holds the embedded server: the wheel's handle file of the processes that started or joined it.

A server is stopped by the last process that holds it. A holder killed with ``kill -9`` never removes
its pid, so a later ``pgprefetch server`` would "join" a server nobody holds and leave it running when
it stops: every reading of the file first drops the pids of processes that are gone.

The file lies in the data folder, which as root belongs to the server's system user: that user may put a
link (or a FIFO) at its name. So root never opens it by path: the data folder is opened without following a
link and the file relative to it (:class:`pgprefetch.store.folders.Folder`), read only when it is a regular
file, and written by a rename over the name, which replaces a link rather than writing where it points. The
wheel's own reads and writes of the file (:class:`HandleList`) go the same way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pgprefetch.store.folders import Folder

HANDLE_FILE = ".handle_pids.json"
"""The wheel's list (JSON) of the pids of the processes using the server of a data folder."""


def alive(pid: int) -> bool:
    """Whether ``pid`` is a running process; a zombie is not (a container's init may never reap it)."""
    import psutil  # a dependency of the wheel

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _data_folder(pgdata: Path) -> Folder | None:
    """``pgdata`` open as a descriptor (a link there is not followed); None when it is missing."""
    try:
        return Folder(os.open(pgdata, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC), pgdata)
    except FileNotFoundError:
        return None


def _read(folder: Folder) -> tuple[list[int] | None, float] | None:
    """The handle file's pids (None if it is not a JSON list of ints) and its mtime; None without a file."""
    try:
        st = os.stat(HANDLE_FILE, dir_fd=folder.fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    data = folder.read(HANDLE_FILE)  # None for a link or a FIFO: not a list the wheel wrote
    try:
        pids = json.loads(data) if data is not None else None
    except ValueError:
        pids = None
    if not isinstance(pids, list) or not all(isinstance(pid, int) for pid in pids):
        return None, st.st_mtime
    return pids, st.st_mtime


def _write(folder: Folder, pids: list[int]) -> None:
    folder.replace(HANDLE_FILE, json.dumps(pids).encode())


def read_handles(pgdata: Path) -> list[int]:
    """The pids in ``pgdata``'s handle file as they are; an empty list without a readable one."""
    folder = _data_folder(pgdata)
    if folder is None:
        return []
    with folder:
        found = _read(folder)
    return (found[0] or []) if found else []


def write_handles(pgdata: Path, pids: list[int]) -> None:
    """Put ``pids`` in ``pgdata``'s handle file: a new file renamed over the name, whatever was there."""
    folder = _data_folder(pgdata)
    if folder is not None:
        with folder:
            _write(folder, pids)


def reset_handles(pgdata: Path) -> None:
    """Empty ``pgdata``'s handle file if there is one (something at its name): no process holds the server."""
    folder = _data_folder(pgdata)
    if folder is not None:
        with folder:
            if folder.kind(HANDLE_FILE) is not None:
                _write(folder, [])


class HandleList:
    """The wheel's ``DiskList`` of a handle file, reading and writing it as :func:`read_handles` does.

    Set in place of the wheel's class (:func:`pgprefetch.demo.access.guard_wheel`), which reads and writes
    the file by path and so would follow a link planted at its name.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self) -> list[int]:
        """The pids listed (none for a file that is not a list of them)."""
        return read_handles(self.path.parent)

    def put(self, values: list[int]) -> None:
        """List ``values``, replacing whatever is at the file's name."""
        write_handles(self.path.parent, values)

    def get_and_add(self, value: int) -> list[int]:
        """Add ``value`` if it is not listed; return the list as it was."""
        old = self.get()
        if value not in old:
            self.put([*old, value])
        return old

    def get_and_remove(self, value: int) -> list[int]:
        """Remove ``value``; return the list as it was."""
        old = self.get()
        if value in old:
            self.put([pid for pid in old if pid != value])
        return old


def prune_handles(pgdata: Path) -> list[int]:
    """Drop the pids of dead processes from the wheel's handle file; return the pids that remain.

    A pid counts as dead also when a process started after the file's last write holds it: a listed
    process wrote the file after it started, so such a process is an unrelated one that reused the pid.
    A file that is not a JSON list of ints (a torn write, a link) is reset rather than left to break every start.
    """
    import psutil  # a dependency of the wheel

    folder = _data_folder(pgdata)
    if folder is None:
        return []
    with folder:
        found = _read(folder)
        if found is None:
            return []
        pids, written = found
        if pids is None:
            _write(folder, [])
            return []
        keep = []
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                # 2 s: psutil's start times come from the boot time in whole seconds
                if proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() <= written + 2:
                    keep.append(pid)
            except psutil.NoSuchProcess:
                pass
            except psutil.AccessDenied:
                keep.append(pid)
        if keep != pids:
            _write(folder, keep)
        return keep
