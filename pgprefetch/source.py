"""The PostgreSQL side: connections, one exported snapshot, the keys cursor and the batch statement.

An epoch reads one consistent state of the database. The *exporter* connection opens a
``REPEATABLE READ READ ONLY`` transaction, exports its snapshot and streams the keys through a
server-side cursor; every *worker* connection opens the same kind of transaction and imports that
snapshot before its first query, so rows changed while the dump runs never reach the epoch, and user SQL
can never write (a data-modifying CTE fails in a read-only transaction).

Each batch is one prepared statement: the batch's key columns travel as ``int8[]`` bind parameters,
``unnest(...) WITH ORDINALITY`` turns them back into samples, and the user's per-sample query runs
``LATERAL`` for each. The statement returns one row holding every result column as binary arrays
(``array_send(array_agg(col))`` per sample, concatenated), which :mod:`pgprefetch.collate` views with
numpy. Bind parameters keep the statement text constant (prepared once per connection, no injection).
``COPY ... TO STDOUT`` is what this replaces: COPY cannot take bind parameters, so it would need the keys
pasted into its text.
"""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from urllib.parse import unquote

import asyncpg
import numpy as np

from .collate import Column
from .config import Config, SourceConfig
from .errors import ConfigError, SampleError, SourceError
from .sqltext import replace_params

KEY_TYPES = ("int2", "int4", "int8")
KEYS_PREFETCH = 50_000  # rows per cursor round trip (asyncpg's default is 50)
_SNAPSHOT_ID = re.compile(r"^[0-9A-F]+-[0-9A-F]+(-[0-9]+)?$")
_K = "_pgpf_k"  # aliases unlikely to collide with names in the user's query
_Q = "_pgpf_q"
_U = "_pgpf_u"


def _password(dsn: str) -> str | None:
    """The password in a DSN, found without a URL parser (which gives up on an unencoded ``/`` or ``#``)."""
    if "://" in dsn:
        rest = dsn.split("://", 1)[1]
        userinfo = rest[: rest.rfind("@")] if "@" in rest else ""
        if ":" in userinfo and userinfo.split(":", 1)[1]:
            return userinfo.split(":", 1)[1]
    m = re.search(r"(?i)password\s*=\s*('([^']*)'|[^&\s]+)", dsn)
    return (m[2] if m[2] is not None else m[1]) if m else None


def redact(dsn: str | None) -> str:
    """The DSN as it may be shown: every form of its password replaced by ``***``."""
    if not dsn:
        return "the server from the PG* environment"
    if "://" in dsn:
        scheme, rest = dsn.split("://", 1)
        at = rest.rfind("@")
        if at >= 0 and ":" in rest[:at] and rest[:at].split(":", 1)[1]:
            rest = f"{rest[:at].split(':', 1)[0]}:***{rest[at:]}"
        dsn = f"{scheme}://{rest}"
    return re.sub(r"(?i)(password\s*=\s*)('[^']*'|[^&\s]+)", r"\1***", dsn)


def scrub(text: str, dsn: str | None) -> str:
    """``text`` with the DSN's password, as typed or percent-decoded, replaced by ``***``."""
    password = _password(dsn) if dsn else None
    if not password:
        return text
    for form in sorted({password, unquote(password)}, key=len, reverse=True):
        text = text.replace(form, "***")
    return text


def lost(e: BaseException) -> bool:
    """True for errors meaning the connection or the server went away, which a retry may survive."""
    return isinstance(
        e,
        asyncpg.PostgresConnectionError  # class 08: connection exceptions
        | asyncpg.AdminShutdownError  # pg_terminate_backend, a fast or smart shutdown
        | asyncpg.CrashShutdownError
        | asyncpg.CannotConnectNowError  # starting up or shutting down
        | ConnectionError
        | TimeoutError,
    ) or (isinstance(e, asyncpg.InterfaceError) and "closed" in str(e))  # "connection is closed"


def quote_ident(name: str) -> str:
    """A SQL identifier, quoted so that any column name is taken literally."""
    return '"' + name.replace('"', '""') + '"'


