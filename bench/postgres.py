"""The bench's PostgreSQL: a server (PGPREFETCH_BENCH_DSN, or an embedded one) and a fresh database on it.

Shared by ``python -m bench`` and the runners that need a server of their own (``bench.ragged``). The
server and the statements are the tests' harness (tests/harness/db.py): one way to start one.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from tests.harness.db import execute, own_server, with_database

DATABASE = "pgprefetch_bench"


@contextlib.contextmanager
def server() -> Iterator[str]:
    """The admin DSN: PGPREFETCH_BENCH_DSN, or a throwaway embedded PostgreSQL in a short temp folder."""
    env = os.environ.get("PGPREFETCH_BENCH_DSN")
    if env:
        yield env
        return
    with own_server("pgpf-bench-") as (_, dsn):
        yield dsn


@contextlib.contextmanager
def database(admin_dsn: str) -> Iterator[str]:
    """A fresh database for the bench (a fixed name: a run killed midway leaves it for the next to drop)."""
    execute(admin_dsn, f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    execute(admin_dsn, f"CREATE DATABASE {DATABASE}")
    try:
        yield with_database(admin_dsn, DATABASE)
    finally:
        execute(admin_dsn, f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
