"""The boundary to asyncpg: every database call is made here, bounded in time, its failures mapped once.

:func:`bounded_call` bounds a call by ``[source] io_timeout`` (a watchdog that terminates a connection that stops
answering: a frozen route otherwise hangs until TCP keepalives, hours later) and turns whatever asyncpg
raises into one :class:`~pgprefetch.errors.SourceError`, marked transient (with its cause) when
:func:`pgprefetch.pg.retry.lost` says the connection went away. Nothing above :mod:`pgprefetch.pg`
sees an asyncpg exception.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from pgprefetch.config.model import SourceConfig
from pgprefetch.errors import PgprefetchError, SourceError
from pgprefetch.pg.reasons import UNPARSABLE, connect_reason, unencoded_at
from pgprefetch.pg.redaction import redact
from pgprefetch.pg.retry import cause, lost

T = TypeVar("T")


class Watchdog:
    """Terminates a connection that has not answered for ``timeout_ms`` (0: never); :meth:`arm` restarts the wait.

    A watchdog rather than ``asyncio.wait_for``: cancelling an asyncpg call sends a cancel request over a
    new connection, which a stalled route would stall too. Terminating drops the socket, and the pending
    call fails at once with "connection closed".
    """

    def __init__(self, conn: asyncpg.Connection, timeout_ms: int) -> None:
        self.conn, self.timeout_ms, self.fired = conn, timeout_ms, False
        self._handle: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        """Start (or restart) the wait: data arrived, or a call is made."""
        if self._handle is not None:
            self._handle.cancel()
        if self.timeout_ms:
            self._handle = asyncio.get_running_loop().call_later(self.timeout_ms / 1000, self._fire)

    def _fire(self) -> None:
        self.fired = True
        self.conn.terminate()

    def cancel(self) -> None:
        """Stop waiting: the call answered."""
        if self._handle is not None:
            self._handle.cancel()

    def error(self, what: str) -> SourceError:
        """The error of a call whose connection this watchdog terminated (transient: retried)."""
        message = f"{what}: lost the connection: no answer for {self.timeout_ms / 1000:g} s ([source] io_timeout)"
        return SourceError(message, transient=True, cause="stalled")


async def bounded_call(
    conn: asyncpg.Connection,
    call: Callable[[], Awaitable[T]],
    what: str,
    timeout_ms: int,
    watchdog: Watchdog | None = None,
) -> T:
    """Make and await one database call on ``conn``, unanswered for at most ``timeout_ms``; failures SourceErrors.

    ``call`` is made inside the boundary because asyncpg checks a statement's or cursor's connection when
    the call is made, before there is anything to await: a dead connection raises there. ``watchdog`` is one
    the call re-arms itself whenever data arrives (a COPY); by default one wait.
    """
    dog = watchdog or Watchdog(conn, timeout_ms)
    dog.arm()
    try:
        return await call()
    except PgprefetchError:
        raise
    except Exception as e:
        if dog.fired:
            raise dog.error(what) from None
        raise translate(e, what, conn) from None
    finally:
        dog.cancel()


def translate(e: BaseException, what: str, conn: asyncpg.Connection | None = None) -> SourceError:
    """The one-line SourceError for a database call's failure, transient when the connection was lost."""
    if isinstance(e, asyncpg.QueryCanceledError) and not lost(e, conn):
        return SourceError(f"{what}: {pg_message(e)} (see [source] statement_timeout)")
    if lost(e, conn):
        return SourceError(f"{what}: lost the connection: {pg_message(e)}", transient=True, cause=cause(e))
    return SourceError(f"{what}: {pg_message(e)}")


async def close(conn: asyncpg.Connection, timeout_ms: int) -> None:
    """Close ``conn`` politely if it still answers, or drop it; never raise, never hang."""
    if conn.is_closed():
        return
    try:
        await asyncio.wait_for(conn.close(), (timeout_ms or 60_000) / 1000)
    except Exception:  # a broken or stalled connection: drop the socket
        conn.terminate()


async def connect(source: SourceConfig, **settings: str) -> asyncpg.Connection:
    """Open one connection with pgprefetch's session settings, or raise a one-line SourceError."""
    # A server-wide idle_in_transaction_session_timeout would kill the exporter while the client shuffles.
    server_settings = {"application_name": "pgprefetch", "idle_in_transaction_session_timeout": "0", **settings}
    if source.statement_timeout_ms is not None:
        server_settings["statement_timeout"] = str(source.statement_timeout_ms)
    # Pinned on every connection, over a role's, a database's or the DSN's own setting: with it off, a
    # backslash in a string literal escapes the quote after it, and SQL text pgprefetch writes (identifiers,
    # the snapshot id) must mean one thing. Values never become SQL text anyway (see scan.shape).
    server_settings["standard_conforming_strings"] = "on"
    if unencoded_at(source.dsn):
        raise SourceError(f"cannot connect to {redact(source.dsn)}: {UNPARSABLE}")
    try:
        timeout = (source.io_timeout_ms or 60_000) / 1000
        conn = await asyncpg.connect(source.dsn, server_settings=server_settings, timeout=timeout)
    except Exception as e:
        reason = connect_reason(e, source.dsn)
        # A restarting server refuses, or has no socket yet: transient (retried only once a dump got going).
        error = SourceError(f"cannot connect to {redact(source.dsn)}: {reason}", transient=lost(e), cause=cause(e))
        # One that answers it is starting up or shutting down is there, and says to come back: the DSN is right,
        # so it is retried even before the dump got going (a cron run starting an epoch during a restart).
        error.connected = isinstance(e, asyncpg.CannotConnectNowError)
        raise error from None
    _require_standard_strings(conn, source)
    return conn


def _require_standard_strings(conn: asyncpg.Connection, source: SourceConfig) -> None:
    """Refuse a server (or a pooler in front of one) that did not take ``standard_conforming_strings = on``.

    The server reports the setting's value as the session starts (a ``ParameterStatus``); anything but
    ``on`` means string literals would be read with backslash escapes, and pgprefetch does not talk to it.
    """
    value = getattr(conn.get_settings(), "standard_conforming_strings", None)
    if value != "on":
        conn.terminate()
        raise SourceError(
            f"{redact(source.dsn)}: the server did not take standard_conforming_strings = on (it says "
            f"{value or 'nothing'}); pgprefetch needs it on every connection (a pooler that drops startup "
            "settings is not supported)"
        )


def pg_message(e: BaseException) -> str:
    """The server's message on one line (asyncpg's str() adds DETAIL/HINT on further lines)."""
    message = getattr(e, "message", None) or (str(e).splitlines() or [type(e).__name__])[0]
    return str(message).replace("\n", " ")