async def connect(source: SourceConfig, **settings: str) -> asyncpg.Connection:
    """Open one connection with pgprefetch's session settings, or raise a one-line SourceError."""
    # A server-wide idle_in_transaction_session_timeout would kill the exporter while the client shuffles.
    server_settings = {"application_name": "pgprefetch", "idle_in_transaction_session_timeout": "0", **settings}
    if source.statement_timeout_ms is not None:
        server_settings["statement_timeout"] = str(source.statement_timeout_ms)
    try:
        return await asyncpg.connect(source.dsn, server_settings=server_settings, timeout=30)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError, ValueError) as e:
        reason = scrub(str(e) or type(e).__name__, source.dsn).splitlines()[0]
        # A restarting server refuses, or has no socket yet: transient (retried only once a dump got going).
        transient = lost(e) or isinstance(e, OSError)
        raise SourceError(f"cannot connect to {redact(source.dsn)}: {reason}", transient=transient) from None


@dataclass(frozen=True)
class Shape:
    """What the two queries return: key column names and the per-sample query's columns (type name, kind)."""

    key_names: tuple[str, ...]
    returned: dict[str, tuple[str, str]]


class Snapshot:
    """The exporter: a read-only transaction whose snapshot every worker imports."""

    def __init__(self, conn: asyncpg.Connection, snapshot_id: str, server_version: str) -> None:
        self.conn = conn
        self.id = snapshot_id
        self.server_version = server_version
        self._keys: asyncpg.prepared_stmt.PreparedStatement | None = None

    @classmethod
    @asynccontextmanager
    async def open(cls, source: SourceConfig) -> AsyncIterator[Snapshot]:
        """Connect, begin ``REPEATABLE READ READ ONLY`` and export the snapshot."""
        conn = await connect(source)
        try:
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            snapshot_id, version = await conn.fetchrow("SELECT pg_export_snapshot(), current_setting('server_version')")
            if not _SNAPSHOT_ID.match(snapshot_id):  # it is spliced into SET TRANSACTION SNAPSHOT
                raise SourceError(f"the server exported an unexpected snapshot id {snapshot_id!r}")
            yield cls(conn, snapshot_id, version)
        finally:
            # Read only: nothing to commit. Closing ends the transaction (and the snapshot); a connection
            # that is already gone (a terminated backend) must not hide the error that got us here.
            with suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                await conn.close()

    async def describe(self, cfg: Config) -> Shape:
        """Check the keys and per-sample queries against the config, using the server's descriptions.

        Raises:
            ConfigError: SQL errors, non-integer key columns, a ``$n`` beyond the key columns, a field column
                the query does not return, or a column type pgprefetch cannot put in a tensor.
        """
        where = _where(cfg)
        keys = self._keys = await self._prepare(cfg.samples.keys, f"{where}[samples] keys")
        key_names = tuple(a.name for a in keys.get_attributes())
        for a in keys.get_attributes():
            if a.type.name not in KEY_TYPES:
                raise ConfigError(
                    f'{where}[samples] keys: key column "{a.name}" is {a.type.name}; '
                    "keys must be integer columns (smallint, integer, bigint)"
                )
        if cfg.samples.max_param > len(key_names):
            raise ConfigError(
                f"{where}[samples] query: uses ${cfg.samples.max_param} but keys returns "
                f"{len(key_names)} column(s) ({', '.join(key_names)})"
            )
        query = await self._prepare(cfg.samples.query, f"{where}[samples] query")
        returned = {a.name: (a.type.name, a.type.kind) for a in query.get_attributes()}
        return Shape(key_names=key_names, returned=returned)

    async def _prepare(self, sql: str, where: str) -> asyncpg.prepared_stmt.PreparedStatement:
        # A savepoint: a statement that fails to prepare must not abort the snapshot's transaction.
        await self.conn.execute("SAVEPOINT pgprefetch_describe")
        try:
            stmt = await self.conn.prepare(sql)
        except asyncpg.PostgresError as e:
            with suppress(asyncpg.PostgresError, asyncpg.InterfaceError, OSError):
                await self.conn.execute("ROLLBACK TO SAVEPOINT pgprefetch_describe")
            if lost(e):
                raise SourceError(f"{where}: {_pg_message(e)}", transient=True) from None
            raise ConfigError(f"{where}: {_pg_message(e)}") from None
        await self.conn.execute("RELEASE SAVEPOINT pgprefetch_describe")
        return stmt

    async def distinct_text(self, cfg: Config, column: str) -> list[str]:
        """The distinct non-NULL values of ``column`` over every sample, as text, sorted by code point.

        For ``categories = "auto"``: computed in the epoch's snapshot over all keys (not the epoch's
        ``fraction``), and sorted here rather than by the server's collation, so that the same data gives
        the same codes in every epoch and on every server.
        """
        n = cfg.samples.max_param
        names = ", ".join(f"k{i}" for i in range(1, n + 1))
        keys = f"({cfg.samples.keys}) AS {_K}({names})" if n else f"({cfg.samples.keys}) AS {_K}"
        ref = f"{_Q}.{quote_ident(column)}"
        sql = (
            f"SELECT DISTINCT {ref}::text FROM {keys}\nCROSS JOIN LATERAL (\n"
            f"{replace_params(cfg.samples.query, lambda i: f'{_K}.k{i}')}\n) AS {_Q} WHERE {ref} IS NOT NULL"
        )
        try:
            return sorted(r[0] for r in await self.conn.fetch(sql))
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as e:
            where = f"{_where(cfg)}categories of column {column}"
            raise SourceError(f"{where}: {_pg_message(e)}", transient=lost(e)) from None

    async def sample_text(self, cfg: Config, key: Sequence[int], column: str) -> list[str | None]:
        """The values of ``column`` the per-sample query returns for ``key``, as text (error messages)."""
        sql = f"SELECT {_Q}.{quote_ident(column)}::text FROM ({cfg.samples.query}) AS {_Q}"
        return [r[0] for r in await self.conn.fetch(sql, *key[: cfg.samples.max_param])]

    async def read_keys(self, cfg: Config, key_names: Sequence[str]) -> np.ndarray:
        """Stream the keys through a server-side cursor into a ``(n_key_columns, n)`` int64 array."""
        try:
            return await self._read_keys(key_names)
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as e:
            raise SourceError(f"{_where(cfg)}[samples] keys: {_pg_message(e)}", transient=lost(e)) from None

    async def _read_keys(self, key_names: Sequence[str]) -> np.ndarray:
        chunks: list[np.ndarray] = []
        k = len(key_names)
        assert self._keys is not None, "describe() prepares the keys statement first"
        cursor = await self._keys.cursor()
        while records := await cursor.fetch(KEYS_PREFETCH):
            # chain() flattens the records in C: no per-row tuple or list, about 5x faster than np.array.
            try:
                flat = np.fromiter(itertools.chain.from_iterable(records), dtype=np.int64, count=len(records) * k)
            except TypeError:  # a None
                row, col = next((i, j) for i, r in enumerate(records) for j, v in enumerate(r) if v is None)
                raise SampleError(
                    f'keys query returned a NULL in key column "{key_names[col]}" '
                    f"(row {sum(c.shape[1] for c in chunks) + row + 1})"
                ) from None
            chunks.append(np.ascontiguousarray(flat.reshape(len(records), k).T))
        if not chunks:
            return np.empty((len(key_names), 0), dtype=np.int64)
        return np.concatenate(chunks, axis=1) if len(chunks) > 1 else chunks[0]


