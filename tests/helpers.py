"""Small helpers shared by the tests: writing configs, running dumps, reading stores."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import zarr

from pgprefetch import DumpResult, dump_epoch, load_config

SEQUENCES = {
    "keys": "SELECT series_id, start_t FROM train_samples",
    "query": "SELECT f0, f1, label FROM ticks WHERE series_id = $1 AND t >= $2 ORDER BY t LIMIT 64",
    "rows": 64,
    "fields": {"x": (["f0", "f1"], "float32"), "y": (["label"], "int64")},
    "size": 64,
}


S_ROWS = 480  # rows of the table ``s`` made by the ``s_table`` fixture: 30 batches of 16


def s_config(folder: Path, *, slow: bool = False, dtype: str = "float32", **overrides: Any) -> Path:
    """A config over ``s(id, v)``, one row per sample; ``slow`` makes each sample take 15 ms (a dump ~2 s)."""
    query = "SELECT v" + (", pg_sleep(0.015)" if slow else "") + " FROM s WHERE id = $1"
    settings: dict[str, Any] = {
        "keys": "SELECT id FROM s",
        "query": query,
        "fields": {"v": (["v"], dtype)},
        "size": 16,
        "connections": 2,
    }
    return write_config(folder, **{**settings, **overrides})


def toml_value(v: Any) -> str:
    return json.dumps(v) if not isinstance(v, bool) else ("true" if v else "false")


def write_config(
    folder: Path,
    *,
    keys: str,
    query: str,
    fields: dict[str, tuple[Any, ...]],
    size: int,
    rows: int | None = 1,
    seed: int = 0,
    drop_last: bool = True,
    fraction: float = 1.0,
    compression: str = "none",
    connections: int = 4,
    name: str = "test.toml",
    store: str = "store.zarr",
    extra_source: str = "",
    extra_samples: str = "",
) -> Path:
    """Write a config file into ``folder`` and return its path.

    ``fields`` maps a name to ``(columns, dtype)`` or ``(columns, dtype, {option: value})``.
    """
    lines = [
        "[source]",
        f"connections = {connections}",
        extra_source,
        "[samples]",
        f"keys = {toml_value(keys)}",
        f"query = {toml_value(query)}",
        f"rows = {rows}" if rows is not None else "",
        f"fraction = {fraction}",
        extra_samples,
        "[batches]",
        f"size = {size}",
        f"seed = {seed}",
        f"drop_last = {toml_value(drop_last)}",
        "[store]",
        f"path = {toml_value(store)}",
        f"compression = {toml_value(compression)}",
    ]
    for fname, (columns, dtype, *options) in fields.items():
        lines += [f"[fields.{fname}]", f"columns = {json.dumps(columns)}", f"dtype = {toml_value(dtype)}"]
        lines += [f"{k} = {toml_value(v)}" for k, v in (options[0] if options else {}).items()]
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def dump(config: Path, dsn: str, epoch: int = 0, **kwargs: Any) -> DumpResult:
    """Load ``config`` with ``dsn`` and dump one epoch."""
    force = kwargs.pop("force", False)
    cfg = load_config(config, dsn=dsn, **kwargs)
    return asyncio.run(dump_epoch(cfg, epoch, force=force))


def epoch_group(result: DumpResult) -> zarr.Group:
    return zarr.open_group(result.path, mode="r")


def read_arrays(result: DumpResult) -> dict[str, np.ndarray]:
    g = epoch_group(result)
    return {name: g[name][:] for name in g.array_keys() if not name.startswith("_")}  # data, not bookkeeping


@contextmanager
def own_server(prefix: str) -> Iterator[tuple[Path, str]]:
    """A PostgreSQL of a test's own (to restart or load heavily): its folder and DSN; both gone afterwards.

    The folder is short (unix socket paths are capped near 107 bytes) and is removed with the server's data,
    which is tens of MB a run.
    """
    from pgprefetch.demo.server import embedded_server

    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o711)  # as root the server's system user must enter it; pgprefetch never widens folders
    try:
        with embedded_server(folder) as dsn:
            yield folder, dsn
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def execute(dsn: str, *statements: str) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            for s in statements:
                await conn.execute(s)
        finally:
            await conn.close()

    asyncio.run(run())


def chunk_bytes(epoch_path: Path) -> dict[str, bytes]:
    """Every file of a published epoch except the manifest, by relative path."""
    return {
        str(p.relative_to(epoch_path)): p.read_bytes()
        for p in sorted(epoch_path.rglob("*"))
        if p.is_file() and p.parent != epoch_path
    }


@contextmanager
def own_database(pg_dsn: str, *statements: str) -> Iterator[str]:
    """A database of a test module's own on the suite's server, set up by ``statements``; dropped afterwards.

    For tables a module shares between its tests (the per-test ``db`` fixture makes one per test).
    """
    from .conftest import with_database

    name = f"t_{uuid.uuid4().hex[:12]}"
    execute(pg_dsn, f"CREATE DATABASE {name}")
    try:
        dsn = with_database(pg_dsn, name)
        execute(dsn, *statements)
        yield dsn
    finally:
        execute(pg_dsn, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextmanager
def counting_store(
    pg_dsn: str,
    folder: Path,
    *,
    n: int,
    size: int,
    drop_last: bool = True,
    epochs: tuple[int, ...] = (0,),
    shard_batches: int | None = None,
) -> Iterator[Path]:
    """A store of ``epochs`` of ``s(id, v = id)``, ``n`` rows in batches of ``size``, from a database of its own.

    The readers' tests (NumPy, JAX, Grain, the reader contracts) check which samples each step sees, so
    ``v`` is the key itself. ``shard_batches`` makes shard files that small, so that reads cross them.
    The database is dropped afterwards; the store stays in ``folder``.
    """
    import pytest

    import pgprefetch.write.files.shardfiles

    table = (
        "CREATE TABLE s (id int PRIMARY KEY, v bigint NOT NULL)",
        f"INSERT INTO s SELECT i, i FROM generate_series(1, {n}) i",
    )
    with own_database(pg_dsn, *table) as dsn:
        config = write_config(
            folder,
            keys="SELECT id FROM s",
            query="SELECT v FROM s WHERE id = $1",
            fields={"v": (["v"], "int64")},
            size=size,
            drop_last=drop_last,
        )
        with pytest.MonkeyPatch.context() as mp:
            if shard_batches is not None:
                mp.setattr(pgprefetch.write.files.shardfiles, "SHARD_BYTES", shard_batches * size * 8)
            for epoch in epochs:
                dump(config, dsn, epoch=epoch)
        yield folder / "store.zarr"
