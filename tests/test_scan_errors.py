"""Scan mode's errors: bad data and configs are one line naming the series, the key or the column.

Over the ``ticks`` fixture's tables (tests/harness/db.py): repeated order values and keys, NULLs in a sample
(and outside every sample, ignored), irregular arrays, and the config mistakes found before or by the server.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pgprefetch.errors import ConfigError, SampleError

from .harness.configs import scan_config
from .harness.db import execute, fetch
from .harness.dumps import dump, run_cli


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


@pytest.mark.parametrize(
    ("value", "shown"),
    [("swim", "'swim'"), ("swim\n" + "z" * 300, repr("swim\n" + "z" * 75) + "...")],
    ids=["short", "long-with-a-newline"],
)
def test_a_value_outside_the_categories_is_named_with_its_sample(
    db: str, tmp_path: Path, value: str, shown: str
) -> None:
    """The COPY codes a value outside the list as -1, so the dump looks it up in the same snapshot to name it.

    As query mode names it: the sample, the field, the column and the value (cut to 80 characters, escaped:
    one line however long or many-lined the value); ``check`` names it too.
    """
    execute(
        db,
        "CREATE TABLE moves (series int NOT NULL, t int NOT NULL, kind text NOT NULL, v real NOT NULL)",
        "INSERT INTO moves SELECT s, t, (ARRAY['walk', 'run'])[t % 2 + 1], t FROM generate_series(1, 3) s, "
        "generate_series(0, 19) t",
    )
    fetch(db, "UPDATE moves SET kind = $1 WHERE series = 2 AND t = 13 RETURNING t", value)
    cfg = tmp_path / "moves.toml"
    cfg.write_text(
        '[samples]\ntable = "moves"\nkey = "series"\norder = "t"\nwindow = 5\nstride = 5\n\n'
        '[fields.kind]\ncolumns = ["kind"]\ndtype = "int8"\ncategories = ["walk", "run"]\n\n'
        '[fields.v]\ncolumns = ["v"]\ndtype = "float32"\n\n'
        '[batches]\nsize = 4\nseed = 0\ndrop_last = false\n\n[store]\npath = "store.zarr"\n',
        encoding="utf-8",
    )
    argv = [sys.executable, "-m", "pgprefetch", "dump", "--config", str(cfg), "--dsn", db, "--epoch", "0"]
    p = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert p.returncode != 0
    errors = [line for line in p.stderr.splitlines() if " pgprefetch INFO: " not in line]  # (the progress log)
    named = f"sample (series=2, t=10): field kind, column kind value {shown} is not in [fields.kind] categories"
    assert errors == [f"Error: {named}"], p.stderr
    code, out = run_cli("check", "--config", str(cfg), "--dsn", db, "--json")  # check names it as the dump does
    assert code == 1
    assert [e for e in json.loads(out.strip().splitlines()[0])["errors"] if e.endswith(named)], out
