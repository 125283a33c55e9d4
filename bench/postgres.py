"""The bench's PostgreSQL: a server (PGPREFETCH_BENCH_DSN, or an embedded one) and a fresh database on it.

Shared by ``python -m bench`` and the runners that need a server of their own (``bench.ragged``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

DATABASE = "pgprefetch_bench"


def with_database(dsn: str, name: str) -> str:
    """The same server URI, pointing at database ``name``."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


@contextlib.contextmanager
def server() -> Iterator[str]:
    """The admin DSN: PGPREFETCH_BENCH_DSN, or a throwaway embedded PostgreSQL in a short temp folder."""
    env = os.environ.get("PGPREFETCH_BENCH_DSN")
    if env:
        yield env
        return
    from pgprefetch.demo.server import embedded_server

    folder = Path(tempfile.mkdtemp(prefix="pgpf-bench-"))  # short: unix socket paths are capped near 107 bytes
    folder.chmod(0o711)  # as root the server's system user must enter it; pgprefetch never widens folders
    try:
        with embedded_server(folder) as dsn:
            yield dsn
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def database(admin_dsn: str) -> Iterator[str]:
    """A fresh database for the bench, dropped afterwards."""

    async def execute(sql: str) -> None:
        conn = await asyncpg.connect(admin_dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
    asyncio.run(execute(f"CREATE DATABASE {DATABASE}"))
    try:
        yield with_database(admin_dsn, DATABASE)
    finally:
        asyncio.run(execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)"))
