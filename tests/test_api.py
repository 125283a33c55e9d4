"""The Python API: the CLI's commands as functions, a dict validated as a file is."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import pgprefetch
from pgprefetch.errors import ConfigError

from .harness.configs import s_config
from .harness.dumps import chunk_bytes, dump


def s_dict(store: Path) -> dict[str, object]:
    return {
        "source": {"connections": 2},
        "samples": {"keys": "SELECT id FROM s", "query": "SELECT v FROM s WHERE id = $1"},
        "fields": {"v": {"columns": ["v"], "dtype": "float32"}},
        "batches": {"size": 16},
        "store": {"path": str(store)},
    }


def test_dump_takes_a_dict_and_gives_the_bytes_of_the_file_config(s_table: str, tmp_path: Path) -> None:
    (result,) = pgprefetch.dump(s_dict(tmp_path / "api.zarr"), epochs=0, dsn=s_table)
    from_file = dump(s_config(tmp_path), s_table)
    assert result.status == "written"
    assert chunk_bytes(result.path) == chunk_bytes(from_file.path)


def test_a_dict_is_validated_with_the_files_messages(tmp_path: Path) -> None:
    spec = s_dict(tmp_path / "x.zarr")
    spec["batches"] = {"size": 0}
    with pytest.raises(ConfigError) as e:
        pgprefetch.build_config(spec)
    assert str(e.value) == "[batches] size: expected a positive integer, got 0"


def test_ls_verify_and_prune_as_functions(s_table: str, tmp_path: Path) -> None:
    store = tmp_path / "api.zarr"
    results = pgprefetch.dump(s_dict(store), epochs=range(3), dsn=s_table)
    assert [r.epoch for r in results] == [0, 1, 2]
    assert [(i.epoch, i.state) for i in pgprefetch.ls(store)] == [(0, "complete"), (1, "complete"), (2, "complete")]
    assert pgprefetch.verify(store, 1) == []
    pgprefetch.open_store(store).record_consumer("run", 2)
    pgprefetch.open_store(store).record_consumer("paused", 0)
    assert pgprefetch.prune(store, keep=0).epochs == []  # the paused run may still read epoch 0
    assert pgprefetch.forget(store, "paused") == ["paused"]
    assert pgprefetch.prune(store, keep=0).epochs == [0, 1]


def test_dump_works_inside_a_running_event_loop(s_table: str, tmp_path: Path) -> None:
    async def notebook_cell() -> str:
        (result,) = pgprefetch.dump(s_dict(tmp_path / "nb.zarr"), dsn=s_table)
        return result.status

    assert asyncio.run(notebook_cell()) == "written"


def service_section(name: str, dsn: str) -> str:
    """A pg_service.conf section naming the server, database and user that ``dsn`` names, whatever its form.

    Every parameter the URI carries goes in: host and port from the authority or from the query (a unix
    socket folder and a non-default port come as ``?host=...&port=...``), user, password, dbname, sslmode.
    Writing only the host sent the dump to port 5432 of that host, which fails for any other server.
    """
    from urllib.parse import parse_qsl, unquote, urlsplit

    parts = urlsplit(dsn)
    params = dict(parse_qsl(parts.query))
    authority = {"host": parts.hostname, "port": parts.port, "user": parts.username, "password": parts.password}
    params.update({k: unquote(str(v)) for k, v in authority.items() if v is not None})  # the authority wins
    if parts.path.strip("/"):
        params["dbname"] = unquote(parts.path.strip("/"))
    return f"[{name}]\n" + "".join(f"{k}={v}\n" for k, v in params.items())


def test_a_service_file_names_the_database(s_table: str, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    service = tmp_path / "pg_service.conf"
    service.write_text(service_section("training", s_table))
    cfg = s_config(tmp_path)  # no dsn anywhere: libpq's variables decide
    env = {**os.environ, "PGSERVICEFILE": str(service), "PGSERVICE": "training"}
    for name in ("PGPREFETCH_DSN", "PGHOST", "PGPORT", "PGDATABASE", "PGUSER"):  # the service file alone
        env.pop(name, None)
    argv = [sys.executable, "-m", "pgprefetch", "dump", "--config", str(cfg), "--epoch", "0", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (tmp_path / "b").mkdir()
    assert chunk_bytes(tmp_path / "store.zarr" / "epoch-00000") == chunk_bytes(
        dump(s_config(tmp_path / "b"), s_table).path
    )


def test_a_service_section_carries_host_port_user_and_database_of_any_uri() -> None:
    sockets = "postgresql://postgres@/t_1?host=/tmp/pgpf-x/run&port=55433"
    assert service_section("s", sockets) == "[s]\nhost=/tmp/pgpf-x/run\nport=55433\nuser=postgres\ndbname=t_1\n"
    tcp = "postgresql://ci:p%40ss@db.example:55433/t_2?sslmode=require"
    assert service_section("s", tcp) == (
        "[s]\nsslmode=require\nhost=db.example\nport=55433\nuser=ci\npassword=p@ss\ndbname=t_2\n"
    )


def test_xarray_and_dask_open_an_epoch(demo_db: str, tmp_path: Path) -> None:
    import dask.array
    import numpy as np
    import xarray
    import zarr

    from .harness.configs import SEQUENCES, write_config

    result = dump(write_config(tmp_path, **SEQUENCES), demo_db)  # x (64, 2), y (64,), keys (2,) per sample
    epoch = xarray.open_zarr(result.path.parent, group=result.path.name, consolidated=False)
    assert set(epoch.data_vars) == {"x", "y", "keys", "_checksums"}
    assert epoch["x"].dims == ("batch", "sample", "x_dim0", "x_dim1")
    group = zarr.open_group(result.path, mode="r")
    np.testing.assert_array_equal(epoch["y"].values, group["y"][:])
    lazy = dask.array.from_zarr(str(result.path / "x"))
    np.testing.assert_array_equal(lazy[3].compute(), group["x"][3])


def test_ls_verify_and_prune_of_a_missing_store_raise_store_not_found_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such.zarr"
    for call in (
        lambda: pgprefetch.ls(missing),
        lambda: pgprefetch.verify(missing, 0),
        lambda: pgprefetch.prune(missing, 1),
    ):
        with pytest.raises(pgprefetch.StoreNotFoundError, match=str(missing)):
            call()
    assert not missing.exists()  # looking did not create it
