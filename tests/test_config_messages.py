"""The TOML config's errors: every refused file is one exact line naming the file and key, a usage error (exit 2).

No database: configs are written into ``tmp_path`` (the ``cfg`` fixture names the file), each the valid
config of tests/harness/loading.py with one key changed, and read with :func:`pgprefetch.config.load_config`.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from pgprefetch.config.load import load_config
from pgprefetch.errors import ConfigError

from .harness.loading import DELETE, VALID, changed, error, load

DTYPE_LIST = "bool, int8, int16, int32, int64, uint8, uint16, uint32, float16, float32, float64"


# ---------------------------------------------------------------- errors: file and TOML


def test_config_error_is_a_usage_error_with_exit_code_2() -> None:
    assert issubclass(ConfigError, ValueError)
    assert ConfigError("x").exit_code == 2


def test_missing_file_is_named(cfg: Path) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_config(cfg, environ={})
    assert str(excinfo.value) == f"{cfg}: no such config file"
    assert excinfo.value.exit_code == 2


def test_malformed_toml_names_the_file_line_and_column(cfg: Path) -> None:
    assert error(cfg, "[batches]\nsize = \n") == f"{cfg}: invalid TOML: Invalid value (at line 2, column 8)"


# ---------------------------------------------------------------- errors: keys and sections


def test_unknown_key_suggests_the_closest_name(cfg: Path) -> None:
    assert error(cfg, changed("batches", "sise", 256)) == f'{cfg}: [batches]: unknown key "sise" (did you mean "size"?)'


def test_unknown_key_without_a_close_match_lists_the_known_keys(cfg: Path) -> None:
    assert error(cfg, changed("batches", "colour", 1)) == (
        f'{cfg}: [batches]: unknown key "colour" (expected one of: size, seed, drop_last)'
    )


def test_unknown_key_in_a_field_suggests_the_closest_name(cfg: Path) -> None:
    assert error(cfg, changed("fields.x", "dtpye", "int8")) == (
        f'{cfg}: [fields.x]: unknown key "dtpye" (did you mean "dtype"?)'
    )


def test_misspelt_section_suggests_the_closest_name(cfg: Path) -> None:
    data = copy.deepcopy(VALID) | {"sampels": {"rows": 2}}
    assert error(cfg, data) == f'{cfg}: top level: unknown key "sampels" (did you mean "samples"?)'


def test_unknown_section_lists_the_known_sections(cfg: Path) -> None:
    data = copy.deepcopy(VALID) | {"extra": {"a": 1}}
    assert error(cfg, data) == (
        f'{cfg}: top level: unknown key "extra" '
        "(expected one of: samples, fields, batches, store, source, mix, splits, transforms, packing)"
    )


@pytest.mark.parametrize("section", ["samples", "fields", "batches", "store"])
def test_missing_section_is_named(cfg: Path, section: str) -> None:
    data = {k: v for k, v in VALID.items() if k != section}
    assert error(cfg, data) == f'{cfg}: top level: missing required section "{section}"'


def test_section_that_is_not_a_table_is_refused(cfg: Path) -> None:
    data = copy.deepcopy(VALID) | {"store": "store.zarr"}
    assert error(cfg, data) == f"{cfg}: [store]: expected a table, got a string"


@pytest.mark.parametrize(
    ("section", "key"),
    [("samples", "keys"), ("samples", "query"), ("batches", "size"), ("store", "path"), ("fields.x", "dtype")],
)
def test_missing_required_key_is_named(cfg: Path, section: str, key: str) -> None:
    assert error(cfg, changed(section, key, DELETE)) == f'{cfg}: [{section}]: missing required key "{key}"'


def test_field_without_columns_is_refused(cfg: Path) -> None:
    assert error(cfg, changed("fields.x", "columns", DELETE)) == f'{cfg}: [fields.x]: missing required key "columns"'


# ---------------------------------------------------------------- errors: types and ranges


def test_size_as_a_string_is_refused(cfg: Path) -> None:
    assert error(cfg, changed("batches", "size", "256")) == (
        f'{cfg}: [batches] size: expected a positive integer, got "256"'
    )


def test_drop_last_as_an_integer_is_refused(cfg: Path) -> None:
    assert (
        error(cfg, changed("batches", "drop_last", 1)) == f"{cfg}: [batches] drop_last: expected true or false, got 1"
    )


def test_connections_as_a_boolean_is_refused(cfg: Path) -> None:
    assert error(cfg, changed("source", "connections", True)) == (
        f"{cfg}: [source] connections: expected a positive integer, got true"
    )


def test_seed_as_a_float_is_refused(cfg: Path) -> None:
    assert error(cfg, changed("batches", "seed", 1.5)) == f"{cfg}: [batches] seed: expected an integer, got a number"


@pytest.mark.parametrize("size", [0, -1])
def test_batch_size_must_be_positive(cfg: Path, size: int) -> None:
    assert error(cfg, changed("batches", "size", size)) == (
        f"{cfg}: [batches] size: expected a positive integer, got {size}"
    )


def test_rows_must_be_positive(cfg: Path) -> None:
    assert error(cfg, changed("samples", "rows", 0)) == f"{cfg}: [samples] rows: expected a positive integer, got 0"


@pytest.mark.parametrize("fraction", [0, 1.5])
def test_fraction_must_be_in_zero_one(cfg: Path, fraction: float) -> None:
    assert error(cfg, changed("samples", "fraction", fraction)) == (
        f"{cfg}: [samples] fraction: expected a number with 0 < fraction <= 1, got {fraction}"
    )


@pytest.mark.parametrize(("value", "kind"), [(5432, "an integer"), ("", "a string"), (" ", "a string")])
def test_dsn_must_be_a_non_empty_string(cfg: Path, value: Any, kind: str) -> None:
    assert error(cfg, changed("source", "dsn", value)) == (
        f"{cfg}: [source] dsn: expected a non-empty string, got {kind}"
    )


@pytest.mark.parametrize(("value", "shown"), [("5 minutes", '"5 minutes"'), ("-1s", '"-1s"'), (-1, "-1"), (1.5, "1.5")])
def test_bad_statement_timeout_is_refused(cfg: Path, value: Any, shown: str) -> None:
    assert error(cfg, changed("source", "statement_timeout", value)) == (
        f'{cfg}: [source] statement_timeout: expected a duration such as "500ms", "30s", "5min" or "1h", got {shown}'
    )


# ---------------------------------------------------------------- errors: dtype and compression


def test_misspelt_dtype_suggests_the_closest_name(cfg: Path) -> None:
    assert error(cfg, changed("fields.x", "dtype", "float23")) == (
        f'{cfg}: [fields.x] dtype: expected one of {DTYPE_LIST}; got "float23" (did you mean "float32"?)'
    )


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("int", "int32"), ("integer", "int32"), ("bigint", "int64"), ("real", "float32"), ("float", "float64"),
     ("double precision", "float64"), ("Double  Precision", "float64"), ("smallint", "int16"), ("int4", "int32")],
)  # fmt: skip
def test_a_postgresql_type_name_as_dtype_suggests_the_dtype_that_holds_it(cfg: Path, typed: str, meant: str) -> None:
    assert error(cfg, changed("fields.x", "dtype", typed)) == (
        f'{cfg}: [fields.x] dtype: expected one of {DTYPE_LIST}; got "{typed}" (did you mean "{meant}"?)'
    )


def test_unsupported_dtype_lists_the_supported_ones(cfg: Path) -> None:
    assert error(cfg, changed("fields.x", "dtype", "complex64")) == (
        f'{cfg}: [fields.x] dtype: expected one of {DTYPE_LIST}; got "complex64"'
    )


def test_unknown_compression_lists_the_choices(cfg: Path) -> None:
    assert error(cfg, changed("store", "compression", "gzip")) == (
        f'{cfg}: [store] compression: expected one of none, zstd, lz4; got "gzip"'
    )


@pytest.mark.parametrize(("value", "kind"), [(7, "an integer"), ("", "a string"), ("  ", "a string")])
def test_store_path_must_be_a_non_empty_string(cfg: Path, value: Any, kind: str) -> None:
    assert error(cfg, changed("store", "path", value)) == f"{cfg}: [store] path: expected a path string, got {kind}"


# ---------------------------------------------------------------- errors: SQL


@pytest.mark.parametrize("key", ["keys", "query"])
@pytest.mark.parametrize("sql", ["", "  \n\t", ";", " ; "])
def test_empty_sql_is_refused(cfg: Path, key: str, sql: str) -> None:
    assert error(cfg, changed("samples", key, sql)) == (
        f"{cfg}: [samples] {key}: expected a SQL query, got an empty string"
    )


def test_sql_must_be_a_string(cfg: Path) -> None:
    assert error(cfg, changed("samples", "keys", ["SELECT 1"])) == (
        f"{cfg}: [samples] keys: expected a SQL string, got a list"
    )


def test_dollar_zero_in_the_query_is_refused(cfg: Path) -> None:
    assert error(cfg, changed("samples", "query", "SELECT a FROM t WHERE id = $0")) == (
        f"{cfg}: [samples] query: parameters are numbered from $1 (the first key column); found $0"
    )


def test_dollar_zero_inside_a_literal_is_allowed(cfg: Path) -> None:
    query = "SELECT a FROM t WHERE id = $1 AND note <> '$0'"
    assert load(cfg, changed("samples", "query", query)).samples.query == query


# ---------------------------------------------------------------- errors: fields


def test_field_named_keys_is_reserved(cfg: Path) -> None:
    data = changed("fields", "keys", {"columns": ["a"], "dtype": "int64"})
    assert error(cfg, data) == f'{cfg}: [fields.keys]: "keys" is reserved (the store keeps each batch\'s keys under it)'


@pytest.mark.parametrize("name", ["1x", "x-y", "x y", ""])
def test_bad_field_name_is_refused(cfg: Path, name: str) -> None:
    data = changed("fields", name, {"columns": ["a"], "dtype": "int64"})
    assert error(cfg, data) == (
        f"{cfg}: [fields.{name}]: a field name must be letters, digits and underscores, not starting with a digit"
    )


def test_field_that_is_not_a_table_is_refused(cfg: Path) -> None:
    data = copy.deepcopy(VALID)
    data["fields"]["y"] = "int64"
    assert error(cfg, data) == f"{cfg}: [fields.y]: expected a table with columns and dtype, got a string"


def test_empty_columns_list_is_refused(cfg: Path) -> None:
    assert error(cfg, changed("fields.x", "columns", [])) == (
        f"{cfg}: [fields.x] columns: expected a non-empty list of column names, got []"
    )


def test_empty_column_name_is_refused(cfg: Path) -> None:
    assert error(cfg, changed("fields.x", "columns", ["a", ""])) == (
        f'{cfg}: [fields.x] columns: expected a non-empty list of column names, got ["a", ""]'
    )


def test_duplicate_column_is_refused(cfg: Path) -> None:
    assert error(cfg, changed("fields.x", "columns", ["a", "b", "a"])) == (
        f"{cfg}: [fields.x] columns: a column is listed twice in ['a', 'b', 'a']"
    )


def test_config_without_fields_is_refused(cfg: Path) -> None:
    data = copy.deepcopy(VALID) | {"fields": {}}
    assert error(cfg, data) == (f"{cfg}: [fields]: expected at least one field, e.g. [fields.x] with columns and dtype")
