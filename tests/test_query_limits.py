"""Query mode's memory is bounded by max_length and rows, not by the values or rows a sample has (#36.9).

A 100 MB array cut to 16 elements, or a sample of 20 million rows where one is expected, must not reach
the client whole: the server cuts values to what is kept (one element more under ``truncate = "error"``)
and stops a sample's rows one past what tells it has too many. Each test runs a real ``pgprefetch dump``
in a subprocess and reads its peak resident memory from ``wait4``; a small dump of the same shape run
first is the baseline, so the bound holds whatever the machine's Python and libraries take.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.harness.configs import write_config
from tests.harness.db import execute, fetch
from tests.harness.dumps import dump as dump_in_process
from tests.harness.dumps import read_arrays

MIB = 1 << 20
BIG = 20 * MIB  # each big value: 20 MB (5M real elements, 20M bytes of text and bytea)
CHARACTERS = "aé日🎉"  # 1..4-byte UTF-8 characters: a cut at 16 bytes lands inside some


def peak_dump(cfg: Path, dsn: str) -> tuple[int, str, int]:
    """``pgprefetch dump`` of epoch 0 in a subprocess: exit code, stderr, peak RSS in bytes.

    The child is waited for with ``wait4``, which gives its own peak (not that of every child so far).
    """
    argv = [sys.executable, "-m", "pgprefetch", "dump", "--config", str(cfg), "--epoch", "0", "--dsn", dsn]
    with open(cfg.parent / "stderr.txt", "wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, cwd=cfg.parent)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, (cfg.parent / "stderr.txt").read_text(), usage.ru_maxrss * 1024


@pytest.fixture
def big(db: str) -> str:
    """``big(id, a real[], t text, b bytea)``: 4 rows of 20 MB values (compressed on disk) and 4 small ones."""
    n = BIG // 4
    text_repeat = BIG // len(CHARACTERS.encode())
    execute(
        db,
        "CREATE TABLE big (id int PRIMARY KEY, a real[], t text, b bytea)",
        f"INSERT INTO big SELECT g, array_fill((g * 1.5)::real, ARRAY[{n}]), repeat('{CHARACTERS}', {text_repeat}),"
        f" decode(repeat('0102', {BIG // 2}), 'hex') FROM generate_series(1, 4) g",
        "INSERT INTO big SELECT g, ARRAY[g, g + 1]::real[], 'é' || g, '\\x0304' FROM generate_series(101, 104) g",
    )
    return db


def big_config(folder: Path, ids: str, *, truncate: str = "right", size: int = 4) -> Path:
    opts = {"max_length": 16, "truncate": truncate}
    return write_config(
        folder,
        keys=f"SELECT id FROM big WHERE id {ids}",
        query="SELECT a, t, b FROM big WHERE id = $1",
        fields={"a": (["a"], "float32", opts), "t": (["t"], "uint8", opts), "b": (["b"], "uint8", opts)},
        size=size,
        connections=1,
    )


@pytest.mark.parametrize("truncate", ["right", "left"])
def test_big_values_cut_by_max_length_are_cut_on_the_server(big: str, tmp_path: Path, truncate: str) -> None:
    small_folder, big_folder = tmp_path / "small", tmp_path / "big"
    small_folder.mkdir()
    big_folder.mkdir()
    code, err, baseline = peak_dump(big_config(small_folder, "> 100", truncate=truncate), big)
    assert code == 0, err
    code, err, peak = peak_dump(big_config(big_folder, "<= 4", truncate=truncate), big)
    assert code == 0, err
    # Sent whole, the 4 samples are 4 x 60 MB on the wire (arrays with their element lengths: 40 MB each),
    # read into one batch: hundreds of MiB above the small dump. Cut on the server, they are 16 elements.
    assert peak - baseline < 48 * MIB, f"peak RSS {peak / MIB:.0f} MiB against {baseline / MIB:.0f} MiB"
    # The bytes are those the client's cut keeps from the whole values
    arrays = read_arrays(dump_in_process(big_config(tmp_path, "<= 4", truncate=truncate, size=4), big))
    stored = {name: v.reshape(-1, *v.shape[2:]) for name, v in arrays.items()}
    text = (CHARACTERS * (BIG // len(CHARACTERS.encode()))).encode()
    for i in range(4):
        assert stored["a_length"][i] == 16
        t = stored["t"][i][: stored["t_length"][i]].tobytes()
        assert t.decode("utf-8")  # whole characters only
        assert 12 < len(t) <= 16
        assert text.startswith(t) if truncate == "right" else text.endswith(t)
        assert stored["b"][i].tobytes() == bytes.fromhex("0102" * 8)
    values = np.sort(stored["a"][:, 0])
    assert values.tolist() == [g * 1.5 for g in range(1, 5)]


def test_a_big_value_longer_than_max_length_is_an_error_without_reading_it_whole(big: str, tmp_path: Path) -> None:
    folder = tmp_path / "small"
    folder.mkdir()
    code, err, baseline = peak_dump(big_config(folder, "> 100", truncate="error"), big)
    assert code == 0, err
    code, err, peak = peak_dump(big_config(tmp_path, "<= 4", truncate="error"), big)
    assert code != 0
    assert "field a, column a has more elements than max_length 16" in err, err
    assert "sample (id=" in err
    assert peak - baseline < 48 * MIB, f"peak RSS {peak / MIB:.0f} MiB against {baseline / MIB:.0f} MiB"


MANY = 3_000_000  # rows of one sample, where [samples] rows = 1


@pytest.fixture
def many(db: str) -> str:
    """``many(id, v)``: ids 1..64 one row each, id 7 with 3 million rows more."""
    execute(
        db,
        "CREATE TABLE many (id int, v float8)",
        "INSERT INTO many SELECT g, g FROM generate_series(1, 64) g",
        f"INSERT INTO many SELECT 7, g FROM generate_series(1, {MANY}) g",
        "CREATE INDEX ON many (id)",
        "ANALYZE many",
    )
    return db


@pytest.mark.parametrize("rows", [1, 2])
def test_a_sample_with_millions_of_rows_is_an_error_before_they_are_read(many: str, tmp_path: Path, rows: int) -> None:
    small_folder = tmp_path / "small"
    small_folder.mkdir()
    if rows == 2:
        execute(many, "INSERT INTO many SELECT g, -g FROM generate_series(1, 64) g")
    shape = {
        "query": "SELECT v FROM many WHERE id = $1",
        "fields": {"v": (["v"], "float64")},
        "size": 16,
        "rows": rows,
        "connections": 1,
    }
    base = write_config(small_folder, keys="SELECT id FROM many WHERE id BETWEEN 8 AND 23 GROUP BY id", **shape)
    code, err, baseline = peak_dump(base, many)
    assert code == 0, err
    cfg = write_config(tmp_path, keys="SELECT DISTINCT id FROM many WHERE id <= 16", **shape)
    code, err, peak = peak_dump(cfg, many)
    assert code != 0
    # Read whole, 3M rows are 36 MB of values and 24 MB of ordinals on the wire, then copies of them
    assert peak - baseline < 32 * MIB, f"peak RSS {peak / MIB:.0f} MiB against {baseline / MIB:.0f} MiB"
    assert f"sample (id=7): returned more than {rows} rows, expected {rows} ([samples] rows)" in err, err


def test_a_sample_with_too_many_rows_in_the_row_wise_statement_is_named(many: str, tmp_path: Path) -> None:
    # A text field makes the statement send a row per sample: the batch stops at one row more than its keys
    execute(many, "ALTER TABLE many ADD COLUMN t text DEFAULT 'x'")
    cfg = write_config(
        tmp_path,
        keys="SELECT DISTINCT id FROM many",
        query="SELECT t FROM many WHERE id = $1",
        fields={"t": (["t"], "uint8", {"max_length": 4})},
        size=16,
        connections=1,
    )
    code, err, _ = peak_dump(cfg, many)
    assert code != 0
    assert "sample (id=7): returned more than 1 rows, expected 1 ([samples] rows)" in err, err


@pytest.mark.parametrize("truncate", ["right", "left"])
@pytest.mark.parametrize("mode", ["query", "scan"])
def test_arrays_with_another_lower_bound_are_cut_to_their_own_first_or_last_elements(
    db: str, tmp_path: Path, truncate: str, mode: str
) -> None:
    """An array's subscripts need not start at 1 (``'[0:5]={...}'``): the cut keeps its first (last) elements.

    The server's slice must count from the array's own lower bound; ``[1:n]`` would drop element 0 of a
    0-based array and return nothing of one that starts at 7. What each sample holds is compared with
    what the database says its first (last) elements are, in both modes.
    """
    n = 3
    execute(
        db,
        "CREATE TABLE arr (id int PRIMARY KEY, a real[] NOT NULL)",
        "INSERT INTO arr VALUES (1, '[0:5]={10,11,12,13,14,15}'), (2, '[7:8]={20,21}'), (3, '{30,31,32,33}'),"
        " (4, '[-2:2]={40,41,42,43,44}'), (5, '{}'), (6, '[4:4]={60}')",
    )
    opts = {"max_length": n, "truncate": truncate}
    if mode == "query":
        cfg = write_config(
            tmp_path,
            keys="SELECT id FROM arr",
            query="SELECT a FROM arr WHERE id = $1",
            fields={"a": (["a"], "float32", opts)},
            size=6,
            connections=1,
        )
    else:
        cfg = tmp_path / "scan.toml"
        cfg.write_text(
            '[samples]\ntable = "arr"\nkey = ["id"]\n[fields.a]\ncolumns = ["a"]\ndtype = "float32"\n'
            f'max_length = {n}\ntruncate = "{truncate}"\n[batches]\nsize = 6\nseed = 0\n'
            '[store]\npath = "store.zarr"\n'
        )
    arrays = read_arrays(dump_in_process(cfg, db))
    ids = arrays["keys"].reshape(-1)
    got = arrays["a"].reshape(len(ids), n)
    order = "DESC" if truncate == "left" else "ASC"
    for sample, key in enumerate(ids):
        rows = fetch_values(db, order, int(key), n)
        expect = np.zeros(n, np.float32)
        kept = rows[::-1] if truncate == "left" else rows
        expect[: len(kept)] = kept
        assert got[sample].tolist() == expect.tolist(), (mode, truncate, int(key))


def fetch_values(dsn: str, order: str, key: int, n: int) -> list[float]:
    """The first (ASC) or last (DESC) ``n`` elements of arr ``key``'s array, as the database orders them."""
    sql = f"SELECT v FROM arr, unnest(a) WITH ORDINALITY AS u(v, i) WHERE id = $1 ORDER BY i {order} LIMIT $2"
    return [float(r["v"]) for r in fetch(dsn, sql, key, n)]