def batch_statement(query: str, n_key_columns: int, columns: Sequence[Column], rows: int) -> str:
    """The one-round-trip statement that runs the per-sample ``query`` for every key of a batch.

    With ``rows > 1`` each sample's rows are aggregated where they are produced (one array per column, and
    the row count), then the samples' arrays are concatenated in key order: about 30% less server work
    than aggregating the batch row by row (measured on the demo windows). With ``rows = 1`` there is
    nothing to group, and one array per column over the whole batch, with each row's key ordinal, is
    cheaper still (about 25%, measured on the demo rows).
    """
    inner_query = replace_params(query, lambda n: f"{_K}.k{n}")
    arrays = ", ".join(f"${i}::int8[]" for i in range(1, n_key_columns + 1))
    names = ", ".join(f"k{i}" for i in range(1, n_key_columns + 1))
    source = f"FROM unnest({arrays}) WITH ORDINALITY AS {_K}({names}, ord)\nCROSS JOIN LATERAL (\n"
    if rows == 1:
        selects = [f"array_send(array_agg({_K}.ord::int4))"]
        for c in columns:
            selects += _aggregates(c, f"{_Q}.{quote_ident(c.name)}")
        return f"SELECT {', '.join(selects)}\n{source}{inner_query}\n) AS {_Q}"
    inner = ["count(*)::int4 AS n"]
    outer = [f"array_send(array_agg({_Q}.n ORDER BY {_K}.ord))"]
    for i, c in enumerate(columns):
        for j, aggregate in enumerate(_aggregates(c, f"{_U}.{quote_ident(c.name)}")):
            inner.append(f"{aggregate} AS c{i}_{j}")
            outer.append(f"string_agg({_Q}.c{i}_{j}, ''::bytea ORDER BY {_K}.ord)")
    grouped = f"SELECT {', '.join(inner)}\nFROM (\n{inner_query}\n) AS {_U}"
    return f"SELECT {', '.join(outer)}\n{source}{grouped}\n) AS {_Q}"


