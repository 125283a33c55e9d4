"""The suite's fixtures: a real PostgreSQL for the session, a fresh database per test, S3 (moto), Ray.

``PGPREFETCH_TEST_DSN`` (a URI) points the suite at any reachable server, e.g. PostgreSQL 15; otherwise
the session starts the embedded PostgreSQL 18 in a temporary folder. If the first connection fails the
run stops at once with the reason (and the server's log), not with hundreds of failures. The fixtures are
thin: what they set up is the harness's (tests/harness), which tests import; they never import this file.
Beside the servers, the tables and files that the test files of one subject share live here (``ticks``,
``seqs``, the hostile-store ``hostile_db`` and ``hostile_store``, the config tests' ``cfg``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest

from pgprefetch.demo.data import load_demo_data

from .harness import properties  # noqa: F401  (registers and loads the Hypothesis profile)
from .harness.configs import s_config
from .harness.db import S_TABLE, TICKS_TABLES, data_folder, execute, own_database, own_server
from .harness.dumps import kill_9_after
from .harness.hostile import R_TABLE, pristine_store
from .harness.ragged import seqs_table
from .harness.s3 import S3
from .harness.s3 import s3_server as s3_server_running

# Read by Ray when it is imported: its processes then bind to 127.0.0.1, not the machine's outward address.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# Every dump the suite runs (in its processes and the CLI's children) checks its memory pool: a reservation
# that would take the live total past --memory fails, naming the holders (pgprefetch.write.memory.pool).
os.environ["PGPREFETCH_CHECK_MEMORY"] = "1"


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """The server's DSN (its maintenance database)."""
    env = os.environ.get("PGPREFETCH_TEST_DSN")
    if env:
        _check(env, log=None)
        yield env
        return
    with own_server("pgpf-") as (_, dsn):  # short: unix socket paths are capped near 107 bytes
        _check(dsn, log=data_folder(dsn) / "log")
        yield dsn


def _check(dsn: str, log: Path | None) -> None:
    try:
        execute(dsn, "SELECT 1")
    except Exception as e:
        tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else "(no log)"
        pytest.exit(f"cannot connect to the test PostgreSQL: {e}\nserver log:\n{tail}", returncode=3)


@pytest.fixture
def db(pg_dsn: str) -> Iterator[str]:
    """A fresh, empty database for one test; dropped afterwards."""
    with own_database(pg_dsn) as dsn:
        yield dsn


@pytest.fixture(scope="session")
def demo_db(pg_dsn: str) -> Iterator[str]:
    """A database holding both demo datasets at a small scale; tests must not modify it."""
    import asyncio

    with own_database(pg_dsn, prefix="demo") as dsn:
        asyncio.run(load_demo_data(dsn, scale=0.05))
        yield dsn


@pytest.fixture
def s_table(db: str) -> str:
    """A fresh database holding ``s(id, v)``: 480 rows, v = id / 2."""
    execute(db, *S_TABLE)
    return db


@pytest.fixture
def ticks(db: str) -> str:
    """``ticks(series_id, part, t, ts, day, f0, f1, label)``: series of varying length, rows in random heap order.

    Beside it ``items(id, emb, price, day)``, 700 rows: the scan tests' tables (tests/harness/db.py).
    """
    execute(db, *TICKS_TABLES)
    return db


@pytest.fixture
def seqs(db: str) -> str:
    """``seqs`` (arrays, text and bytea of any length) and ``events`` (1..12 rows a user): tests/harness/ragged.py."""
    return seqs_table(db)


@pytest.fixture(scope="module")
def hostile_db(pg_dsn: str) -> Iterator[str]:
    """A database of a module's own holding ``r(id, v, score)``, the hostile-store tests' (tests/harness/hostile.py)."""
    with own_database(pg_dsn, *R_TABLE) as dsn:
        yield dsn


