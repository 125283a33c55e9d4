"""Scan mode: one read of the table per epoch, samples cut on the client, byte-identical to the query mode.

Over the ``ticks`` fixture's tables (tests/harness/db.py): windows and rows against their query-mode twins,
any row order, date and timestamp keys, several epochs from one read, ``check``. What a scan refuses (one
line naming the series, key or column) is tests/test_scan_errors.py's; what it survives (a killed
connection or process, a table larger than memory) tests/test_scan_faults.py's.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bench import mixed
from bench.scan import scan_config as bench_scan_config
from pgprefetch import EpochArrays
from pgprefetch.cli import cli
from pgprefetch.write.scan.table import _is_sorted

from .harness.configs import scan_config
from .harness.db import execute, fetch
from .harness.dumps import chunk_bytes, dump, read_arrays
from .harness.properties import EXTREMES


def twin_config(folder: Path, window: int, stride: int, fraction: float = 1.0, order: str = "t") -> Path:
    """The query-mode twin of a windows scan config: the same start points, one window per query."""
    keys = f"""SELECT series_id, {order} FROM (
                 SELECT series_id, {order}, row_number() OVER w - 1 AS i, count(*) OVER (PARTITION BY series_id) AS n
                 FROM ticks WINDOW w AS (PARTITION BY series_id ORDER BY {order})) s
               WHERE i % {stride} = 0 AND i + {window} <= n"""
    query = f"SELECT f0, f1, label FROM ticks WHERE series_id = $1 AND {order} >= $2 ORDER BY {order} LIMIT {window}"
    return scan_config(folder, keys=keys, query=query, rows=window, fraction=fraction)


@pytest.mark.parametrize(("window", "stride", "fraction"), [(8, 1, 1.0), (16, 5, 0.6)])
def test_windows_are_byte_identical_to_the_query_mode_twin(
    ticks: str, tmp_path: Path, window: int, stride: int, fraction: float
) -> None:
    scan = dump(
        scan_config(
            tmp_path / "scan",
            table="ticks",
            key=["series_id"],
            order="t",
            window=window,
            stride=stride,
            fraction=fraction,
        ),
        ticks,
    )
    twin = dump(twin_config(tmp_path / "twin", window, stride, fraction), ticks)
    assert scan.n_samples == twin.n_samples > 0
    assert chunk_bytes(scan.path) == chunk_bytes(twin.path)
    assert scan.rows_read == fetch(ticks, "SELECT count(*) FROM ticks")[0][0]


def test_double_real_and_smallint_windows_cast_into_one_float32_field_beside_a_bool_field(
    db: str, tmp_path: Path
) -> None:
    """The bench's *mixed* shape: the scan's windows hold the table's values, and the query mode's bytes."""
    execute(
        db,
        """CREATE TABLE sensors (series_id int, t int, f0 float8 NOT NULL, f1 real NOT NULL,
           f2 smallint NOT NULL, flag boolean NOT NULL)""",
        """INSERT INTO sensors
           SELECT s, t, s * 1000 + t / 3.0, sin(s + t * 0.1), (s * 31 + t * 7) % 30000 - 15000, (s + t) % 3 = 0
           FROM generate_series(1, 25) s, generate_series(0, (s * 13) % 40 + 2) t ORDER BY random()""",
    )
    fields = {"x": (["f0", "f1", "f2"], "float32"), "flag": (["flag"], "bool")}
    window = {"table": "sensors", "key": ["series_id"], "order": "t", "window": 6, "fields": fields}
    scan = dump(scan_config(tmp_path / "scan", **window), db)
    keys = """SELECT series_id, t FROM (
                SELECT series_id, t, count(*) OVER (PARTITION BY series_id) - row_number() OVER w AS after
                FROM sensors WINDOW w AS (PARTITION BY series_id ORDER BY t)) s WHERE after >= 5"""
    query = "SELECT f0, f1, f2, flag FROM sensors WHERE series_id = $1 AND t >= $2 ORDER BY t LIMIT 6"
    twin = dump(scan_config(tmp_path / "twin", keys=keys, query=query, rows=6, fields=fields), db)
    assert scan.n_samples == twin.n_samples == fetch(db, f"SELECT count(*) FROM ({keys}) k")[0][0]
    assert chunk_bytes(scan.path) == chunk_bytes(twin.path)
    arrays = read_arrays(scan)
    assert arrays["x"].dtype == np.float32
    assert arrays["flag"].dtype == np.bool_
    starts, x, flag = arrays["keys"].reshape(-1, 2), arrays["x"].reshape(-1, 6, 3), arrays["flag"].reshape(-1, 6)
    real = np.flatnonzero(starts[:, 0] != 0)  # the padded last batch holds zeros
    for i in real[:: max(1, len(real) // 7)]:  # a few windows, spread over the epoch
        sid, t = map(int, starts[i])
        rows = fetch(
            db, f"SELECT f0, f1, f2, flag FROM sensors WHERE series_id = {sid} AND t >= {t} ORDER BY t LIMIT 6"
        )
        expected = np.array([(r["f0"], r["f1"], r["f2"]) for r in rows], dtype=np.float32)
        assert np.array_equal(x[i], expected), (sid, t)
        assert flag[i].tolist() == [r["flag"] for r in rows], (sid, t)


def test_the_bench_mixed_dataset_scans_every_window_of_what_the_database_holds(db: str, tmp_path: Path) -> None:
    """``python -m bench``'s second windows shape, its own load and scan config (8 connections, drop_last)."""

    async def load() -> int:
        conn = await asyncpg.connect(db)
        try:
            return await mixed.MIXED.load(conn, 0.1)
        finally:
            await conn.close()

    assert asyncio.run(load()) == mixed.MIXED.expected(0.1) > 0
    config = tmp_path / "mixed.toml"
    config.write_text(bench_scan_config(mixed.MIXED, tmp_path / "mixed.zarr"))
    result = dump(config, db)
    assert result.n_samples == mixed.scan_count(0.1) // 256 * 256  # every window at stride 1, full batches only
    a = read_arrays(result)
    starts, x, flag = a["keys"].reshape(-1, 2), a["x"].reshape(-1, mixed.WINDOW, 3), a["flag"].reshape(-1, mixed.WINDOW)
    assert len({(int(sid), int(t)) for sid, t in starts}) == len(starts)  # no window twice
    assert starts[:, 0].min() >= 1
    assert starts[:, 0].max() <= mixed.SERIES
    assert starts[:, 1].max() <= mixed.steps(0.1) - mixed.WINDOW
    for i in range(0, len(starts), len(starts) // 6):  # a few windows, spread over the epoch
        sid, t = map(int, starts[i])
        rows = fetch(db, f"SELECT f0, f1, f2, flag FROM sensors WHERE series_id = {sid} AND t >= {t} ORDER BY t")
        expected = np.array([(r["f0"], r["f1"], r["f2"]) for r in rows[: mixed.WINDOW]], dtype=np.float32)
        assert np.array_equal(x[i], expected), (sid, t)
        assert flag[i].tolist() == [r["flag"] for r in rows[: mixed.WINDOW]], (sid, t)


def test_a_stream_decoded_a_few_rows_at_a_time_gives_the_same_epoch(
    ticks: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pgprefetch.write.scan.copystream

    windows = {"table": "ticks", "key": ["series_id"], "order": "t", "window": 8, "stride": 2}
    whole = dump(scan_config(tmp_path / "whole", **windows), ticks)
    monkeypatch.setattr(pgprefetch.write.scan.copystream, "DRAIN_BYTES", 1000)  # rows straddle every chunk boundary
    pieces = dump(scan_config(tmp_path / "pieces", **windows), ticks)
    assert chunk_bytes(pieces.path) == chunk_bytes(whole.path)


def test_rows_are_byte_identical_to_the_query_mode_twin(ticks: str, tmp_path: Path) -> None:
    fields = {"emb": (["emb"], "float32"), "f": (["price", "day"], "float64")}
    scan = dump(scan_config(tmp_path / "scan", table="items", key="id", fields=fields), ticks)
    query = "SELECT emb, price, day FROM items WHERE id = $1"
    twin = dump(scan_config(tmp_path / "twin", keys="SELECT id FROM items", query=query, fields=fields), ticks)
    assert scan.n_samples == 700
    assert chunk_bytes(scan.path) == chunk_bytes(twin.path)


def test_a_table_stored_in_key_order_gives_the_bytes_of_one_in_random_order(ticks: str, tmp_path: Path) -> None:
    # Rows read in key order skip the client's sort; the epoch must not notice.
    execute(ticks, "CREATE TABLE ticks_sorted AS SELECT * FROM ticks ORDER BY series_id, t")
    windows = {"key": ["series_id"], "order": "t", "window": 8, "stride": 3}
    shuffled = dump(scan_config(tmp_path / "shuffled", table="ticks", **windows), ticks)
    ordered = dump(scan_config(tmp_path / "ordered", table="ticks_sorted", **windows), ticks)
    assert ordered.n_samples == shuffled.n_samples > 0
    assert chunk_bytes(ordered.path) == chunk_bytes(shuffled.path)


@given(
    keys=hnp.arrays(
        np.int64,
        st.tuples(st.integers(1, 3), st.integers(0, 8)),
        elements=st.integers(0, 2) | st.sampled_from(EXTREMES),
    ),
    sort=st.booleans(),
)
def test_key_order_is_recognised_exactly_as_lexsort_orders(keys: np.ndarray, sort: bool) -> None:
    if sort:
        keys = keys[:, np.lexsort(keys[::-1])]
    expected = np.array_equal(np.lexsort(keys[::-1]), np.arange(keys.shape[1])) or keys.shape[1] < 2
    assert _is_sorted(keys) == expected, keys.tolist()


def test_a_select_as_table_and_a_multi_column_key(ticks: str, tmp_path: Path) -> None:
    table = "SELECT series_id, part, t, f0, f1, label FROM ticks WHERE series_id <= 30"
    cfg = scan_config(tmp_path, table=table, key=["part", "series_id"], order="t", window=4, stride=3)
    arrays = read_arrays(dump(cfg, ticks))
    keys = arrays["keys"].reshape(-1, 3)
    rows = fetch(ticks, "SELECT series_id, part, t, f0, label FROM ticks WHERE series_id <= 30 ORDER BY series_id, t")
    by_series: dict[int, list[Any]] = {}
    for r in rows:
        by_series.setdefault(r["series_id"], []).append(r)
    expected = {(s[0]["part"], sid, s[i]["t"]) for sid, s in by_series.items() for i in range(0, len(s) - 3, 3)}
    real = keys[np.any(keys != 0, axis=1)]  # the padded last batch holds zeros
    assert {tuple(map(int, k)) for k in real} == expected
    assert len(real) == len(expected)
    first = {(int(k[0]), int(k[1]), int(k[2])): i for i, k in enumerate(keys)}
    part, sid, t = min(expected)
    got = arrays["y"].reshape(-1, 4)[first[(part, sid, t)]]
    assert got.tolist() == [r["label"] for r in by_series[sid] if r["t"] >= t][:4]


@pytest.mark.parametrize(("order", "unit"), [("ts", "us"), ("day", "D")])
def test_timestamp_and_date_order_give_unix_keys(ticks: str, tmp_path: Path, order: str, unit: str) -> None:
    cfg = scan_config(tmp_path, table="ticks", key=["series_id"], order=order, window=3, stride=50)
    arrays = read_arrays(dump(cfg, ticks))
    keys = arrays["keys"].reshape(-1, 2)
    keys = keys[keys[:, 0] != 0]
    rows = fetch(ticks, f"SELECT series_id, {order} AS o FROM ticks ORDER BY series_id, {order}")
    starts: dict[int, list[Any]] = {}
    for r in rows:
        starts.setdefault(r["series_id"], []).append(r["o"])
    expected = set()
    for sid, values in starts.items():
        for i in range(0, len(values) - 2, 50):
            v = values[i]
            stamp = np.datetime64(v.replace(tzinfo=None) if unit == "us" else v, unit)
            expected.add((sid, int(stamp.astype(np.int64))))
    assert {tuple(map(int, k)) for k in keys} == expected


@pytest.mark.parametrize(("order", "kind"), [("day", "date"), ("ts", "timestamptz"), ("lt", "timestamp")])
def test_date_and_timestamp_keys_in_query_mode_give_the_scan_twins_bytes_and_come_back_as_such(
    ticks: str, tmp_path: Path, order: str, kind: str
) -> None:
    """A date-ordered scan config's query-mode twin: its keys query returns the date (or timestamp) itself."""
    if order == "lt":  # a timestamp without time zone
        execute(ticks, "ALTER TABLE ticks ADD COLUMN lt timestamp", "UPDATE ticks SET lt = ts AT TIME ZONE 'UTC'")
    scan = dump(
        scan_config(tmp_path / "scan", table="ticks", key=["series_id"], order=order, window=4, stride=3), ticks
    )
    twin = dump(twin_config(tmp_path / "twin", 4, 3, order=order), ticks)
    assert scan.n_samples == twin.n_samples > 0
    assert chunk_bytes(scan.path) == chunk_bytes(twin.path)
    for result in (scan, twin):
        ds = EpochArrays(result.path.parent, 0, consumer=None)
        assert ds.manifest["key_types"] == ["int", kind]
        keys = [k for i in range(len(ds)) for k in ds.sample_keys(i)]
        rows = fetch(ticks, f"SELECT series_id, {order} AS o, label FROM ticks ORDER BY series_id, {order}")
        starts = {(r["series_id"], r["o"]): r["label"] for r in rows}
        assert all((sid, o) in starts for sid, o in keys)  # the database's own values: date, datetime
        assert {type(o) for _, o in keys} == {dt.date if kind == "date" else dt.datetime}
        assert ds[0]["y"][:, 0].tolist() == [starts[k] for k in ds.sample_keys(0)]


def test_series_shorter_than_a_window_give_no_samples(ticks: str, tmp_path: Path) -> None:
    cfg = scan_config(tmp_path, table="ticks", key=["series_id"], order="t", window=100, size=1)
    result = dump(cfg, ticks)
    lengths = [r[0] for r in fetch(ticks, "SELECT count(*) FROM ticks GROUP BY series_id")]
    assert result.n_samples == sum(n - 99 for n in lengths if n >= 100)


def test_several_epochs_come_from_one_read(ticks: str, tmp_path: Path) -> None:
    cfg = scan_config(tmp_path, table="ticks", key=["series_id"], order="t", window=8)
    n_rows = fetch(ticks, "SELECT count(*) FROM ticks")[0][0]
    reads = "SELECT pg_stat_force_next_flush(), seq_tup_read FROM pg_stat_user_tables WHERE relname = 'ticks'"
    before = fetch(ticks, reads)[0][1]
    out = CliRunner().invoke(cli, ["dump", "--config", str(cfg), "--epochs", "0-3", "--dsn", ticks, "--json"]).stdout
    results = [json.loads(line) for line in out.splitlines()]
    assert [r["rows_read"] for r in results] == [n_rows, 0, 0, 0]
    fetch(ticks, "SELECT pg_stat_force_next_flush()")
    after = fetch(ticks, reads)[0][1]
    assert after - before <= 1.1 * n_rows  # read once for four epochs (the counter is the server's)
    snapshots = {
        json.loads((tmp_path / "store.zarr" / f"epoch-{e:05d}" / "zarr.json").read_text())["attributes"]["pgprefetch"][
            "snapshot"
        ]
        for e in range(4)
    }
    assert len(snapshots) == 1
    epochs = [read_arrays_of(tmp_path / "store.zarr", e)["keys"] for e in range(4)]
    assert not np.array_equal(epochs[0], epochs[1])  # each epoch has its own order


def read_arrays_of(store: Path, epoch: int) -> dict[str, np.ndarray]:
    import zarr

    g = zarr.open_group(store / f"epoch-{epoch:05d}", mode="r")
    return {name: g[name][:] for name in g.array_keys() if not name.startswith("_")}  # data, not bookkeeping


def test_check_runs_a_scan_config_without_writing(ticks: str, tmp_path: Path) -> None:
    cfg = scan_config(tmp_path, table="ticks", key=["series_id"], order="t", window=8, stride=4)
    result = CliRunner().invoke(cli, ["check", "--config", str(cfg), "--dsn", ticks, "--json"])
    report = json.loads(result.output)
    twin = dump(twin_config(tmp_path / "twin", 8, 4), ticks)
    assert result.exit_code == 0, result.output
    assert (report["n_samples"], report["n_batches"]) == (twin.n_samples, twin.n_batches)
    assert report["fields"] == {"x": {"dtype": "float32", "shape": [8, 2]}, "y": {"dtype": "int64", "shape": [8]}}
    assert not (tmp_path / "store.zarr").exists()
    execute(ticks, "ALTER TABLE ticks ALTER COLUMN f1 DROP NOT NULL", "UPDATE ticks SET f1 = NULL")
    result = CliRunner().invoke(cli, ["check", "--config", str(cfg), "--dsn", ticks, "--batches", "2"])
    assert result.exit_code == 1
    assert result.output.count("column f1 is NULL") == 1  # one line over the two batches alike
    assert "error: 2 of 2 checked batches (0, 16), e.g. batch 0: " in result.output