def _aggregates(c: Column, ref: str) -> list[str]:
    """The binary aggregates that carry column ``c``: its values, then array lengths or the NULL mask."""
    if c.is_array:
        return [f"string_agg(array_send({c.value_sql(ref)}), ''::bytea)", f"array_send(array_agg(cardinality({ref})))"]
    out = [f"array_send(array_agg({c.value_sql(ref)}))"]
    if c.nullable:
        out.append(f"array_send(array_agg({ref} IS NULL))")
    return out


class BatchReader:
    """``connections`` worker connections on the exported snapshot, each with the batch statement prepared."""

    def __init__(
        self,
        workers: list[tuple[asyncpg.Connection, asyncpg.prepared_stmt.PreparedStatement]],
        params: Sequence[object] = (),
    ) -> None:
        self._params = tuple(params)
        self._idle: asyncio.Queue[tuple[asyncpg.Connection, asyncpg.prepared_stmt.PreparedStatement]] = asyncio.Queue()
        for w in workers:
            self._idle.put_nowait(w)
        self.size = len(workers)

    @classmethod
    @asynccontextmanager
    async def open(
        cls, source: SourceConfig, snapshot_id: str, sql: str, params: Sequence[object] = ()
    ) -> AsyncIterator[BatchReader]:
        """Open the workers concurrently; each begins its transaction and imports ``snapshot_id``.

        ``params`` follow the key arrays as the statement's bind parameters (the category lists).
        """
        if not _SNAPSHOT_ID.match(snapshot_id):
            raise SourceError(f"refusing an invalid snapshot id {snapshot_id!r}")
        conns: list[asyncpg.Connection] = []

        async def start() -> tuple[asyncpg.Connection, asyncpg.prepared_stmt.PreparedStatement]:
            # Parallel plans would only compete with our own connections for the same cores.
            conn = await connect(source, max_parallel_workers_per_gather="0")
            conns.append(conn)
            try:
                await conn.execute(
                    f"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot_id}'"
                )
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as e:
                # Also when the exporter died and took the snapshot with it: a retry takes a new one.
                raise SourceError(f"cannot import the snapshot: {_pg_message(e)}", transient=True) from None
            try:
                return conn, await conn.prepare(sql)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as e:
                raise SourceError(f"cannot prepare the batch statement: {_pg_message(e)}", transient=lost(e)) from None

        tasks = [asyncio.ensure_future(start()) for _ in range(source.connections)]
        try:
            try:
                workers = await asyncio.gather(*tasks)
            except BaseException:  # one failed: stop the others before closing what they opened
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
            yield cls(list(workers), params)
        finally:
            await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)

    async def fetch(self, batch: int, keys: np.ndarray) -> tuple[bytes | None, ...]:
        """Run the batch statement for ``keys`` (shape ``(n_key_columns, n)``) on an idle worker."""
        conn, stmt = await self._idle.get()
        try:
            row = await stmt.fetchrow(*(column.tolist() for column in keys), *self._params)
        except asyncpg.QueryCanceledError as e:
            raise SourceError(f"batch {batch}: {_pg_message(e)} (see [source] statement_timeout)") from None
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError) as e:
            what = "lost the connection: " if lost(e) else ""
            raise SourceError(f"batch {batch}: {what}{_pg_message(e)}", transient=lost(e)) from None
        finally:
            self._idle.put_nowait((conn, stmt))
        return tuple(row)


def _pg_message(e: BaseException) -> str:
    """The server's message on one line (asyncpg's str() adds DETAIL/HINT on further lines)."""
    message = getattr(e, "message", None) or (str(e).splitlines() or [type(e).__name__])[0]
    return str(message).replace("\n", " ")


def _where(cfg: Config) -> str:
    return f"{cfg.file}: " if cfg.file else ""
