"""Lost connections, in one place: what counts as lost, why, and how long to wait before the next try.

A dump talks to PostgreSQL over several connections for minutes. Any of them can go away at any moment:
``pg_terminate_backend``, a server restart or failover, a proxy or NAT dropping the route. The dump
survives that by taking a new snapshot and resuming (see :func:`pgprefetch.write.pipeline.dump_epoch`); it must
not survive an error in the user's SQL or data, which would fail again on every try.

So every error of a database call is judged here, once (:mod:`pgprefetch.pg.session` calls :func:`lost` at
its boundary), by its type *and* by the state of the connection it came from. The second matters because
asyncpg reports a connection that died under a running operation in many ways, not all of them
connection errors: ``InternalClientError: cannot switch to state ...; another operation is in progress``
from a cursor, ``InterfaceError: connection is closed``, or an ``OSError`` from the socket. A server error
(SQLSTATE) on a connection that is still open is the user's to fix, and is never retried.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import asyncpg
from asyncpg.exceptions import _base as asyncpg_base

# Server-reported conditions that mean the session is gone, whatever the connection's state.
_GONE = (
    asyncpg.PostgresConnectionError,  # class 08: connection exceptions
    asyncpg.AdminShutdownError,  # pg_terminate_backend, a fast or smart shutdown
    asyncpg.CrashShutdownError,
    asyncpg.CannotConnectNowError,  # starting up or shutting down
)

CAUSES = ("terminated", "server unavailable", "stalled", "connection lost")
"""The causes a dump's retries are counted by: a backend ended by the server (``pg_terminate_backend``,
shutdown), a server that refused or could not be reached, a connection that stopped answering
(``[source] io_timeout``), and any other death of a connection (reset, closed, protocol broken)."""


class StalledError(TimeoutError):
    """A connection sent no answer within ``[source] io_timeout``; it has been terminated."""


def lost(e: BaseException, conn: asyncpg.Connection | None = None) -> bool:
    """True when ``e`` means the connection (or the server) went away, so a new connection may succeed.

    Args:
        e: the error a database call raised.
        conn: the connection it was made on, when there is one: its state decides the ambiguous cases.
    """
    if isinstance(e, (*_GONE, ConnectionError, TimeoutError)):
        return True
    closed = conn is not None and conn.is_closed()
    if isinstance(e, asyncpg.PostgresError):
        return closed  # an SQL or data error on a live connection is the user's to fix
    if isinstance(e, asyncpg_base.InternalClientError):
        return True  # asyncpg's protocol state is broken: the connection cannot be used again
    if isinstance(e, asyncpg.InterfaceError):
        return closed or "closed" in str(e) or "in progress" in str(e)
    if isinstance(e, OSError):
        return True  # the socket failed (reset, refused, no route, no socket file during a restart)
    return closed


def cause(e: BaseException) -> str:
    """Which of :data:`CAUSES` a lost connection is counted under."""
    if isinstance(e, asyncpg.AdminShutdownError | asyncpg.CrashShutdownError) or "administrator command" in str(e):
        return "terminated"  # asyncpg may wrap the server's FATAL in "connection was closed in the middle ..."
    if isinstance(e, StalledError):
        return "stalled"
    if isinstance(e, asyncpg.CannotConnectNowError | ConnectionRefusedError | FileNotFoundError):
        return "server unavailable"
    return "connection lost"


@dataclass(frozen=True)
class RetryPolicy:
    """How many lost connections one epoch survives, and the waits between tries (doubling, capped, jittered).

    The jitter (each wait is drawn between half and all of its step) keeps the dumps of many hosts, cut off
    by one restart, from all coming back in the same instant.
    """

    retries: int = 5
    first_wait: float = 0.5
    max_wait: float = 8.0

    def wait(self, attempt: int) -> float:
        """Seconds to wait before try ``attempt + 1`` (``attempt`` counts from 0)."""
        return min(self.max_wait, self.first_wait * 2.0**attempt) * random.uniform(0.5, 1.0)


def count(causes: dict[str, int], e: Any) -> dict[str, int]:
    """``causes`` with one more retry of ``e``'s cause (a SourceError carries it)."""
    name = getattr(e, "cause", None) or "connection lost"
    return {**causes, name: causes.get(name, 0) + 1}
