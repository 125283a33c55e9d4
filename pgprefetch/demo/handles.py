"""Who holds the embedded server: the wheel's handle file of the processes that started or joined it.

A server is stopped by the last process that holds it. A holder killed with ``kill -9`` never removes
its pid, so a later ``pgprefetch server`` would "join" a server nobody holds and leave it running when
it stops (#37.12): every reading of the file first drops the pids of processes that are gone.
"""

from __future__ import annotations

import json
from pathlib import Path

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


def prune_handles(pgdata: Path) -> list[int]:
    """Drop the pids of dead processes from the wheel's handle file; return the pids that remain.

    A pid counts as dead also when a process started after the file's last write holds it: a listed
    process wrote the file after it started, so such a process is an unrelated one that reused the pid.
    A file that is not a JSON list of ints (a torn write) is reset rather than left to break every start.
    """
    import psutil  # a dependency of the wheel

    path = pgdata / HANDLE_FILE
    try:
        written = path.stat().st_mtime
        pids = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        pids = None
    if not isinstance(pids, list) or not all(isinstance(pid, int) for pid in pids):
        path.write_text("[]")
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
        path.write_text(json.dumps(keep))
    return keep
