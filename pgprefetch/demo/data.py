"""Two deterministic demo datasets, generated inside PostgreSQL so that loading costs no transfer.

* ``sequences``, as in the blog post: ``ticks`` holds many series x time steps (float features and an
  integer label); ``train_samples`` / ``test_samples`` hold the start points of 64-step windows, split by
  series so that no series leaks from train to test.
* ``rows``: ``items`` holds one sample per row: a ``real[16]`` embedding, a numeric price, an integer
  quantity, a date and a label; ``train_items`` / ``test_items`` split the ids.

A window's labels are a bucket of its ``f0`` (so the example model has something to learn). Values come
from ``sin`` and ``hashint8extended`` of the row's coordinates, so every server (PostgreSQL
11 and later) generates the same data for the same scale.

Loading replaces the demo's tables, so it first makes sure they are the demo's: each table it creates
carries the comment :data:`MARK`, and a table of one of those names without it (someone's own ``items``)
stops the load unless ``replace`` is given (``demo-data --replace``). The whole load is one transaction: a
failed load leaves the database as it was.
"""

from __future__ import annotations

import asyncpg

from pgprefetch.config.model import SourceConfig
from pgprefetch.errors import ConfigError
from pgprefetch.pg.calls import close, connect, translate

STEPS = 1024  # time steps per series
STRIDE = 4  # a window may start at every 4th step
WINDOW = 64  # rows per window, the demo config's `rows`
EMBEDDING = 16

TABLES = ("ticks", "train_samples", "test_samples", "items", "train_items", "test_items")
"""Every table the demo datasets create, hence drop when they are loaded again."""

MARK = "pgprefetch demo data"
"""The comment on each demo table: a table with it may be replaced without asking."""


def sequence_counts(scale: float) -> tuple[int, int]:
    """Return (series, train samples) of the ``sequences`` dataset at ``scale``."""
    series = max(5, round(200 * scale))
    starts = (STEPS - WINDOW) // STRIDE + 1
    train_series = series - series // 5
    return series, train_series * starts


def row_count(scale: float) -> int:
    """Return the number of ``items`` rows at ``scale``."""
    return max(100, round(100_000 * scale))


async def load_sequences(conn: asyncpg.Connection, scale: float = 1.0) -> int:
    """(Re)create ``ticks``, ``train_samples`` and ``test_samples``; return the train sample count."""
    series, _ = sequence_counts(scale)
    await conn.execute(
        """
        DROP TABLE IF EXISTS ticks, train_samples, test_samples;
        CREATE TABLE ticks (
            series_id integer NOT NULL,
            t integer NOT NULL,
            f0 real NOT NULL,
            f1 double precision NOT NULL,
            label smallint NOT NULL,
            PRIMARY KEY (series_id, t)
        );
        CREATE TABLE train_samples (series_id integer, start_t integer, PRIMARY KEY (series_id, start_t));
        CREATE TABLE test_samples (LIKE train_samples INCLUDING ALL);
        """
    )
    await conn.execute(
        """
        INSERT INTO ticks
        SELECT s, t,
               sin(s * 0.37 + t * 0.05)::real,
               (hashint8extended(s::bigint * 1000003 + t, 7) % 1000000) / 1e6,
               least(4, floor((sin(s * 0.37 + t * 0.05) + 1) * 2.5))::smallint  -- learnable from f0
        FROM generate_series(1, $1::int) AS s, generate_series(0, $2::int - 1) AS t
        ORDER BY s, t
        """,
        series,
        STEPS,
    )
    # Every fifth series is held out for testing.
    starts = "SELECT series_id, t FROM ticks WHERE t % $1::int = 0 AND t <= $2::int"
    await conn.execute(f"INSERT INTO train_samples {starts} AND series_id % 5 <> 0", STRIDE, STEPS - WINDOW)
    await conn.execute(f"INSERT INTO test_samples {starts} AND series_id % 5 = 0", STRIDE, STEPS - WINDOW)
    await _mark(conn, ("ticks", "train_samples", "test_samples"))
    return int(await conn.fetchval("SELECT count(*) FROM train_samples"))


