"""The PostgreSQL side: connections, one exported snapshot, the keys cursor and the batch statement.

An epoch reads one consistent state of the database. The *exporter* connection opens a
``REPEATABLE READ READ ONLY`` transaction, exports its snapshot and streams the keys through a
server-side cursor; every *worker* connection opens the same kind of transaction and imports that
snapshot before its first query, so rows changed while the dump runs never reach the epoch, and user SQL
can never write (a data-modifying CTE fails in a read-only transaction). The statements themselves are
written in :mod:`pgprefetch.pg.statement`.

Every database call goes through :func:`pgprefetch.pg.calls.bounded_call`, the boundary to asyncpg: bounded by
``[source] io_timeout``, its failures mapped to one :class:`~pgprefetch.errors.SourceError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial

import asyncpg
import numpy as np

from pgprefetch.config.model import Config, SourceConfig
from pgprefetch.errors import ConfigError, SampleError, SourceError
from pgprefetch.keys import INTEGER_TYPES, TIME_TYPES, UUID_TYPE, KeyColumns
from pgprefetch.pg.calls import T, Watchdog, bounded_call, close, connect
from pgprefetch.pg.plans import IndexAdvice, index_advice
from pgprefetch.pg.statement import VOCABULARY_SETTING, Fetched, sample_text_statement
from pgprefetch.sqltext import find_params, quote_ident

KEYS_PREFETCH = 50_000  # rows per cursor round trip (asyncpg's default is 50)
_SNAPSHOT_ID = re.compile(r"^[0-9A-F]+-[0-9A-F]+(-[0-9]+)?$")


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
            await bounded_call(conn, lambda: conn.execute(begin), "cannot begin the snapshot", source.io_timeout_ms)
            exported = await bounded_call(
                conn, lambda: conn.fetchrow(sql), "cannot export the snapshot", source.io_timeout_ms
            )
            assert exported is not None  # a SELECT of two values without FROM: one row
            snapshot_id, version = exported
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
        stmt = await self._prepare(cfg.query_samples.keys, f"{where}[samples] keys")
        for a in stmt.get_attributes():
            if a.type.name not in (*INTEGER_TYPES, UUID_TYPE, *TIME_TYPES):
                raise ConfigError(
                    f'{where}[samples] keys: key column "{a.name}" is {a.type.name}; '
                    "keys must be integer (smallint, integer, bigint), uuid, date, timestamp or timestamptz columns"
                )
        attributes = stmt.get_attributes()
        keys = KeyColumns.of_types([a.name for a in attributes], [a.type.name for a in attributes])
        if cfg.query_samples.max_param > len(keys.names):
            raise ConfigError(
                f"{where}[samples] query: uses ${cfg.query_samples.max_param} but keys returns "
                f"{len(keys.names)} column(s) ({', '.join(keys.names)})"
            )
        used = find_params(cfg.query_samples.query)
        unused = [i for i in range(1, cfg.query_samples.max_param) if i not in used]
        if unused:  # PostgreSQL would say "could not determine data type of parameter $1"
            i = unused[0]
            raise ConfigError(
                f"{where}[samples] query: the query does not use ${i} (key column {keys.names[i - 1]}); "
                f"use ${i} in the query, or drop {keys.names[i - 1]} from [samples] keys and renumber the $n after it"
            )
        if keys.converted:  # the keys read as int8 slots (two per uuid, days or µs for times), converted by the server
            aliases = [f"_pgpf_k{i}" for i in range(len(keys.names))]  # the query's own names may repeat
            slots = ", ".join(keys.slot_sql([f"_pgpf_q.{a}" for a in aliases]))
            # On lines of their own: the keys query may end in a -- comment.
            sql = f"SELECT {slots} FROM (\n{cfg.query_samples.keys}\n) AS _pgpf_q({', '.join(aliases)})"
            stmt = await self._prepare(sql, f"{where}[samples] keys")
        self._keys = stmt
        query = await self._prepare(cfg.query_samples.query, f"{where}[samples] query")
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
        return await bounded_call(self.conn, call, what, self._timeout)

    async def distinct_values(self, sql: str, what: str) -> tuple[dict[int, set[str]], int]:
        """Run a :func:`~pgprefetch.pg.statement.distinct_values_statement`: each column's values, and the rows read.

        Sorting is the caller's (by code point, not by the server's collation), so that the same data gives
        the same codes in every epoch and on every server.
        """
        rows = await self._run(lambda: self.conn.fetch(sql, timeout=None), what)
        values: dict[int, set[str]] = {}
        read = 0
        for i, value, count in rows:
            if value is not None:
                values.setdefault(i, set()).add(value)
            if i == 0:
                read += count
        return values, read

    async def describe_sql(self, sql: str, what: str) -> dict[str, tuple[str, str]]:
        """The columns ``sql`` returns, name -> (type name, kind), as the server describes them."""
        stmt = await self._prepare(sql, what)
        return {a.name: (a.type.name, a.type.kind) for a in stmt.get_attributes()}

    async def fetch(self, sql: str, what: str, *args: object) -> list[asyncpg.Record]:
        """Run a small query in the snapshot (statistics, bounds), ``args`` its bind parameters."""
        return await self._run(lambda: self.conn.fetch(sql, *args), what)

    async def index_advice(self, sql: str, args: Sequence[object]) -> list[IndexAdvice]:
        """The tables ``sql`` would read whole per sample or per batch, from the server's plan of it for ``args``.

        ``EXPLAIN`` plans the statement and runs nothing (:mod:`pgprefetch.pg.plans` reads the plan).
        """
        text = await self._run(
            lambda: self.conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args), "planning the batch statement"
        )
        return [await self._existing_index(a) for a in index_advice(json.loads(text))]

    async def _existing_index(self, advice: IndexAdvice) -> IndexAdvice:
        """``advice`` with the name of an index its table has on its first column, where one exists.

        The planner may rightly prefer a scan (a small table), but where the scan costs and an index that
        serves the WHERE exists, advising that index again would be wrong: its statistics are what is off.
        """
        if not advice.columns or not advice.regclass:
            return advice
        rows = await self._run(
            lambda: self.conn.fetch(_INDEXES, advice.regclass), f"looking up the indexes of {advice.relation}"
        )
        first = advice.columns[0]
        for name, leading in rows:
            if first in (leading, quote_ident(leading)):
                return dataclasses.replace(advice, index=name)
        return advice

    async def sample_text(self, cfg: Config, key: Sequence[object], column: str) -> list[str | None]:
        """The values of ``column`` the per-sample query returns for ``key`` (column values), as text."""
        sql = sample_text_statement(cfg.query_samples.query, column)
        rows = await self._run(lambda: self.conn.fetch(sql, *key[: cfg.query_samples.max_param]), "looking up a value")
        return [r[0] for r in rows]

    async def read_keys(self, cfg: Config, keys: KeyColumns) -> np.ndarray:
        """All the keys (:meth:`key_chunks`) in one ``(n_slots, n)`` int64 array."""
        chunks = [chunk async for chunk in self.key_chunks(cfg, keys)]
        if not chunks:
            return np.empty((keys.width, 0), dtype=np.int64)
        return np.concatenate(chunks, axis=1) if len(chunks) > 1 else chunks[0]

    async def key_chunks(self, cfg: Config, keys: KeyColumns) -> AsyncGenerator[np.ndarray, None]:
        """Stream the keys through a server-side cursor, a ``(n_slots, m)`` int64 array per round trip.

        A chunk at a time, so that the caller decides what to hold (keys beyond ``[source] memory`` go to
        disk). Each cursor round trip is bounded by ``io_timeout`` on its own: a long key list is not a stall.
        """
        statement = self._keys
        assert statement is not None, "describe() prepares the keys statement first"
        async for chunk in self._slot_chunks(statement, keys, f"{_where(cfg)}[samples] keys"):
            yield chunk

    async def slot_chunks(self, sql: str, keys: KeyColumns, what: str) -> AsyncGenerator[np.ndarray, None]:
        """:meth:`key_chunks` of another statement returning key slots (a scan table's keys, for a sweep)."""
        statement = await self._prepare(sql, what)
        async for chunk in self._slot_chunks(statement, keys, what):
            yield chunk

    async def _slot_chunks(
        self, statement: asyncpg.prepared_stmt.PreparedStatement, keys: KeyColumns, where: str
    ) -> AsyncGenerator[np.ndarray, None]:
        k = keys.width
        seen = 0
        cursor = await self._run(lambda: statement.cursor(), where)
        while records := await self._run(lambda: cursor.fetch(KEYS_PREFETCH), where):
            # chain() flattens the records in C: no per-row tuple or list, about 5x faster than np.array.
            try:
                flat = np.fromiter(itertools.chain.from_iterable(records), dtype=np.int64, count=len(records) * k)
            except TypeError:  # a None
                row, col = next((i, j) for i, r in enumerate(records) for j, v in enumerate(r) if v is None)
                raise SampleError(
                    f'keys query returned a NULL in key column "{keys.column_of_slot(col)}" (row {seen + row + 1})'
                ) from None
            seen += len(records)
            del records
            yield np.ascontiguousarray(flat.reshape(-1, k).T)


Worker = tuple[asyncpg.Connection, asyncpg.prepared_stmt.PreparedStatement | None]
"""A worker's connection, and its batch statement (None for workers that only COPY)."""


class BatchReader:
    """``connections`` worker connections on the exported snapshot, each with the batch statement prepared."""

    def __init__(
        self,
        workers: list[Worker],
        params: Sequence[object],
        timeout_ms: int,
        row_wise: bool = False,
    ) -> None:
        self._params = tuple(params)
        self._row_wise = row_wise
        self._timeout = timeout_ms
        self._idle: asyncio.Queue[Worker] = asyncio.Queue()
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
        vocabularies: Sequence[Sequence[str]] = (),
    ) -> AsyncIterator[BatchReader]:
        """Open the workers concurrently; each begins its transaction and imports ``snapshot_id``.

        ``sql`` is the batch statement each prepares (None for workers that only COPY); ``params`` follow
        the key arrays as its bind parameters (the category lists). ``row_wise``: it returns a row per
        sample (:func:`pgprefetch.pg.statement.row_wise`), not one row. ``vocabularies``: the category
        lists a COPY codes against (which cannot take bind parameters), bound into each worker's transaction
        as settings that :func:`pgprefetch.pg.statement.vocabulary_sql` reads: values never become SQL text.
        """
        if not _SNAPSHOT_ID.match(snapshot_id):
            raise SourceError(f"refusing an invalid snapshot id {snapshot_id!r}")
        conns: list[asyncpg.Connection] = []
        timeout = source.io_timeout_ms

        async def start() -> Worker:
            # Parallel plans would only compete with our own connections for the same cores.
            conn = await connect(source, max_parallel_workers_per_gather="0")
            conns.append(conn)
            begin = f"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot_id}'"
            try:
                await bounded_call(conn, lambda: conn.execute(begin), "cannot import the snapshot", timeout)
            except SourceError as e:
                # Also when the exporter died and took the snapshot with it: a retry takes a new one.
                raise SourceError(str(e), transient=True, cause=e.cause or "connection lost") from None
            for i, values in enumerate(vocabularies):
                bound = (VOCABULARY_SETTING.format(i), list(values))
                await bounded_call(
                    conn,
                    partial(conn.execute, "SELECT set_config($1, $2::text[]::text, true)", *bound),
                    "cannot set the category lists",
                    timeout,
                )
            if sql is None:
                return conn, None
            return conn, await bounded_call(
                conn, lambda: conn.prepare(sql), "cannot prepare the batch statement", timeout
            )

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
        dog = Watchdog(conn, self._timeout)

        async def output(data: bytes) -> None:
            dog.cancel()
            await sink(data)
            dog.arm()

        try:
            await bounded_call(
                conn, lambda: conn.copy_from_query(sql, output=output, format="binary"), what, self._timeout, dog
            )
        except BaseException:
            # A COPY given up midway (its sink raised, a sibling failed) still streams: the connection cannot
            # serve another call, and closing it politely would wait out io_timeout for the stream's end.
            # It goes back to the pool all the same, so that no caller waits for a worker forever: a call on
            # it fails at once with "connection is closed", which pg.retry takes for a lost connection.
            conn.terminate()
            raise
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
            assert stmt is not None, "workers opened without a batch statement only COPY"
            if self._row_wise:
                rows = await bounded_call(conn, lambda: stmt.fetch(*args), what, self._timeout)
                return tuple(zip(*rows, strict=True))
            row = await bounded_call(conn, lambda: stmt.fetchrow(*args), what, self._timeout)
        finally:
            self._idle.put_nowait((conn, stmt))
        assert row is not None  # the batch statement aggregates its samples: one row
        return tuple(row)


# Each index of a table (to_regclass: NULL, no rows, for a name that does not resolve) and its first column.
_INDEXES = """SELECT i.indexrelid::regclass::text, a.attname::text
FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
WHERE i.indrelid = to_regclass($1) AND i.indisvalid ORDER BY 1"""


def _where(cfg: Config) -> str:
    return f"{cfg.file}: " if cfg.file else ""