@pytest.fixture(scope="module")
def hostile_store(hostile_db: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store holding epoch 0 of ``r``, dumped once a module; tests copy it before they tamper with it."""
    return pristine_store(hostile_db, tmp_path_factory.mktemp("pristine"))


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3]:
    """moto's S3 server on 127.0.0.1 for the session (see tests/harness/s3.py)."""
    with s3_server_running() as server:
        yield server


@pytest.fixture
def s3(s3_server: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> S3:
    """The S3 server, with this process's AWS variables pointing at it and a staging folder of its own."""
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PGPREFETCH_STAGING", str(tmp_path / "staging"))
    return s3_server


@pytest.fixture
def interrupted(s_table: str, tmp_path: Path) -> tuple[Path, Path]:
    """A store whose epoch 0 a dump killed (``kill -9``) after journaling three batches left partial."""
    config = s_config(tmp_path, slow=True)
    store = tmp_path / "store.zarr"
    kill_9_after(config, s_table, store, batches=3)
    assert (store / ".pgprefetch" / "partial" / "epoch-00000.journal").is_file()
    (tmp_path / "outside").mkdir()
    return config, store


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    """Where a config test writes its file (tests/test_config.py, tests/test_config_messages.py)."""
    return tmp_path / "pgprefetch.toml"


def _on_ray(item: pytest.Item) -> bool:
    module = item.module.__name__.rpartition(".")[2] if item.module else ""
    return "ray_cluster" in getattr(item, "fixturenames", ()) or module.startswith(("test_ray", "test_security_ray"))


SERVER_FIXTURES = frozenset({"pg_dsn", "s3_server", "ray_cluster"})
"""The fixtures that start a server (PostgreSQL, moto's S3, Ray): a test that requests one, however
indirectly, is marked ``server``, and ``make test-fast`` leaves it out. A module whose tests start servers of
their own (``pgprefetch server`` as a process, say) marks itself ``pytestmark = pytest.mark.server``."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that need a server; every Ray test runs on one xdist worker (``--dist loadgroup``).

    One Ray cluster on 2 cores, not one a worker. The group goes first: it is the suite's longest piece of
    work for one worker, and a worker that took it last would run alone at the end while the others sat idle.
    """
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)
        if _on_ray(item):
            item.add_marker(pytest.mark.xdist_group("ray"))
    items.sort(key=lambda item: not _on_ray(item))  # stable: the order within each part is kept


def pytest_assertrepr_compare(op: str, left: object, right: object) -> list[str] | None:
    """Two epochs' files (:func:`~tests.harness.dumps.chunk_bytes`) compared: which differ and where, in a few lines.

    pytest's own report prints every file's bytes: tens of kilobytes that push the failing test's name out of
    the last lines a CI log keeps.
    """
    if op != "==" or not (_files(left) and _files(right)):
        return None
    a, b = cast("dict[str, bytes]", left), cast("dict[str, bytes]", right)
    lines = [f"epoch files differ ({len(a)} left, {len(b)} right)"]
    for name in sorted(a.keys() ^ b.keys())[:5]:
        lines.append(f"  {name}: only {'left' if name in a else 'right'}")
    for name in sorted(n for n in a.keys() & b.keys() if a[n] != b[n])[:10]:
        x, y = a[name], b[name]
        at = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), min(len(x), len(y)))
        lines.append(f"  {name}: {len(x)} and {len(y)} bytes, first differing at byte {at}")
    return lines


def _files(value: object) -> bool:
    """Whether ``value`` is a dict of relative paths to bytes with an array's zarr.json among them."""
    return (
        isinstance(value, dict)
        and any(isinstance(k, str) and k.endswith("zarr.json") for k in value)
        and all(isinstance(v, bytes) for v in value.values())
    )


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    """A real two-node Ray cluster on 127.0.0.1, joined by this process (tests/harness/raycluster.py).

    One cluster serves every Ray test of the session: it takes seconds to start.
    """
    pytest.importorskip("ray")
    from .harness.raycluster import two_node_cluster

    with two_node_cluster() as cluster:
        yield cluster
