"""PostgreSQL for the tests: a server of a folder's own, databases on it, and statements run synchronously.

Tests compare dumps with what the database says, so they speak to it directly here (asyncpg, run to the
end in ``asyncio.run``): no pool, no state kept between calls.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

import asyncpg

S_ROWS = 480  # rows of the table ``s`` made by the ``s_table`` fixture: 30 batches of 16
S_TABLE = (
    "CREATE TABLE s (id int PRIMARY KEY, v real NOT NULL)",
    "INSERT INTO s SELECT i, i * 0.5 FROM generate_series(1, 480) i",
)
SERIES = 40  # series of 1..120 rows (some shorter than a window) in ``ticks``, the ``ticks`` fixture's scan table
TICKS_TABLES = (
    """CREATE TABLE ticks (series_id int, part int, t int, ts timestamptz, day date,
           f0 real NOT NULL, f1 float8 NOT NULL, label smallint NOT NULL)""",
    f"""INSERT INTO ticks
           SELECT s, s % 3, t, timestamptz '2024-01-01 00:00:00+00' + t * interval '1 minute' + s * interval '1 s',
                  date '2024-01-01' + t, s + t * 0.5, s * 1000 + t / 3.0, (s * 7 + t) % 5
           FROM generate_series(1, {SERIES}) s, generate_series(1, (s * 37) % 120 + 1) t
           ORDER BY random()""",
    "CREATE TABLE items (id bigint PRIMARY KEY, emb real[] NOT NULL, price numeric NOT NULL, day date NOT NULL)",
    """INSERT INTO items SELECT i, ARRAY[i, -i, i / 2.0, 1], i * 1.25, date '2020-01-01' + i
           FROM generate_series(1, 700) i ORDER BY random()""",
)


def with_database(dsn: str, name: str) -> str:
    """The same server URI, pointing at database ``name``."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


def execute(dsn: str, *statements: str) -> None:
    """Run ``statements`` in order on one connection."""

    async def run() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for s in statements:
                await conn.execute(s)
        finally:
            await conn.close()

    asyncio.run(run())


def fetch(dsn: str, sql: str, *args: object) -> list[asyncpg.Record]:
    """Run one query synchronously (for comparing dumps with what the database says)."""

    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


@contextmanager
def own_database(pg_dsn: str, *statements: str, prefix: str = "t") -> Iterator[str]:
    """A database of its own on ``pg_dsn``'s server, set up by ``statements``; dropped (forced) afterwards.

    The per-test ``db`` fixture makes one per test; modules that share tables between their tests make one
    per module with this.
    """
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    execute(pg_dsn, f"CREATE DATABASE {name}")
    try:
        dsn = with_database(pg_dsn, name)
        if statements:
            execute(dsn, *statements)
        yield dsn
    finally:
        execute(pg_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def data_folder(dsn: str) -> Path:
    """The data folder of an embedded server: its socket lives there, and its DSN names it as ``host``."""
    return Path(parse_qs(urlsplit(dsn).query)["host"][0])


@contextmanager
def own_server(prefix: str) -> Iterator[tuple[Path, str]]:
    """A PostgreSQL of its own (the suite's, the bench's, or a test's that restarts it): its folder and DSN.

    The folder is short (unix socket paths are capped near 107 bytes) and is removed with the server's data,
    which is tens of MB a run. Its ``pg`` is the data folder, but for a root whose TMPDIR the server's user
    cannot reach: pgprefetch then keeps the data elsewhere for the run, and :func:`data_folder` finds it.
    """
    from pgprefetch.demo.server import embedded_server

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o711)  # as root: the server's user may enter it, so the data stays in it (as the callers expect)
    try:
        with embedded_server(folder) as dsn:
            yield folder, dsn
    finally:
        shutil.rmtree(folder, ignore_errors=True)
