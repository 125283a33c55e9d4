"""The PostgreSQL side: connections, one exported snapshot, the keys cursor and the batch statement.

An epoch reads one consistent state of the database. The *exporter* connection opens a
``REPEATABLE READ READ ONLY`` transaction, exports its snapshot and streams the keys through a
server-side cursor; every *worker* connection opens the same kind of transaction and imports that
snapshot before its first query, so rows changed while the dump runs never reach the epoch, and user SQL
can never write (a data-modifying CTE fails in a read-only transaction). The statements themselves are
written in :mod:`pgprefetch.pg.statement`.

This module is the boundary to asyncpg: every database call goes through :func:`_call`, which bounds
it by ``[source] io_timeout`` and turns whatever it raises into one :class:`~pgprefetch.errors.SourceError`,
marked transient (with its cause) when :func:`pgprefetch.pg.retry.lost` says the connection went away.
Nothing above this module sees an asyncpg exception.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

import asyncpg
import numpy as np

from pgprefetch.config.model import Config, SourceConfig
from pgprefetch.errors import ConfigError, PgprefetchError, SampleError, SourceError
from pgprefetch.keys import INTEGER_TYPES, UUID_TYPE, KeyColumns
from pgprefetch.pg.redaction import redact, scrub
from pgprefetch.pg.retry import cause, lost
from pgprefetch.pg.statement import Fetched, distinct_text_statement, sample_text_statement

KEYS_PREFETCH = 50_000  # rows per cursor round trip (asyncpg's default is 50)
_SNAPSHOT_ID = re.compile(r"^[0-9A-F]+-[0-9A-F]+(-[0-9]+)?$")
T = TypeVar("T")


class _Watchdog:
    """Terminates a connection that has not answered for ``timeout_ms`` (0: never); :meth:`arm` restarts the wait.

    A watchdog rather than ``asyncio.wait_for``: cancelling an asyncpg call sends a cancel request over a
    new connection, which a stalled route would stall too. Terminating drops the socket, and the pending
    call fails at once with "connection closed".
    """

    def __init__(self, conn: asyncpg.Connection, timeout_ms: int) -> None:
        self.conn, self.timeout_ms, self.fired = conn, timeout_ms, False
        self._handle: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        if self.timeout_ms:
            self._handle = asyncio.get_running_loop().call_later(self.timeout_ms / 1000, self._fire)

    def _fire(self) -> None:
        self.fired = True
        self.conn.terminate()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()

    def error(self, what: str) -> SourceError:
        message = f"{what}: lost the connection: no answer for {self.timeout_ms / 1000:g} s ([source] io_timeout)"
        return SourceError(message, transient=True, cause="stalled")


async def _call(
    conn: asyncpg.Connection,
    call: Callable[[], Awaitable[T]],
    what: str,
    timeout_ms: int,
    watchdog: _Watchdog | None = None,
) -> T:
    """Make and await one database call on ``conn``, unanswered for at most ``timeout_ms``; failures SourceErrors.

    ``call`` is made inside the boundary because asyncpg checks a statement's or cursor's connection when
    the call is made, before there is anything to await: a dead connection raises there. ``watchdog`` is one
    the call re-arms itself whenever data arrives (a COPY); by default one wait.
    """
    dog = watchdog or _Watchdog(conn, timeout_ms)
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
        return SourceError(f"{what}: {_pg_message(e)} (see [source] statement_timeout)")
    if lost(e, conn):
        return SourceError(f"{what}: lost the connection: {_pg_message(e)}", transient=True, cause=cause(e))
    return SourceError(f"{what}: {_pg_message(e)}")


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
    try:
        timeout = (source.io_timeout_ms or 60_000) / 1000
        return await asyncpg.connect(source.dsn, server_settings=server_settings, timeout=timeout)
    except Exception as e:
        reason = scrub(str(e) or type(e).__name__, source.dsn).splitlines()[0]
        # A restarting server refuses, or has no socket yet: transient (retried only once a dump got going).
        error = SourceError(f"cannot connect to {redact(source.dsn)}: {reason}", transient=lost(e), cause=cause(e))
        # One that answers it is starting up or shutting down is there, and says to come back: the DSN is right,
        # so it is retried even before the dump got going (a cron run starting an epoch during a restart).
        error.connected = isinstance(e, asyncpg.CannotConnectNowError)  # type: ignore[attr-defined]
        raise error from None


@dataclass(frozen=True)
class Shape:
    """What the two queries return: key column names and the per-sample query's columns (type name, kind)."""

    keys: KeyColumns
    returned: dict[str, tuple[str, str]]


