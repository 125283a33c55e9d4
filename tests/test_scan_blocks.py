"""Runs of scalar columns of one type, decoded from the COPY stream as row-major blocks, give the same epochs.

A scan decodes consecutive columns of one wire type (a feature vector's ``real`` columns) in one pass into a
block whose columns the table keeps as views, and checks the stream's length words a run at a time. The
epoch must be the per-column decode's: the query-mode twin's bytes, rows and windows, NULLs (masks between
the columns) and a heap in random order (the block's rows reordered) included.
"""

from __future__ import annotations

import json
import pickle
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pgprefetch.errors import SampleError
from pgprefetch.write.scan.copystream import CopyDecoder
from pgprefetch.write.scan.table import _block_rows, _rows, assemble

from .harness.db import execute
from .harness.dumps import chunk_bytes, dump

COLUMNS = "a, b, c, n, p, q, r, label"
FIELDS: dict[str, tuple[list[str], str, dict[str, Any]]] = {
    "x": (["a", "b", "c"], "float32", {}),  # three real NOT NULL: one block
    "n": (["n"], "int64", {}),
    "w": (["p", "q", "r"], "float64", {"null": "nan"}),  # p, q nullable (a mask after each), r not: runs of 2 and 1
    "y": (["label"], "int64", {}),
}


@pytest.fixture
def feats(db: str) -> str:
    execute(
        db,
        """CREATE TABLE feats (id int8 PRIMARY KEY, s int NOT NULL, t int NOT NULL, a real NOT NULL,
           b real NOT NULL, c real NOT NULL, n int4 NOT NULL, p float8, q float8, r float8 NOT NULL,
           label int NOT NULL)""",
        """INSERT INTO feats SELECT i, i % 7, i / 7, i * 0.5, -i * 0.25, i % 11, i % 13,
                  CASE WHEN i % 5 = 0 THEN NULL ELSE i * 1.5 END, CASE WHEN i % 9 = 0 THEN NULL ELSE -i END,
                  i / 3.0, i % 4
           FROM generate_series(1, 900) i ORDER BY random()""",
    )
    return db


