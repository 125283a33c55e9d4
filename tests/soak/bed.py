"""The soak's world: a PostgreSQL of its own behind the chaos bed's proxy, a table, a config, and a store.

The server is the soak's own (:func:`tests.harness.db.own_server`) because the soak restarts it. Every process
the soak starts (cron's dumps, the training ranks, a prune by hand) reaches the database through the
:class:`~tests.harness.faults.FreezableProxy`, so a freeze strikes them as a dropped route would; the faults
themselves go to the server directly. An S3 store is moto's server (:mod:`tests.harness.s3`), reached by those
processes through a proxy that refuses requests while a fault says so; the soak's own checks go to moto
directly.
"""

from __future__ import annotations

import os
import random
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..harness.db import execute, own_server
from ..harness.faults import FreezableProxy, server_address
from ..harness.s3 import S3, s3_server_process, throttling_proxy

ROWS = 2048  # samples an epoch: 32 batches of 64, 16 a rank
BATCH = 64
PACE = 0.002  # seconds each sample sleeps on the server: a dump of 4 connections takes about a second
# The S3 lease (60 s in production), short so that a soak sees one expire. A holder counts it lost when it could
# not renew it for 0.8 of this, and on these 2 shared cores a busy soak delays a renewal by seconds: 8 s was
# too short (dumps lost their leases with no fault at all), 20 s is not.
LEASE_SECONDS = 20
REPO = Path(__file__).resolve().parents[2]


@dataclass
class S3Faults:
    """What the S3 proxy does with each request: nothing, or refuse a share of them at random (503 SlowDown,
    or 0: the connection dropped unanswered), as a throttled or restarting server does."""

    status: int | None = None
    share: float = 0.4
    refused: Counter[int] = field(default_factory=Counter)
    rng: random.Random = field(default_factory=lambda: random.Random(28))

    def refuse_with(self, request: str) -> int | None:
        status = self.status
        if status is None or self.rng.random() >= self.share:
            return None
        self.refused[status] += 1
        return status


@dataclass
class Bed:
    """Where one soak runs: ``kind`` is ``local`` or ``s3``."""

    kind: str
    root: Path  # the soak's folder: config, store (local), staging (S3), checkpoints, records, logs
    direct: str  # the database, on the server's socket (faults, reference dumps)
    dsn: str  # the database through the proxy (every process the soak starts)
    pgdata: Path
    proxy: FreezableProxy
    config: Path
    store: str  # the store's location: a folder, or s3://bucket/prefix
    env: dict[str, str]  # the environment of every process the soak starts (on the first host)
    s3: S3 | None = None
    s3_faults: S3Faults = field(default_factory=S3Faults)

    def check_env(self) -> dict[str, str]:
        """The soak's own view of the store: moto directly, not through the faulty proxy."""
        if self.s3 is None:
            return {}
        return {**self.s3.env, "PGPREFETCH_STAGING": str(self.staging(0)), "PGPREFETCH_S3_RETRIES": "10"}

    @property
    def hosts(self) -> int:
        """Cron hosts: an S3 store is dumped from two, as a CronJob's pods land on several machines."""
        return 2 if self.kind == "s3" else 1

    def staging(self, host: int) -> Path:
        """Where a host writes an S3 store's epochs before uploading them (each machine has its own disk)."""
        return self.root / f"staging-{'ab'[host]}"

    def host_env(self, host: int) -> dict[str, str]:
        """The environment of a process on cron host ``host``."""
        if self.kind != "s3":
            return self.env
        return {**self.env, "PGPREFETCH_STAGING": str(self.staging(host))}


def write_config(root: Path, store: str) -> Path:
    """The soak's config: the dump's DSN comes from the environment (PGPREFETCH_DSN), as deployments give it."""
    path = root / "train.toml"
    path.write_text(
        "[source]\n"
        "connections = 4\n"
        'io_timeout = "2s"\n'  # a frozen route is dropped within 2 s
        "[samples]\n"
        'keys = "SELECT id FROM s"\n'
        'query = "SELECT x, y, pg_sleep(pace.seconds) FROM s, pace WHERE id = $1"\n'
        '[fields.x]\ncolumns = ["x"]\ndtype = "float32"\n'
        '[fields.y]\ncolumns = ["y"]\ndtype = "int64"\n'
        f"[batches]\nsize = {BATCH}\nseed = 28\n"
        f'[store]\npath = "{store}"\n'
    )
    return path


def load_table(dsn: str) -> None:
    execute(
        dsn,
        "CREATE TABLE s (id int PRIMARY KEY, x real[] NOT NULL, y bigint NOT NULL)",
        f"""INSERT INTO s SELECT i, array(SELECT (i * 8 + j) * 0.5 FROM generate_series(0, 7) j), i * 3
            FROM generate_series(1, {ROWS}) i""",
        "CREATE TABLE pace (seconds float8 NOT NULL)",
        f"INSERT INTO pace VALUES ({PACE})",
    )


@contextmanager
def soak_bed(kind: str, root: Path) -> Iterator[Bed]:
    """Start everything one soak needs in ``root``; stop it all afterwards."""
    root.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        folder, admin = stack.enter_context(own_server("pgpf-soak-"))
        execute(admin, "CREATE DATABASE soak")
        direct = admin.replace("/postgres?", "/soak?")
        load_table(direct)
        proxy = FreezableProxy(server_address(direct))
        stack.callback(proxy.close)
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),  # this tree's pgprefetch, whatever is installed
            "PGPREFETCH_DSN": proxy.dsn(direct),
            "PGPREFETCH_LEASE_SECONDS": str(LEASE_SECONDS),
        }
        s3 = None
        faults = S3Faults()
        if kind == "s3":
            s3 = stack.enter_context(s3_server_process())  # moto's work out of the harness's GIL
            bucket = s3.bucket()
            store = f"s3://{bucket}/soak"
            endpoint, _ = stack.enter_context(throttling_proxy(s3.endpoint, every=1, refuse_with=faults.refuse_with))
            env.update(s3.env, AWS_ENDPOINT_URL=endpoint, PGPREFETCH_STAGING=str(root / "staging-a"))
            del env["PGPREFETCH_S3_RETRIES"]  # the product's default retries (the test server's env says 1)
        elif kind == "local":
            store = str(root / "store.zarr")
        else:
            raise ValueError(f"a soak's store is local or s3, not {kind!r}")
        bed = Bed(kind, root, direct, proxy.dsn(direct), folder / "pg", proxy, write_config(root, store), store, env)
        bed.s3, bed.s3_faults = s3, faults
        yield bed


def python() -> str:
    """The interpreter the soak's processes run under: this one (the project's venv)."""
    return sys.executable