class Snapshot:
    """The exporter: a read-only transaction whose snapshot every worker imports."""

    def __init__(self, conn: asyncpg.Connection, snapshot_id: str, server_version: str, source: SourceConfig) -> None:
        self.conn = conn
        self.id = snapshot_id
        self.server_version = server_version
        self._timeout = source.io_timeout_ms
        self._keys: asyncpg.prepared_stmt.PreparedStatement | None = None

    @classmethod
    @asynccontextmanager
    async def open(cls, source: SourceConfig) -> AsyncIterator[Snapshot]:
        """Connect, begin ``REPEATABLE READ READ ONLY`` and export the snapshot."""
        conn = await connect(source)
        try:
            sql = "SELECT pg_export_snapshot(), current_setting('server_version')"
            begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
            await _call(conn, lambda: conn.execute(begin), "cannot begin the snapshot", source.io_timeout_ms)
            snapshot_id, version = await _call(
                conn, lambda: conn.fetchrow(sql), "cannot export the snapshot", source.io_timeout_ms
            )
            if not _SNAPSHOT_ID.match(snapshot_id):  # it is spliced into SET TRANSACTION SNAPSHOT
                raise SourceError(f"the server exported an unexpected snapshot id {snapshot_id!r}")
            yield cls(conn, snapshot_id, version, source)
        finally:
            # Read only: nothing to commit. Closing ends the transaction (and the snapshot); a connection
            # that is already gone (a terminated backend) must not hide the error that got us here.
            await close(conn, source.io_timeout_ms)

    async def describe(self, cfg: Config) -> Shape:
        """Check the keys and per-sample queries against the config, using the server's descriptions.

        Raises:
            ConfigError: SQL errors, non-integer key columns, a ``$n`` beyond the key columns, a field column
                the query does not return, or a column type pgprefetch cannot put in a tensor.
        """
        where = _where(cfg)
        stmt = await self._prepare(cfg.samples.keys, f"{where}[samples] keys")
        for a in stmt.get_attributes():
            if a.type.name not in (*INTEGER_TYPES, UUID_TYPE):
                raise ConfigError(
                    f'{where}[samples] keys: key column "{a.name}" is {a.type.name}; '
                    "keys must be integer (smallint, integer, bigint) or uuid columns"
                )
        attributes = stmt.get_attributes()
        keys = KeyColumns(tuple(a.name for a in attributes), tuple(a.type.name == UUID_TYPE for a in attributes))
        if cfg.samples.max_param > len(keys.names):
            raise ConfigError(
                f"{where}[samples] query: uses ${cfg.samples.max_param} but keys returns "
                f"{len(keys.names)} column(s) ({', '.join(keys.names)})"
            )
        if keys.has_uuid:  # the keys read as int8 slots: two per uuid, converted by the server
            aliases = [f"_pgpf_k{i}" for i in range(len(keys.names))]  # the query's own names may repeat
            slots = ", ".join(keys.slot_sql([f"_pgpf_q.{a}" for a in aliases]))
            # On lines of their own: the keys query may end in a -- comment.
            sql = f"SELECT {slots} FROM (\n{cfg.samples.keys}\n) AS _pgpf_q({', '.join(aliases)})"
            stmt = await self._prepare(sql, f"{where}[samples] keys")
        self._keys = stmt
        query = await self._prepare(cfg.samples.query, f"{where}[samples] query")
        returned = {a.name: (a.type.name, a.type.kind) for a in query.get_attributes()}
        return Shape(keys=keys, returned=returned)

    async def _prepare(self, sql: str, where: str) -> asyncpg.prepared_stmt.PreparedStatement:
        # A savepoint: a statement that fails to prepare must not abort the snapshot's transaction.
        await self._run(lambda: self.conn.execute("SAVEPOINT pgprefetch_describe"), where)
        try:
            stmt = await self._run(lambda: self.conn.prepare(sql), where)
        except SourceError as e:
            if e.transient:
                raise
            await self._run(lambda: self.conn.execute("ROLLBACK TO SAVEPOINT pgprefetch_describe"), where)
            raise ConfigError(str(e)) from None  # the user's SQL: a usage error
        await self._run(lambda: self.conn.execute("RELEASE SAVEPOINT pgprefetch_describe"), where)
        return stmt

    async def _run(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        return await _call(self.conn, call, what, self._timeout)

    async def distinct_text(self, cfg: Config, column: str) -> list[str]:
        """The distinct non-NULL values of ``column`` over every sample, as text, sorted by code point.

        For ``categories = "auto"``: computed in the epoch's snapshot over all keys (not the epoch's
        ``fraction``), and sorted here rather than by the server's collation, so that the same data gives
        the same codes in every epoch and on every server.
        """
        sql = distinct_text_statement(cfg.samples.keys, cfg.samples.query, cfg.samples.max_param, column)
        rows = await self._run(
            lambda: self.conn.fetch(sql, timeout=None), f"{_where(cfg)}categories of column {column}"
        )
        return sorted(r[0] for r in rows)

    async def describe_sql(self, sql: str, what: str) -> dict[str, tuple[str, str]]:
        """The columns ``sql`` returns, name -> (type name, kind), as the server describes them."""
        stmt = await self._prepare(sql, what)
        return {a.name: (a.type.name, a.type.kind) for a in stmt.get_attributes()}

    async def fetch(self, sql: str, what: str) -> list[asyncpg.Record]:
        """Run a small query in the snapshot (statistics, bounds)."""
        return await self._run(lambda: self.conn.fetch(sql), what)

    async def sample_text(self, cfg: Config, key: Sequence[object], column: str) -> list[str | None]:
        """The values of ``column`` the per-sample query returns for ``key`` (column values), as text."""
        sql = sample_text_statement(cfg.samples.query, column)
        rows = await self._run(lambda: self.conn.fetch(sql, *key[: cfg.samples.max_param]), "looking up a value")
        return [r[0] for r in rows]

    async def read_keys(self, cfg: Config, keys: KeyColumns) -> np.ndarray:
        """Stream the keys through a server-side cursor into a ``(n_slots, n)`` int64 array.

        Each cursor round trip is bounded by ``io_timeout`` on its own: a long key list is not a stall.
        """
        where = f"{_where(cfg)}[samples] keys"
        chunks: list[np.ndarray] = []
        k = keys.width
        assert self._keys is not None, "describe() prepares the keys statement first"
        cursor = await self._run(lambda: self._keys.cursor(), where)
        while records := await self._run(lambda: cursor.fetch(KEYS_PREFETCH), where):
            # chain() flattens the records in C: no per-row tuple or list, about 5x faster than np.array.
            try:
                flat = np.fromiter(itertools.chain.from_iterable(records), dtype=np.int64, count=len(records) * k)
            except TypeError:  # a None
                row, col = next((i, j) for i, r in enumerate(records) for j, v in enumerate(r) if v is None)
                raise SampleError(
                    f'keys query returned a NULL in key column "{keys.column_of_slot(col)}" '
                    f"(row {sum(c.shape[1] for c in chunks) + row + 1})"
                ) from None
            chunks.append(np.ascontiguousarray(flat.reshape(len(records), k).T))
        if not chunks:
            return np.empty((k, 0), dtype=np.int64)
        return np.concatenate(chunks, axis=1) if len(chunks) > 1 else chunks[0]


class BatchReader:
    """``connections`` worker connections on the exported snapshot, each with the batch statement prepared."""

    def __init__(
        self,
        workers: list[tuple[asyncpg.Connection, asyncpg.prepared_stmt.PreparedStatement]],
        params: Sequence[object],
        timeout_ms: int,
        row_wise: bool = False,
    ) -> None:
        self._params = tuple(params)
        self._row_wise = row_wise
        self._timeout = timeout_ms
        self._idle: asyncio.Queue[tuple[asyncpg.Connection, asyncpg.prepared_stmt.PreparedStatement]] = asyncio.Queue()
        for w in workers:
            self._idle.put_nowait(w)
        self.size = len(workers)

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        source: SourceConfig,
        snapshot_id: str,
        sql: str | None,
        params: Sequence[object] = (),
        *,
        row_wise: bool = False,
    ) -> AsyncIterator[BatchReader]:
        """Open the workers concurrently; each begins its transaction and imports ``snapshot_id``.

        ``sql`` is the batch statement each prepares (None for workers that only COPY); ``params`` follow
        the key arrays as its bind parameters (the category lists). ``row_wise``: it returns a row per
        sample (:func:`pgprefetch.pg.statement.row_wise`), not one row.
        """
        if not _SNAPSHOT_ID.match(snapshot_id):
            raise SourceError(f"refusing an invalid snapshot id {snapshot_id!r}")
        conns: list[asyncpg.Connection] = []
        timeout = source.io_timeout_ms

        async def start() -> tuple[asyncpg.Connection, asyncpg.prepared_stmt.PreparedStatement]:
            # Parallel plans would only compete with our own connections for the same cores.
            conn = await connect(source, max_parallel_workers_per_gather="0")
            conns.append(conn)
            begin = f"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot_id}'"
            try:
                await _call(conn, lambda: conn.execute(begin), "cannot import the snapshot", timeout)
            except SourceError as e:
                # Also when the exporter died and took the snapshot with it: a retry takes a new one.
                raise SourceError(str(e), transient=True, cause=e.cause or "connection lost") from None
            if sql is None:
                return conn, None
            return conn, await _call(conn, lambda: conn.prepare(sql), "cannot prepare the batch statement", timeout)

        tasks = [asyncio.ensure_future(start()) for _ in range(source.connections)]
        try:
            try:
                workers = await asyncio.gather(*tasks)
            except BaseException:  # one failed: stop the others before closing what they opened
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
            yield cls(list(workers), params, timeout, row_wise)
        finally:
            await asyncio.gather(*(close(c, timeout) for c in conns))

    async def copy(self, what: str, sql: str, sink: Callable[[bytes], Awaitable[None]]) -> None:
        """Run ``COPY (sql) TO STDOUT (FORMAT binary)`` on an idle worker, handing each chunk to ``sink``.

        The server waits while ``sink`` runs, so it may decode on a thread while the other workers' COPYs
        stream. ``io_timeout`` bounds the wait for each chunk, not the whole COPY: a long scan is not a stall.
        """
        conn, _ = await self._idle.get()
        dog = _Watchdog(conn, self._timeout)

        async def output(data: bytes) -> None:
            dog.cancel()
            await sink(data)
            dog.arm()

        try:
            await _call(
                conn, lambda: conn.copy_from_query(sql, output=output, format="binary"), what, self._timeout, dog
            )
        finally:
            self._idle.put_nowait((conn, _))

    async def fetch(self, batch: int, keys: np.ndarray, count: int = 1) -> Fetched:
        """Run the batch statement for ``keys`` (shape ``(n_key_columns, n)``) on an idle worker.

        ``keys`` may hold ``count`` consecutive batches from ``batch`` on: small batches travel together.
        Returns the statement's row; a row-wise statement's rows transposed into columns.
        """
        conn, stmt = await self._idle.get()
        what = f"batch {batch}" if count == 1 else f"batches {batch}-{batch + count - 1}"
        args = (*(column.tolist() for column in keys), *self._params)
        try:
            if self._row_wise:
                rows = await _call(conn, lambda: stmt.fetch(*args), what, self._timeout)
                return tuple(zip(*rows, strict=True))
            row = await _call(conn, lambda: stmt.fetchrow(*args), what, self._timeout)
        finally:
            self._idle.put_nowait((conn, stmt))
        return tuple(row)


def _pg_message(e: BaseException) -> str:
    """The server's message on one line (asyncpg's str() adds DETAIL/HINT on further lines)."""
    message = getattr(e, "message", None) or (str(e).splitlines() or [type(e).__name__])[0]
    return str(message).replace("\n", " ")


def _where(cfg: Config) -> str:
    return f"{cfg.file}: " if cfg.file else ""