def _config(folder: Path, samples: dict[str, Any], rows: int | None = None) -> Path:
    lines = ["[source]", "connections = 3", "[samples]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in samples.items()]
    lines += [f"rows = {rows}"] if rows else []
    lines += ["[batches]", "size = 32", "seed = 5", "drop_last = false", "[store]", 'path = "store.zarr"']
    for name, (columns, dtype, options) in FIELDS.items():
        lines += [f"[fields.{name}]", f"columns = {json.dumps(columns)}", f'dtype = "{dtype}"']
        lines += [f"{k} = {json.dumps(v)}" for k, v in options.items()]
    folder.mkdir(parents=True)
    (folder / "c.toml").write_text("\n".join(lines) + "\n")
    return folder / "c.toml"


def test_rows_of_column_runs_are_the_query_mode_twin_s_bytes(feats: str, tmp_path: Path) -> None:
    scan = dump(_config(tmp_path / "scan", {"table": "feats", "key": ["id"]}), feats)
    query = f"SELECT {COLUMNS} FROM feats WHERE id = $1"
    twin = dump(_config(tmp_path / "twin", {"keys": "SELECT id FROM feats", "query": query}), feats)
    assert scan.n_samples == twin.n_samples == 900
    assert chunk_bytes(scan.path) == chunk_bytes(twin.path)


def test_windows_of_column_runs_are_the_query_mode_twin_s_bytes(feats: str, tmp_path: Path) -> None:
    scan = dump(_config(tmp_path / "scan", {"table": "feats", "key": ["s"], "order": "t", "window": 6}), feats)
    keys = """SELECT s, t FROM (SELECT s, t, row_number() OVER (PARTITION BY s ORDER BY t) AS i,
              count(*) OVER (PARTITION BY s) AS n FROM feats) w WHERE i + 6 - 1 <= n"""
    query = f"SELECT {COLUMNS} FROM feats WHERE s = $1 AND t >= $2 ORDER BY t LIMIT 6"
    twin = dump(_config(tmp_path / "twin", {"keys": keys, "query": query}, rows=6), feats)
    assert scan.n_samples == twin.n_samples > 0
    assert chunk_bytes(scan.path) == chunk_bytes(twin.path)


def _stream(rows: list[list[tuple[int, bytes]]]) -> bytes:
    """A binary COPY stream of ``rows``, each a list of (length word, value bytes)."""
    out = bytearray(b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00")
    for row in rows:
        out += len(row).to_bytes(2, "big")
        for length, value in row:
            out += length.to_bytes(4, "big", signed=True) + value
    return bytes(out + b"\xff\xff")


REAL = np.dtype(">f4")


@dataclass(frozen=True)
class _Column:
    """What the decoder asks of a column: a ``real``, scalar, NOT NULL."""

    name: str
    wire: np.dtype = REAL
    is_array: bool = False
    padded: int | None = None
    nullable: bool = False
    is_bytes: bool = False


def _shape(n_columns: int) -> Any:
    columns = [_Column(f"v{j}") for j in range(n_columns)]
    return types.SimpleNamespace(
        key_wire=(np.dtype(">i8"),), order_wire=None, order_offset=0, columns=columns, key_names=["id"]
    )


def _row(key: int, values: list[float]) -> list[tuple[int, bytes]]:
    return [(8, key.to_bytes(8, "big"))] + [(4, np.array(v, ">f4").tobytes()) for v in values]


def test_a_run_decodes_to_the_values_column_by_column() -> None:
    rows = [_row(k, [k + 0.5 * j for j in range(5)]) for k in range(100)]
    decoder = CopyDecoder(_shape(5), drain_bytes=1000)  # drained every few rows: runs cut across chunks
    stream = _stream(rows)
    for i in range(0, len(stream), 333):
        if decoder.feed(stream[i : i + 333]):
            decoder.drain()
    parts = decoder.finish()
    assert len(parts) > 5
    assert all(p["b0"].flags.c_contiguous for p in parts)
    assert all("c0" not in p for p in parts)
    block = np.concatenate([p["b0"] for p in parts])
    assert block.dtype == np.dtype("=f4")
    assert np.array_equal(block, np.array([[k + 0.5 * j for j in range(5)] for k in range(100)], dtype=np.float32))
    assert np.array_equal(np.concatenate([p["k0"] for p in parts]), np.arange(100))


@pytest.mark.parametrize("where", [0, 3, 4])
def test_a_wrong_length_word_inside_a_run_is_caught(where: int) -> None:
    rows = [_row(k, [float(k)] * 5) for k in range(50)]
    length, value = rows[37][1 + where]
    rows[37][1 + where] = (length + 1, value)  # a length word that lies: the rows still line up, only the check sees it
    decoder = CopyDecoder(_shape(5))
    decoder.feed(_stream(rows))
    with pytest.raises(SampleError):
        decoder.finish()


@pytest.mark.parametrize("window", [1, 4])
def test_a_block_s_rows_are_gathered_as_its_columns_would_be(window: int) -> None:
    rows = [_row(k, [k + 0.5 * j for j in range(5)]) for k in range(60)]
    decoder = CopyDecoder(_shape(5))
    decoder.feed(_stream(rows))
    table = assemble(_shape(5), decoder.finish())
    ((block, columns),) = table.blocks()
    assert [i for _, i in columns] == list(range(5))
    starts = np.array([7, 0, 56 - window + 1, 31])
    gathered = _block_rows(block, starts, window)
    for c, i in columns:
        assert np.array_equal(gathered[:, i], _rows(np.ascontiguousarray(table.values[c]), starts, window))
    assert pickle.loads(pickle.dumps(table)).blocks() == []  # Ray's copy: each column on its own


def test_a_value_that_does_not_fit_is_named_when_a_field_s_columns_are_cast_as_one_block(
    db: str, tmp_path: Path
) -> None:
    execute(
        db,
        "CREATE TABLE wide_ints (id int8 PRIMARY KEY, i0 int4 NOT NULL, i1 int4 NOT NULL, i2 int4 NOT NULL)",
        "INSERT INTO wide_ints SELECT i, i, -i, CASE WHEN i = 77 THEN 40000 ELSE i END FROM generate_series(1, 200) i",
    )
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[samples]\ntable = "wide_ints"\nkey = ["id"]\n[fields.x]\ncolumns = ["i0", "i1", "i2"]\ndtype = "int16"\n'
        '[batches]\nsize = 16\nseed = 1\n[store]\npath = "store.zarr"\n'
    )
    with pytest.raises(SampleError, match=r"sample \(id=77\): field x, column i2 value 40000 does not fit int16"):
        dump(cfg, db)
