"""Each supported column type survives the trip from PostgreSQL into the batch arrays."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.datasets import ROWS
from pgprefetch import load_config

from .harness.configs import write_config
from .harness.db import execute, fetch
from .harness.dumps import dump, read_arrays

N = 48


def test_every_supported_column_type_round_trips(db: str, tmp_path: Path) -> None:
    execute(
        db,
        """CREATE TABLE t (
            id bigint PRIMARY KEY, b bool, i2 smallint, i4 integer, i8 bigint, f4 real, f8 double precision,
            n numeric(12, 3), d date, ts timestamp, tstz timestamptz,
            fa real[], ia integer[], na numeric[], ba boolean[]
        )""",
        """INSERT INTO t SELECT i, i % 2 = 0, -i, i * 1000, i * 10000000000, i / 4.0, i / 3.0,
            i * 1.125, date '2024-01-01' + i, timestamp '2024-03-01 12:00:00' + i * interval '1 second',
            timestamptz '2024-03-01 12:00:00+00' + i * interval '1 millisecond',
            ARRAY[i, i + 0.5, -i]::real[], ARRAY[i, 2 * i], ARRAY[i * 0.25, 1], ARRAY[i % 3 = 0, true]
           FROM generate_series(1, 48) i""",
    )
    fields = {
        "b": (["b"], "bool"),
        "i2": (["i2"], "int16"),
        "i4": (["i4"], "int32"),
        "i8": (["i8"], "int64"),
        "f4": (["f4"], "float32"),
        "f8": (["f8"], "float64"),
        "n": (["n"], "float64"),
        "d": (["d"], "int32"),
        "ts": (["ts"], "int64"),
        "tstz": (["tstz"], "int64"),
        "fa": (["fa"], "float32"),
        "ia": (["ia"], "int64"),
        "na": (["na"], "float32"),
        "ba": (["ba"], "uint8"),
        "mixed": (["i2", "f8", "n"], "float32"),  # smallint, double and numeric cast into one float32 field
    }
    query = "SELECT b, i2, i4, i8, f4, f8, n, d, ts, tstz, fa, ia, na, ba FROM t WHERE id = $1"
    config = write_config(tmp_path, keys="SELECT id FROM t", query=query, fields=fields, size=16)
    a = read_arrays(dump(config, db))
    i = a["keys"].reshape(-1).astype(np.int64)
    flat = {name: v.reshape(N, *v.shape[2:]) for name, v in a.items()}

    np.testing.assert_array_equal(flat["b"], i % 2 == 0)
    np.testing.assert_array_equal(flat["i2"], -i)
    np.testing.assert_array_equal(flat["i4"], i * 1000)
    np.testing.assert_array_equal(flat["i8"], i * 10_000_000_000)
    np.testing.assert_array_equal(flat["f4"], (i / 4.0).astype(np.float32))
    np.testing.assert_allclose(flat["f8"], i / 3.0, rtol=1e-15)
    np.testing.assert_allclose(flat["n"], i * 1.125)
    days = np.array([(date(2024, 1, 1).toordinal() + int(k)) - date(1970, 1, 1).toordinal() for k in i])
    np.testing.assert_array_equal(flat["d"], days)
    ts0 = int(datetime(2024, 3, 1, 12, tzinfo=UTC).timestamp()) * 1_000_000
    np.testing.assert_array_equal(flat["ts"], ts0 + i * 1_000_000)
    np.testing.assert_array_equal(flat["tstz"], ts0 + i * 1_000)
    np.testing.assert_array_equal(flat["fa"], np.stack([i, i + 0.5, -i], axis=1).astype(np.float32))
    np.testing.assert_array_equal(flat["ia"], np.stack([i, 2 * i], axis=1))
    np.testing.assert_array_equal(flat["na"], np.stack([i * 0.25, np.ones(N)], axis=1).astype(np.float32))
    np.testing.assert_array_equal(flat["ba"], np.stack([i % 3 == 0, np.ones(N, bool)], axis=1).astype(np.uint8))
    np.testing.assert_allclose(flat["mixed"], np.stack([-i, i / 3.0, i * 1.125], axis=1).astype(np.float32))
    assert flat["fa"].dtype == np.float32
    assert a["mixed"].shape == (3, 16, 3)


def test_every_type_decodes_the_same_from_the_row_wise_statement(db: str, tmp_path: Path) -> None:
    # A text field of any length makes the batch statement row-wise (a row per sample, each value's send
    # bytes); the other fields must come out byte-identical to the aggregated statement's.
    execute(
        db,
        """CREATE TABLE t (id bigint PRIMARY KEY, b bool, i2 smallint, i8 bigint, f4 real, n numeric, d date,
            ts timestamp, tstz timestamptz, ia integer[], q int, tag text, title text NOT NULL)""",
        """INSERT INTO t SELECT i, i % 2 = 0, -i, i * 10000000000, i / 4.0, i * 1.125, date '2024-01-01' + i,
            timestamp '2024-03-01 12:00:00' + i * interval '1 second', timestamptz '2024-03-01 12:00:00+00' + i
            * interval '1 ms', ARRAY[i, 2 * i], CASE WHEN i % 5 > 0 THEN i END, CASE WHEN i % 2 = 0 THEN 'even'
            ELSE 'odd' END, repeat('é', i % 7) FROM generate_series(1, 48) i""",
    )
    fields: dict[str, tuple[Any, ...]] = {
        name: ([name], dtype)
        for name, dtype in [
            ("b", "bool"),
            ("i2", "int16"),
            ("i8", "int64"),
            ("f4", "float32"),
            ("n", "float64"),
            ("d", "int32"),
            ("ts", "int64"),
            ("tstz", "int64"),
            ("ia", "int32"),
        ]
    }
    fields |= {"q": (["q"], "int32", {"null": -1}), "tag": (["tag"], "int8", {"categories": ["even", "odd"]})}
    query = "SELECT * FROM t WHERE id = $1"
    aggregated = read_arrays(
        dump(write_config(tmp_path, keys="SELECT id FROM t", query=query, fields=fields, size=16, name="a.toml"), db)
    )
    fields["title"] = (["title"], "uint8", {"max_length": 9, "truncate": "right"})
    config = write_config(tmp_path, keys="SELECT id FROM t", query=query, fields=fields, size=16, store="r.zarr")
    row_wise = read_arrays(dump(config, db))
    assert set(row_wise) == {*aggregated, "title", "title_length"}
    for name, array in aggregated.items():
        np.testing.assert_array_equal(row_wise[name], array, err_msg=name)
    keys = row_wise["keys"].reshape(-1)
    assert (row_wise["q"].reshape(-1) == np.where(keys % 5 > 0, keys, -1)).all()
    assert (row_wise["title_length"].reshape(-1) == 2 * np.minimum(keys % 7, 4)).all()


def test_the_bench_rows_dataset_dumps_what_the_database_holds(demo_db: str, tmp_path: Path) -> None:
    # The benchmark's own config: real[16], numeric and integer into float32, date, bigint; 8 connections,
    # batches of 1024, drop_last = false (4,500 train rows here: four full batches and 404 samples).
    config = tmp_path / "rows.toml"
    config.write_text(ROWS.config(tmp_path / "rows.zarr"))
    result = dump(config, demo_db)
    a = read_arrays(result)
    rows = fetch(demo_db, "SELECT id, emb, price, qty, day, label FROM items JOIN train_items USING (id)")
    assert (result.n_samples, result.n_batches) == (len(rows), 5)
    assert load_config(config).source.connections == 8
    n = result.n_samples
    flat = {name: v.reshape(-1, *v.shape[2:]) for name, v in a.items()}
    keys = flat["keys"][:n, 0]
    assert sorted(keys.tolist()) == sorted(r["id"] for r in rows)
    by_id = {r["id"]: r for r in rows}
    truth = [by_id[int(k)] for k in keys]
    np.testing.assert_array_equal(flat["emb"][:n], np.array([r["emb"] for r in truth], dtype=np.float32))
    features = np.array([(float(r["price"]), r["qty"]) for r in truth], dtype=np.float64).astype(np.float32)
    np.testing.assert_array_equal(flat["features"][:n], features)
    np.testing.assert_array_equal(flat["day"][:n], [(r["day"] - date(1970, 1, 1)).days for r in truth])
    np.testing.assert_array_equal(flat["label"][:n], [r["label"] for r in truth])
    assert flat["emb"].shape == (5 * 1024, 16)
    for name, array in flat.items():  # the padding after the last real sample
        assert not array[n:].any(), name
