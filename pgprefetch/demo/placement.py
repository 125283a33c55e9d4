"""Where a server's data lives, and which folders pgprefetch refuses to start one in.

- ``--dir`` and its ``pg`` must be real folders (not links) of the user who starts the server; as root,
  ``pg`` is the server's system user's, handed over by pgprefetch when it made it. A link could point the
  server, and root's hand-over (a chown), at any folder of someone else's choosing; another user's folder
  holds their server, which root would join or take over, and a chown of it would take their own server's
  files from them. Each is refused in one line naming the owner, and pgprefetch changes the owner only of
  a ``pg`` it has just made.
- As root (PostgreSQL then runs as ``embedded_postgres``) the data stays in ``--dir/pg`` only where root
  alone can change the folders down to it and that user can enter them all
  (:func:`pgprefetch.demo.rootdirs.trust_problem`). Anywhere else (a clone in root's 0700 home, a
  ``mktemp -d`` folder, another user's project) it goes to ``DATA/<key>/pg`` instead of widening a
  folder, for one run: ``<key>`` is a hash of the ``--dir`` (its path and inode), so a second start on
  the same folder finds and joins the server; the last process to stop the server removes the data; and
  a start sweeps away the data of servers that are gone (their holders killed with SIGKILL, say).
"""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pgprefetch.demo.access import SERVER_USER, owner_name
from pgprefetch.demo.handles import alive
from pgprefetch.demo.rootdirs import locked, root_folder, sweep, trust_problem
from pgprefetch.errors import ConfigError, PgprefetchError

DATA = Path("/var/lib/pgprefetch")
"""As root: the data folders of servers whose ``--dir`` the server's user cannot reach, one run each."""


@dataclass(frozen=True)
class Placement:
    """Where one server's data lives."""

    folder: Path
    """The ``--dir``, absolute: a real folder of the user's own."""
    pgdata: Path
    """The data folder: ``folder/pg``, or as root one under :data:`DATA`."""
    moved: str | None
    """Why the data is not in ``folder/pg`` (as root), or None where it is."""


def locate(folder: Path) -> Placement:
    """Check ``folder`` (made if missing) and its ``pg``; say where the server's data lives.

    Raises:
        ConfigError: ``folder`` or its ``pg`` is a link, not a folder, or another user's.
    """
    folder = Path(os.path.abspath(folder))
    _own_folder(folder)
    real = folder.resolve()  # links above the folder are the user's own business; the folder itself is not one
    pgdata = real / "pg"
    check_data_folder(pgdata)
    if os.geteuid() != 0:
        return Placement(folder, pgdata, None)
    problem = trust_problem(real)
    if problem is None:
        return Placement(folder, pgdata, None)
    st = real.stat()
    key = hashlib.sha256(f"{real}\0{st.st_dev}\0{st.st_ino}".encode()).hexdigest()[:16]
    return Placement(folder, DATA.resolve() / key / "pg", problem)


def _own_folder(folder: Path) -> None:
    """Make ``folder`` if missing; refuse it if it is a link, not a folder, or another user's."""
    if not os.path.lexists(folder):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot make the server's folder {folder} ({e.strerror})") from None
    st = folder.lstat()  # after making it: a folder someone else made meanwhile is checked like any other
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"{folder} is a symbolic link: the server's folder must be a real folder of your own "
            "(pgprefetch follows no link there); give --dir another folder"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{folder} is not a folder: give --dir a folder of your own")
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"{folder} belongs to {owner_name(st.st_uid)}, not to you ({owner_name(os.geteuid())}): pgprefetch "
            "never starts, joins or takes over a server in another user's folder; give --dir a folder of your own"
        )


def _data_owner() -> int:
    """The uid that owns a data folder pgprefetch made: the server's system user as root, else this user."""
    if os.geteuid() != 0:
        return os.geteuid()
    try:
        return pwd.getpwnam(SERVER_USER).pw_uid
    except KeyError:
        return -1  # not made yet: then no data folder can be one pgprefetch made


def check_data_folder(pgdata: Path) -> None:
    """Refuse an existing ``pgdata`` that is a link, not a folder, or not owned as pgprefetch leaves its own.

    Raises:
        ConfigError: names the folder, and its owner where that is the problem.
    """
    try:
        st = pgdata.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"{pgdata} is a symbolic link: the server's data folder must be a real folder that pgprefetch made; "
            "remove the link, or give --dir another folder"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{pgdata} is not a folder: remove it, or give --dir another folder")
    owner = _data_owner()
    if st.st_uid != owner:
        expected = SERVER_USER if os.geteuid() == 0 else "you"
        raise ConfigError(
            f"{pgdata} belongs to {owner_name(st.st_uid)}, not to {expected} ({owner_name(owner)}): pgprefetch "
            "never uses, joins or hands over a data folder it did not make; give --dir another folder"
        )


@contextmanager
def exclusive(place: Placement) -> Iterator[None]:
    """Hold :data:`DATA`'s lock while a moved server's data is made, started, stopped or removed.

    Nothing is held for data in ``--dir``: no other folder is swept there.
    """
    if place.moved is None:
        yield
        return
    with locked(root_folder(DATA, 0o711)):
        yield


def prepare(place: Placement) -> None:
    """Make the data folder if missing (0700; as root handed to the server's user); hold :func:`exclusive`.

    A moved server's folder sits in a folder of its own (``DATA/<key>``, 0711) beside the leftovers of
    dead runs, which go first. An existing data folder is checked (:func:`check_data_folder`), not changed.

    Raises:
        ConfigError: the data folder is a link or someone else's.
        PgprefetchError: the folders for it cannot be made, or are not root's alone.
    """
    pgdata = place.pgdata
    if place.moved is not None:
        base = root_folder(DATA, 0o711)
        sweep(base, keep=[pgdata.parent.name], in_use=_server_alive)
        root_folder(pgdata.parent, 0o711)
    try:
        os.mkdir(pgdata, 0o700)
    except FileExistsError:
        check_data_folder(pgdata)
        return
    except OSError as e:
        raise PgprefetchError(f"cannot make the server's data folder {pgdata} ({e.strerror})") from None
    fd = os.open(pgdata, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)  # the folder just made, whatever its path does
    try:
        os.fchmod(fd, 0o700)
        if os.geteuid() == 0:
            account = pwd.getpwnam(SERVER_USER)
            os.fchown(fd, account.pw_uid, account.pw_gid)
    finally:
        os.close(fd)


def _server_alive(entry: Path) -> bool:
    """Whether the pid in ``entry/pg/postmaster.pid`` is a live process (a zombie is not): a doubt that keeps it."""
    try:
        pid = int((entry / "pg" / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    return alive(pid)


def discard(place: Placement) -> None:
    """Remove a moved server's data (its whole ``DATA/<key>`` folder) once it is stopped; hold :func:`exclusive`."""
    if place.moved is not None:
        shutil.rmtree(place.pgdata.parent, ignore_errors=True)