async def load_rows(conn: asyncpg.Connection, scale: float = 1.0) -> int:
    """(Re)create ``items``, ``train_items`` and ``test_items``; return the train sample count."""
    await conn.execute(
        """
        DROP TABLE IF EXISTS items, train_items, test_items;
        CREATE TABLE items (
            id bigint PRIMARY KEY,
            emb real[] NOT NULL,
            price numeric(10, 2) NOT NULL,
            qty integer NOT NULL,
            day date NOT NULL,
            label bigint NOT NULL
        );
        """
    )
    await conn.execute(
        """
        INSERT INTO items
        SELECT i,
               ARRAY(SELECT sin(i * 0.001 + j)::real FROM generate_series(1, $2::int) AS j),
               (hashint8extended(i, 1) % 100000) / 100.0,
               (hashint8extended(i, 2) % 50)::int + 50,
               date '2024-01-01' + (i % 365)::int,
               abs(hashint8extended(i, 3)) % 10
        FROM generate_series(1, $1::bigint) AS i
        """,
        row_count(scale),
        EMBEDDING,
    )
    await conn.execute(
        """
        CREATE TABLE train_items AS SELECT id FROM items WHERE id % 10 <> 0;
        CREATE TABLE test_items AS SELECT id FROM items WHERE id % 10 = 0;
        """
    )
    await _mark(conn, ("items", "train_items", "test_items"))
    return int(await conn.fetchval("SELECT count(*) FROM train_items"))


async def _mark(conn: asyncpg.Connection, tables: tuple[str, ...]) -> None:
    """Comment ``tables`` as the demo's (a later load may replace them) and ANALYZE them.

    The names are this module's constants, never input, so they are written into the SQL as they are.
    """
    for table in tables:
        await conn.execute(f"COMMENT ON TABLE {table} IS '{MARK}'")
    await conn.execute(f"ANALYZE {', '.join(tables)}")


async def foreign_tables(conn: asyncpg.Connection) -> list[str]:
    """The names among :data:`TABLES` that a load would drop but that are not the demo's own.

    Each name is resolved as ``DROP TABLE`` resolves it (``to_regclass``, through the search path); a view
    or a table without :data:`MARK` counts as someone else's.
    """
    rows = await conn.fetch(
        """
        SELECT name FROM unnest($1::text[]) WITH ORDINALITY AS t(name, n)
        WHERE to_regclass(quote_ident(name)) IS NOT NULL
          AND coalesce(obj_description(to_regclass(quote_ident(name)), 'pg_class'), '') <> $2
        ORDER BY n
        """,
        list(TABLES),
        MARK,
    )
    return [row["name"] for row in rows]


async def load_demo_data(dsn: str | None, scale: float = 1.0, *, replace: bool = False) -> dict[str, int]:
    """Load both datasets into the database at ``dsn``; return their train sample counts.

    Args:
        dsn: the database; None: the PG* environment variables.
        scale: the datasets' size (1.0: 200 series and 100,000 rows).
        replace: also drop tables of the demo's names that the demo did not make.

    Raises:
        ConfigError: a table of the demo's names is someone else's and ``replace`` is not given.
        SourceError: the database cannot be reached or refused the load; the message holds no password.
    """
    conn = await connect(SourceConfig(dsn=dsn))
    try:
        async with conn.transaction():
            others = [] if replace else await foreign_tables(conn)
            if others:
                raise ConfigError(
                    f"the database already has {', '.join(others)}, not made by demo-data; loading would drop "
                    "them: use another database, or --replace to drop them"
                )
            return {"sequences": await load_sequences(conn, scale), "rows": await load_rows(conn, scale)}
    except asyncpg.PostgresError as e:
        raise translate(e, "loading the demo data") from None
    finally:
        await close(conn, 10_000)
