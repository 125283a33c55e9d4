"""A real PostgreSQL for the whole test session, and a fresh database per test that needs one.

``PGPREFETCH_TEST_DSN`` (a URI) points the suite at any reachable server, e.g. PostgreSQL 15; otherwise
the session starts the embedded PostgreSQL 18 in a temporary folder. If the first connection fails the
run stops at once with the reason (and the server's log), not with hundreds of failures.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from pgprefetch.demo.data import load_demo_data

from .harness import properties  # noqa: F401  (registers and loads the Hypothesis profile)
from .s3server import S3
from .s3server import s3_server as s3_server_running

# Read by Ray when it is imported: its processes then bind to 127.0.0.1, not the machine's outward address.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


def with_database(dsn: str, name: str) -> str:
    """The same server URI, pointing at database ``name``."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


async def _execute(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """The server's DSN (its maintenance database)."""
    env = os.environ.get("PGPREFETCH_TEST_DSN")
    if env:
        _check(env, log=None)
        yield env
        return
    from pgprefetch.demo.server import embedded_server

    folder = Path(tempfile.mkdtemp(prefix="pgpf-"))  # short: unix socket paths are capped near 107 bytes
    folder.chmod(0o711)  # as root the server's system user must enter it; pgprefetch never widens folders
    try:
        with embedded_server(folder) as dsn:
            _check(dsn, log=folder / "pg" / "log")
            yield dsn
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _check(dsn: str, log: Path | None) -> None:
    try:
        asyncio.run(_execute(dsn, "SELECT 1"))
    except Exception as e:
        tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else "(no log)"
        pytest.exit(f"cannot connect to the test PostgreSQL: {e}\nserver log:\n{tail}", returncode=3)


@pytest.fixture
def db(pg_dsn: str) -> Iterator[str]:
    """A fresh, empty database for one test; dropped afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    asyncio.run(_execute(pg_dsn, f"CREATE DATABASE {name}"))
    try:
        yield with_database(pg_dsn, name)
    finally:
        asyncio.run(_execute(pg_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture(scope="session")
def demo_db(pg_dsn: str) -> Iterator[str]:
    """A database holding both demo datasets at a small scale; tests must not modify it."""
    name = f"demo_{uuid.uuid4().hex[:12]}"
    asyncio.run(_execute(pg_dsn, f"CREATE DATABASE {name}"))
    dsn = with_database(pg_dsn, name)
    asyncio.run(load_demo_data(dsn, scale=0.05))
    try:
        yield dsn
    finally:
        asyncio.run(_execute(pg_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))


@pytest.fixture
def s_table(db: str) -> str:
    """A fresh database holding ``s(id, v)``: 480 rows, v = id / 2."""
    conn_sql = (
        "CREATE TABLE s (id int PRIMARY KEY, v real NOT NULL)",
        "INSERT INTO s SELECT i, i * 0.5 FROM generate_series(1, 480) i",
    )

    async def run() -> None:
        conn = await asyncpg.connect(db)
        try:
            for sql in conn_sql:
                await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(run())
    return db


def fetch(dsn: str, sql: str, *args: object) -> list[asyncpg.Record]:
    """Run one query synchronously (for comparing dumps with what the database says)."""

    async def run() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    return asyncio.run(run())


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3]:
    """moto's S3 server on 127.0.0.1 for the session (see tests/s3server.py)."""
    with s3_server_running() as server:
        yield server


@pytest.fixture
def s3(s3_server: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> S3:
    """The S3 server, with this process's AWS variables pointing at it and a staging folder of its own."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PGPREFETCH_STAGING", str(tmp_path / "staging"))
    return s3_server


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """A real two-node Ray cluster (a raylet of one CPU each) on 127.0.0.1, joined by this process.

    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` keeps Ray on the loopback address (by default it binds to the
    machine's outward one); a temp folder of its own keeps a stale ``/tmp/ray`` of another run out of it.
    One cluster serves every Ray test of the session: it takes seconds to start.
    """
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    temp = tempfile.mkdtemp(prefix="pgpf-ray-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = temp  # where Ray records the cluster this host runs (ray_current_cluster)
    os.makedirs(f"{temp}/ray")
    cluster = Cluster()
    try:
        cluster.add_node(num_cpus=1, temp_dir=f"{temp}/ray", include_dashboard=False)  # the head
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, include_dashboard=False, logging_level="WARNING")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp, ignore_errors=True)
