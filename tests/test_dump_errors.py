"""Every way the database side can go wrong gives one clear line, the right exit code, and no epoch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pgprefetch.cli import cli
from pgprefetch.errors import ConfigError, SampleError, SourceError

from .harness.configs import v_config, write_config
from .harness.db import execute, fetch
from .harness.dumps import dump

ONE_COLUMN = {"v": (["v"], "float32")}


@pytest.fixture
def table(db: str) -> str:
    """``s(id, v, e)``: 64 rows, v = id, e = a real[3] array; ``w(id, k, v)``: 2 rows per id."""
    execute(
        db,
        "CREATE TABLE s (id int PRIMARY KEY, v real, e real[], name text)",
        "INSERT INTO s SELECT i, i, ARRAY[i, i, i], 'n' || i FROM generate_series(1, 64) i",
        "CREATE TABLE w (id int, k int, v real)",
        "INSERT INTO w SELECT i, k, i FROM generate_series(1, 64) i, generate_series(1, 2) k",
    )
    return db


def expect(error: type[Exception], message: str, tmp_path: Path, dsn: str, epoch: int = 0, **config: object) -> None:
    settings = {
        "keys": "SELECT id FROM s ORDER BY id",
        "query": "SELECT v FROM s WHERE id = $1",
        "fields": ONE_COLUMN,
        "size": 16,
        **config,
    }
    path = write_config(tmp_path, **settings)  # type: ignore[arg-type]
    with pytest.raises(error) as excinfo:
        dump(path, dsn, epoch=epoch)
    assert str(excinfo.value) == message.format(file=path)
    assert not (tmp_path / "store.zarr" / f"epoch-{epoch:05d}").exists()


NULL_HINT = 'set [fields.v] null = "nan" or a fill value to keep NULLs'
W = {"query": "SELECT v FROM w WHERE id = $1 ORDER BY k", "rows": 2}  # two rows a sample, from w
E = {"query": "SELECT e FROM s WHERE id = $1", "fields": {"e": (["e"], "float32")}}  # the real[3] column

# (id, statements run first, the error, its one line, the config's settings beside expect's): every way
# a dump fails on what the database holds or says, before any epoch is published.
ONE_LINE = [
    pytest.param(
        ("UPDATE s SET v = NULL WHERE id = 7",),
        SampleError,
        f"sample (id=7): field v, column v is NULL (1 NULL in this batch); {NULL_HINT}",
        {},
        id="null_value_names_the_key_field_and_column",
    ),
    pytest.param(
        ("DELETE FROM w WHERE id = 9 AND k = 2",),
        SampleError,
        "sample (id=9): returned 1 rows, expected 2 ([samples] rows)",
        W,
        id="too_few_rows_names_the_key",
    ),
    pytest.param(
        ("INSERT INTO w VALUES (5, 3, 5)",),
        SampleError,
        "sample (id=5): returned more than 2 rows, expected 2 ([samples] rows)",
        W,
        id="too_many_rows_names_the_key",
    ),
    pytest.param(
        (),
        SampleError,
        "sample (id=3): returned 0 rows, expected 1 ([samples] rows)",
        {"query": "SELECT v FROM s WHERE id = $1 AND id <> 3"},
        id="sample_without_rows_names_the_key",
    ),
    pytest.param(
        ("UPDATE s SET e = ARRAY[1, 2] WHERE id = 11",),
        SampleError,
        "sample (id=11): field e, column e has 2 elements, expected 3 (as in the first sample)",
        E,
        id="array_of_the_wrong_length_names_the_key",
    ),
    pytest.param(
        ("UPDATE s SET e = NULL WHERE id = 12",),
        SampleError,
        "sample (id=12): field e, column e is NULL (1 NULL in this batch)",
        E,
        id="null_array_names_the_key",
    ),
    pytest.param(
        (),
        SampleError,
        'keys query returned a NULL in key column "id" (row 65)',
        {"keys": "SELECT id FROM s UNION ALL SELECT NULL ORDER BY 1 NULLS LAST"},
        id="null_key_is_refused",
    ),
    pytest.param(
        (),
        ConfigError,
        '{file}: [samples] keys: key column "name" is text; '
        "keys must be integer (smallint, integer, bigint), uuid, date, timestamp or timestamptz columns",
        {"keys": "SELECT name FROM s"},
        id="non_integer_key_column_is_a_config_error",
    ),
    pytest.param(
        (),
        ConfigError,
        "{file}: [samples] query: uses $2 but keys returns 1 column(s) (id)",
        {"query": "SELECT v FROM s WHERE id = $1 AND id > $2"},
        id="parameter_beyond_the_key_columns_is_a_config_error",
    ),
    pytest.param(
        (),
        ConfigError,
        '{file}: [fields.v] columns: the query returns no column "w" (it returns v)',
        {"fields": {"v": (["w"], "float32")}},
        id="field_column_the_query_does_not_return",
    ),
    pytest.param(
        (),
        ConfigError,
        '{file}: [fields.v] columns: column "name" is text; text and bytea go to a uint8 field with max_length '
        "(as bytes, UTF-8 for text), or set categories for text labels",
        {"query": "SELECT name FROM s WHERE id = $1", "fields": {"v": (["name"], "float32")}},
        id="unsupported_column_type",
    ),
    pytest.param(
        (),
        ConfigError,
        '{file}: [samples] keys: syntax error at or near "s"',
        {"keys": "SELECT id FORM s"},
        id="syntax_error_in_keys",
    ),
    pytest.param(
        (),
        ConfigError,
        '{file}: [samples] query: syntax error at or near "id"',
        {"query": "SELECT v FROM s WHER id = $1"},
        id="syntax_error_in_query",
    ),
    pytest.param(
        (),
        ConfigError,
        '{file}: [samples] query: relation "nope" does not exist',
        {"query": "SELECT v FROM nope WHERE id = $1"},
        id="missing_table",
    ),
    pytest.param(
        (),
        SourceError,
        "the keys query returned no rows: there is nothing to dump",
        {"keys": "SELECT id FROM s WHERE false"},
        id="no_keys_at_all",
    ),
    pytest.param(
        (),
        SourceError,
        "64 samples make no full batch of 100: lower [batches] size or set drop_last = false",
        {"size": 100},
        id="fewer_keys_than_one_batch_with_drop_last",
    ),
    pytest.param((), ConfigError, "epoch must be 0 or more, got -1", {"epoch": -1}, id="negative_epoch"),
    pytest.param(
        ("UPDATE w SET v = NULL WHERE id = 21 AND k = 2",),
        SampleError,
        f"sample (id=21): field v, column v is NULL (1 NULL in this batch); {NULL_HINT}",
        W,
        id="null_value_in_a_multi_row_sample_names_the_key",
    ),
    pytest.param(
        (
            "CREATE TABLE a AS SELECT id, k, ARRAY[k, k, k]::real[] AS e FROM w",
            "UPDATE a SET e = ARRAY[1]::real[] WHERE id = 30 AND k = 2",
        ),
        SampleError,
        "sample (id=30): field e, column e has 1 elements, expected 3 (as in the first sample)",
        {**E, "query": "SELECT e FROM a WHERE id = $1 ORDER BY k", "rows": 2},
        id="wrong_array_length_in_a_multi_row_sample_names_the_key",
    ),
]


@pytest.mark.parametrize(("statements", "error", "message", "config"), ONE_LINE)
def test_a_dump_that_fails_says_one_line_and_publishes_no_epoch(
    table: str,
    tmp_path: Path,
    statements: tuple[str, ...],
    error: type[Exception],
    message: str,
    config: dict[str, object],
) -> None:
    if statements:
        execute(table, *statements)
    expect(error, message, tmp_path, table, **config)


def test_null_error_counts_the_nulls_of_the_batch(table: str, tmp_path: Path) -> None:
    execute(table, "UPDATE s SET v = NULL WHERE id IN (7, 9, 12)")
    path = v_config(tmp_path, "s", size=64)
    with pytest.raises(
        SampleError, match=r"^sample \(id=(7|9|12)\): field v, column v is NULL \(3 NULLs in this batch\)"
    ):
        dump(path, table)


def test_data_modifying_keys_query_fails_and_changes_nothing(table: str, tmp_path: Path) -> None:
    expect(
        SourceError,
        "{file}: [samples] keys: cannot execute SELECT in a read-only transaction",
        tmp_path,
        table,
        keys="WITH d AS (DELETE FROM s RETURNING id) SELECT id FROM d",
    )
    assert fetch(table, "SELECT count(*) FROM s")[0][0] == 64


def test_data_modifying_query_fails_and_changes_nothing(table: str, tmp_path: Path) -> None:
    path = v_config(tmp_path, "s", query="WITH u AS (UPDATE s SET v = -1 WHERE id = $1 RETURNING v) SELECT v FROM u")
    with pytest.raises(SourceError):
        dump(path, table)
    assert fetch(table, "SELECT count(*) FROM s WHERE v = -1")[0][0] == 0


def test_refused_connection_hides_the_password(tmp_path: Path) -> None:
    path = write_config(tmp_path, keys="SELECT 1", query="SELECT 1", fields=ONE_COLUMN, size=1)
    result = CliRunner().invoke(
        cli, ["dump", "--config", str(path), "--epoch", "0", "--dsn", "postgresql://u:s3cret@127.0.0.1:9/db"]
    )
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot connect to postgresql://u:***@127.0.0.1:9/db: ")
    assert result.output.count("\n") == 1
    assert "s3cret" not in result.output


def test_store_path_that_is_a_file(table: str, tmp_path: Path) -> None:
    (tmp_path / "store.zarr").write_text("not a folder")
    expect(
        Exception,
        "store path {store} is a file, not a folder".replace("{store}", str(tmp_path / "store.zarr")),
        tmp_path,
        table,
    )


def test_a_dump_that_fails_on_its_config_leaves_no_store(table: str, tmp_path: Path) -> None:
    path = v_config(tmp_path, "s", query="SELECT nope FROM s WHERE id = $1")
    result = CliRunner().invoke(cli, ["dump", "--config", str(path), "--epoch", "0", "--dsn", table])
    assert result.exit_code == 2
    assert not (tmp_path / "store.zarr").exists()


def test_json_of_a_skipped_epoch_reports_its_real_counts(table: str, tmp_path: Path) -> None:
    path = v_config(tmp_path, "s")
    argv = ["dump", "--config", str(path), "--epoch", "0", "--dsn", table, "--json"]
    first = json.loads(CliRunner().invoke(cli, argv).output)
    second = json.loads(CliRunner().invoke(cli, argv).output)
    assert second["status"] == "skipped"
    assert (second["n_batches"], second["n_samples"], second["bytes"]) == (4, 64, first["bytes"])


def test_summary_counts_one_batch_in_the_singular(table: str, tmp_path: Path) -> None:
    path = v_config(tmp_path, "s", size=64)
    out = CliRunner().invoke(cli, ["dump", "--config", str(path), "--epoch", "0", "--dsn", table]).output
    assert out.startswith("epoch 0: 1 batch, 64 samples, ")
