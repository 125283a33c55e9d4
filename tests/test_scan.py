"""Scan mode: one read of the table per epoch, samples cut on the client, byte-identical to the query mode."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
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
from pgprefetch.errors import ConfigError, SampleError
from pgprefetch.write.scan.table import _is_sorted

from .harness.configs import scan_config
from .harness.db import execute, fetch
from .harness.dumps import chunk_bytes, dump, read_arrays
from .harness.properties import EXTREMES

SERIES = 40  # series of 1..120 rows (some shorter than a window)


@pytest.fixture
def ticks(db: str) -> str:
    """``ticks(series_id, part, t, ts, day, f0, f1, label)``: series of varying length, rows in random heap order."""
    execute(
        db,
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
    return db


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


def test_two_rows_of_a_series_with_one_order_value_name_the_series(ticks: str, tmp_path: Path) -> None:
    execute(
        ticks,
        "INSERT INTO ticks SELECT series_id, part, t, ts, day, f0, f1, label FROM ticks WHERE series_id = 7 AND t = 3",
    )
    cfg = scan_config(tmp_path, table="ticks", key=["series_id"], order="t", window=4)
    with pytest.raises(SampleError) as e:
        dump(cfg, ticks)
    assert str(e.value) == "series (series_id=7) has two rows with t = 3: a series' rows need distinct order values"


def test_a_repeated_row_key_is_named(ticks: str, tmp_path: Path) -> None:
    execute(ticks, "ALTER TABLE items DROP CONSTRAINT items_pkey", "INSERT INTO items SELECT * FROM items WHERE id = 9")
    with pytest.raises(SampleError, match=r"^\[samples\] table returned 1 repeated key\(s\), e.g. \(id=9\)"):
        dump(scan_config(tmp_path, table="items", key="id", fields={"p": (["price"], "float32")}), ticks)


def test_a_null_in_a_sample_row_is_named_and_outside_every_sample_ignored(ticks: str, tmp_path: Path) -> None:
    execute(ticks, "ALTER TABLE ticks ALTER COLUMN f0 DROP NOT NULL")
    execute(ticks, "UPDATE ticks SET f0 = NULL WHERE series_id = 2 AND t = 7")  # windows of 5 every 10: unused
    windows = {"table": "ticks", "key": ["series_id"], "order": "t", "window": 5, "stride": 10, "size": 1000}
    dump(scan_config(tmp_path / "a", **windows), ticks)  # no sample holds the NULL: no error, as in the query mode
    execute(ticks, "UPDATE ticks SET f0 = NULL WHERE series_id = 3 AND t = 1")
    with pytest.raises(SampleError) as e:
        dump(scan_config(tmp_path / "b", **windows), ticks)
    assert str(e.value) == (
        'sample (series_id=3, t=1): field x, column f0 is NULL (1 NULL in this batch); set [fields.x] null = "nan" '
        "or a fill value to keep NULLs"
    )


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        (
            {"table": "ticks", "keys": "SELECT 1", "key": "series_id"},
            '[samples]: give either "keys" and "query" (query mode) or "table" (scan mode), not both',
        ),
        (
            {"table": "ticks", "key": "series_id", "window": 4},
            "[samples] order: windows need the column that orders a series' rows",
        ),
        (
            {"table": "ticks", "key": "series_id", "stride": 2},
            "[samples] stride: only windows have it: set window too, or remove it",
        ),
        (
            {"table": "ticks; DROP TABLE x", "key": "series_id"},
            '[samples] table: expected a table or view name (schema.name), or a SELECT; got "ticks; DROP TABLE x"',
        ),
        (
            {"table": "ticks", "key": "series_id", "order": "series_id", "window": 2},
            '[samples] order: "series_id" is a key column too',
        ),
    ],
)
def test_scan_config_errors_are_one_line(tmp_path: Path, samples: dict[str, Any], message: str) -> None:
    cfg = scan_config(tmp_path, **samples)
    with pytest.raises(ConfigError) as e:
        dump(cfg, "postgresql://unused")
    assert str(e.value) == f"{cfg}: {message}"


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        (
            {"table": "ticks", "key": "f0"},
            '[samples] key: column "f0" is float4; scan mode keys must be integer columns (smallint, integer, bigint)',
        ),
        (
            {"table": "ticks", "key": "series_id", "order": "f1", "window": 2},
            '[samples] order: column "f1" is float8; expected an integer, date, timestamp or timestamptz column',
        ),
        (
            {"table": "ticks", "key": "nope"},
            '[samples] table: no column "nope" (it has series_id, part, t, ts, day, f0, f1, label)',
        ),
        ({"table": "nope", "key": "id"}, '[samples] table: relation "nope" does not exist'),
    ],
)
def test_scan_errors_found_by_the_server_are_one_line(
    ticks: str, tmp_path: Path, samples: dict[str, Any], message: str
) -> None:
    cfg = scan_config(tmp_path, **samples)
    with pytest.raises(ConfigError) as e:
        dump(cfg, ticks)
    assert str(e.value) == f"{cfg}: {message}"
    assert not (tmp_path / "store.zarr").exists()


SLOW = "SELECT series_id, t, f0, f1, label, pg_sleep(0.0005) AS pause FROM ticks"  # a COPY of about 1.2 s


def test_a_connection_terminated_mid_scan_is_retried(ticks: str, tmp_path: Path) -> None:
    import asyncio
    import threading
    import time

    from pgprefetch import dump_epoch, load_config
    from pgprefetch.pg.retry import RetryPolicy

    from .harness.faults import kill_every_connection

    cfg = scan_config(tmp_path / "a", table=SLOW, key=["series_id"], order="t", window=8)
    killer = threading.Timer(0.6, kill_every_connection, args=(ticks,))
    killer.start()
    started = time.monotonic()
    result = asyncio.run(dump_epoch(load_config(cfg, dsn=ticks), 0, retries=RetryPolicy(first_wait=0.1)))
    killer.join()
    assert time.monotonic() - started > 0.6
    assert result.retries == 1
    assert result.retry_causes == {"terminated": 1}
    clean = dump(scan_config(tmp_path / "b", table="ticks", key=["series_id"], order="t", window=8), ticks)
    assert chunk_bytes(result.path) == chunk_bytes(clean.path)


@pytest.mark.parametrize("moment", ["reading", "writing"])
def test_kill_9_mid_scan_then_rerun_gives_the_clean_bytes(ticks: str, tmp_path: Path, moment: str) -> None:
    import time

    from .harness.dumps import dump_argv, journal_lines, wait_for

    table = SLOW if moment == "reading" else "ticks"
    # Writing: batches of two samples, compressed: milliseconds each through zarr, so the dump is still
    # writing when it is killed (uncompressed, units of up to 512 such batches would write it all at once).
    settings = {"key": ["series_id"], "order": "t", "window": 2, "size": 1 if moment == "reading" else 2}
    settings["compression"] = "none" if moment == "reading" else "zstd"
    cfg = scan_config(tmp_path / "a", table=table, **settings)
    store = tmp_path / "a" / "store.zarr"
    proc = subprocess.Popen(dump_argv(cfg, ticks), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if moment == "reading":
        time.sleep(1.5)  # started, connected, in the middle of the COPY
    else:
        wait_for(lambda: journal_lines(store) >= 20)
    proc.kill()
    proc.communicate()
    assert not (store / "epoch-00000").exists()
    rerun = subprocess.run([*dump_argv(cfg, ticks), "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert rerun.returncode == 0, rerun.stderr
    summary = json.loads(rerun.stdout)
    assert (summary.get("resumed_batches", 0) > 0) == (moment == "writing")
    clean = dump(scan_config(tmp_path / "b", table="ticks", **settings), ticks)
    assert chunk_bytes(store / "epoch-00000") == chunk_bytes(clean.path)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_table_larger_than_memory_is_read_in_passes_and_gives_the_same_bytes(
    db: str, tmp_path: Path, compression: str
) -> None:
    execute(
        db,
        "CREATE TABLE big (series_id int, t int, f0 real NOT NULL, f1 float8 NOT NULL, label int NOT NULL)",
        """INSERT INTO big SELECT s, t, s + t * 0.5, s * 1000 + t / 3.0, (s * 7 + t) % 5
           FROM generate_series(1, 200) s, generate_series(1, 300 + s % 17) t ORDER BY random()""",
        "CREATE INDEX ON big (series_id, t)",
    )  # about 63,000 rows: 3.3 MB as COPY sends them
    windows = {"table": "big", "key": ["series_id"], "order": "t", "window": 16, "stride": 3, "fraction": 0.8}
    whole = dump(scan_config(tmp_path / "whole", **windows), db)
    small = scan_config(tmp_path / "small", **windows, extra='memory = "1MiB"', compression=compression)
    passes = dump(small, db)
    assert passes.rows_read is not None
    # The keys pass, then the data passes (an index serves them); more when the first read outgrew memory
    # before the passes began (a table ANALYZE has not counted yet).
    assert passes.rows_read >= 2 * whole.rows_read
    assert not (tmp_path / "small" / "store.zarr" / ".pgprefetch" / "spool" / "epoch-00000").exists()
    got = read_arrays(passes)
    for name, array in read_arrays(whole).items():
        np.testing.assert_array_equal(got[name], array)


def test_a_table_analyze_counted_past_memory_goes_straight_to_the_passes(db: str, tmp_path: Path) -> None:
    execute(
        db,
        "CREATE TABLE wide (id int8 PRIMARY KEY, a real NOT NULL, b real NOT NULL, label int NOT NULL)",
        "INSERT INTO wide SELECT i, i * 0.5, i % 13, i % 7 FROM generate_series(1, 200000) i ORDER BY random()",
        "ANALYZE wide",
    )  # 200,000 rows of 20 decoded bytes: 4 MB against 1 MiB of memory
    rows = {"table": "wide", "key": ["id"], "fields": {"x": (["a", "b"], "float32"), "y": (["label"], "int64")}}
    whole = dump(scan_config(tmp_path / "whole", **rows), db)
    passes = dump(scan_config(tmp_path / "small", **rows, extra='memory = "1MiB"'), db)
    # The keys pass and the data passes only: no first read given up when it outgrew memory.
    assert passes.rows_read == 2 * whole.rows_read == 400_000
    got = read_arrays(passes)
    for name, array in read_arrays(whole).items():
        np.testing.assert_array_equal(got[name], array)


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


def test_a_null_key_and_an_irregular_array_are_named(ticks: str, tmp_path: Path) -> None:
    execute(ticks, "INSERT INTO ticks (series_id, t, f0, f1, label) VALUES (NULL, 1, 0, 0, 0)")
    with pytest.raises(SampleError) as e:
        dump(scan_config(tmp_path / "a", table="ticks", key=["series_id"], order="t", window=4), ticks)
    assert str(e.value) == '[samples] table: a row has a NULL in column "series_id"'
    execute(ticks, "UPDATE items SET emb = ARRAY[1, 2] WHERE id = 350")
    with pytest.raises(SampleError) as e:
        dump(scan_config(tmp_path / "b", table="items", key="id", fields={"emb": (["emb"], "float32")}), ticks)
    assert str(e.value) == (
        "[samples] table: a row's emb is a NULL array, holds a NULL or has another length than the first row's "
        "(scan mode needs every row's arrays to have one length)"
    )
