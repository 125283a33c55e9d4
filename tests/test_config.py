"""The TOML config: every error is one exact line naming the file and key; valid files load as expected.

No database: configs are written into ``tmp_path`` and read with :func:`pgprefetch.config.load_config`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pgprefetch import __version__
from pgprefetch.cli import cli
from pgprefetch.config.load import load_config
from pgprefetch.config.model import Config
from pgprefetch.errors import ConfigError

ROOT = Path(__file__).parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))
DTYPE_LIST = "bool, int8, int16, int32, int64, uint8, float16, float32, float64"
DELETE = object()

VALID: dict[str, Any] = {
    "samples": {"keys": "SELECT id FROM items", "query": "SELECT a, b FROM rows WHERE id = $1"},
    "fields": {"x": {"columns": ["a", "b"], "dtype": "float32"}},
    "batches": {"size": 256},
    "store": {"path": "store.zarr"},
}


# ---------------------------------------------------------------- helpers


def to_toml(data: dict[str, Any]) -> str:
    """A tiny TOML writer for the shapes a config has: scalars, lists of strings and nested tables."""
    lines: list[str] = []

    def table(prefix: str, body: dict[str, Any]) -> None:
        scalars = {k: v for k, v in body.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in body.items() if isinstance(v, dict)}
        if prefix and (scalars or not tables):
            lines.append(f"[{prefix}]")
        lines.extend(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in scalars.items())
        for k, v in tables.items():
            table(f"{prefix}.{json.dumps(k)}" if prefix else json.dumps(k), v)

    table("", data)
    return "\n".join(lines) + "\n"


def changed(section: str, key: str, value: Any) -> dict[str, Any]:
    """VALID with ``section.key`` (dots for nesting, e.g. ``fields.x``) set to ``value``, or removed by DELETE."""
    data = copy.deepcopy(VALID)
    table = data
    for part in section.split("."):
        table = table.setdefault(part, {})
    if value is DELETE:
        del table[key]
    else:
        table[key] = value
    return data


def write(path: Path, content: dict[str, Any] | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else to_toml(content), encoding="utf-8")
    return path


def load(path: Path, content: dict[str, Any] | str = VALID, **kwargs: Any) -> Config:
    kwargs.setdefault("environ", {})
    return load_config(write(path, content), **kwargs)


def error(path: Path, content: dict[str, Any] | str) -> str:
    """The message of the ConfigError that loading ``content`` raises, checked to be a one-line usage error."""
    with pytest.raises(ConfigError) as excinfo:
        load(path, content)
    assert excinfo.value.exit_code == 2
    message = str(excinfo.value)
    assert "\n" not in message
    return message


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    """Where a test writes its config file."""
    return tmp_path / "pgprefetch.toml"


def test_helper_writes_a_valid_config(cfg: Path) -> None:
    assert load(cfg).fields[0].columns == ("a", "b")


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
        f'{cfg}: top level: unknown key "extra" (expected one of: samples, fields, batches, store, source)'
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


# ---------------------------------------------------------------- the shipped configs


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    cfg = load_config(path, environ={})
    assert cfg.file == path
    assert cfg.fields
    assert cfg.store.path.is_absolute()


def test_configs_folder_is_not_empty() -> None:
    assert {p.name for p in CONFIGS} >= {"demo.toml", "demo-rows.toml"}


def shape(cfg: Config) -> dict[str, tuple[tuple[str, ...], str]]:
    return {f.name: (f.columns, f.dtype) for f in cfg.fields}


def test_demo_config_has_the_blog_posts_sequences() -> None:
    cfg = load_config(ROOT / "configs" / "demo.toml", environ={})
    assert shape(cfg) == {"x": (("f0", "f1"), "float32"), "y": (("label",), "int64")}
    assert (cfg.samples.rows, cfg.samples.fraction, cfg.samples.max_param) == (64, 1.0, 2)
    assert (cfg.batches.size, cfg.batches.seed, cfg.batches.drop_last) == (256, 0, True)
    assert cfg.source.dsn is None
    assert (cfg.source.connections, cfg.source.statement_timeout_ms) == (8, 300_000)
    assert cfg.store.path == ROOT / "prefetch" / "demo.zarr"
    assert cfg.store.compression == "none"


def test_demo_rows_config_has_one_row_per_sample() -> None:
    cfg = load_config(ROOT / "configs" / "demo-rows.toml", environ={})
    assert shape(cfg) == {
        "emb": (("emb",), "float32"),
        "features": (("price", "qty"), "float32"),
        "day": (("day",), "int32"),
        "label": (("label",), "int64"),
    }
    assert (cfg.samples.rows, cfg.samples.max_param) == (1, 1)
    assert (cfg.batches.size, cfg.batches.seed, cfg.batches.drop_last) == (1024, 0, False)
    assert cfg.source.statement_timeout_ms is None
    assert cfg.store.path == ROOT / "prefetch" / "demo-rows.zarr"


# ---------------------------------------------------------------- values and defaults


def test_defaults_fill_the_optional_keys(cfg: Path) -> None:
    c = load(cfg)
    assert (c.source.dsn, c.source.connections, c.source.statement_timeout_ms) == (None, 8, None)
    assert (c.samples.rows, c.samples.fraction) == (1, 1.0)
    assert (c.batches.seed, c.batches.drop_last) == (0, True)
    assert c.store.compression == "none"


def test_sql_is_stripped_of_whitespace_and_trailing_semicolons(cfg: Path) -> None:
    c = load(cfg, changed("samples", "keys", "\n  SELECT id FROM items ;\n"))
    assert c.samples.keys == "SELECT id FROM items"


def test_integer_fraction_one_is_read_as_a_float(cfg: Path) -> None:
    fraction = load(cfg, changed("samples", "fraction", 1)).samples.fraction
    assert fraction == 1.0
    assert isinstance(fraction, float)


@pytest.mark.parametrize(
    ("value", "ms"),
    [("500ms", 500), ("30s", 30_000), ("5min", 300_000), ("1h", 3_600_000), (" 1.5 s ", 1_500), (250, 250), (0, 0)],
)
def test_statement_timeout_is_read_as_milliseconds(cfg: Path, value: Any, ms: int) -> None:
    assert load(cfg, changed("source", "statement_timeout", value)).source.statement_timeout_ms == ms


def test_fields_keep_the_file_order(cfg: Path) -> None:
    data = copy.deepcopy(VALID)
    data["fields"] = {n: {"columns": [n], "dtype": "int64"} for n in ["z", "a", "m"]}
    c = load(cfg, data)
    assert [f.name for f in c.fields] == ["z", "a", "m"]
    assert c.field("a").columns == ("a",)


# ---------------------------------------------------------------- store path


def test_store_path_is_relative_to_the_config_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "conf" / "c.toml", changed("store", "path", "../out/store.zarr"))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    c = load_config(tmp_path / "conf" / "c.toml", environ={})
    assert c.store.path == tmp_path.resolve() / "out" / "store.zarr"


def test_store_path_of_a_relative_config_path_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "conf" / "c.toml", VALID)
    monkeypatch.chdir(tmp_path)
    assert load_config("conf/c.toml", environ={}).store.path == tmp_path.resolve() / "conf" / "store.zarr"


def test_absolute_store_path_is_kept(cfg: Path, tmp_path: Path) -> None:
    target = tmp_path / "abs" / "store.zarr"
    assert load(cfg, changed("store", "path", str(target))).store.path == target


def test_store_path_expands_the_home_folder(cfg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert load(cfg, changed("store", "path", "~/s.zarr")).store.path == tmp_path / "home" / "s.zarr"


def test_store_option_overrides_the_file_as_typed(cfg: Path) -> None:
    assert load(cfg, store="other/store.zarr").store.path == Path("other/store.zarr")


# ---------------------------------------------------------------- DSN and other overrides


def with_dsn(dsn: str) -> dict[str, Any]:
    return changed("source", "dsn", dsn)


def test_dsn_argument_wins_over_environment_and_file(cfg: Path) -> None:
    c = load(cfg, with_dsn("postgresql://file"), dsn="postgresql://arg", environ={"PGPREFETCH_DSN": "postgresql://env"})
    assert c.source.dsn == "postgresql://arg"


def test_environment_dsn_wins_over_file(cfg: Path) -> None:
    c = load(cfg, with_dsn("postgresql://file"), environ={"PGPREFETCH_DSN": "postgresql://env"})
    assert c.source.dsn == "postgresql://env"


def test_file_dsn_is_used_when_nothing_overrides_it(cfg: Path) -> None:
    assert load(cfg, with_dsn("postgresql://file"), environ={}).source.dsn == "postgresql://file"


def test_dsn_is_none_when_given_nowhere(cfg: Path) -> None:
    assert load(cfg, environ={"PGUSER": "someone"}).source.dsn is None


def test_environ_defaults_to_the_process_environment(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGPREFETCH_DSN", "postgresql://process")
    assert load_config(write(cfg, VALID)).source.dsn == "postgresql://process"


def test_connections_option_overrides_the_file(cfg: Path) -> None:
    assert load(cfg, changed("source", "connections", 4), connections=2).source.connections == 2


def test_connections_option_must_be_positive(cfg: Path) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load(cfg, connections=0)
    assert str(excinfo.value) == "--connections: expected a positive integer, got 0"
    assert excinfo.value.exit_code == 2


# ---------------------------------------------------------------- sha256


def sha(tmp_path: Path, data: dict[str, Any], **kwargs: Any) -> str:
    """The hash of ``data`` written to a new folder each time, so the file's place cannot matter."""
    return load(tmp_path / uuid.uuid4().hex / "c.toml", data, **kwargs).sha256()


def test_sha256_is_stable_for_the_same_content(tmp_path: Path) -> None:
    digest = sha(tmp_path, VALID)
    assert len(digest) == 64
    assert int(digest, 16) >= 0
    assert sha(tmp_path, VALID) == digest


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("batches", "seed", 1),
        ("batches", "size", 128),
        ("batches", "drop_last", False),
        ("samples", "query", "SELECT a, b FROM rows WHERE id = $1 ORDER BY t"),
        ("samples", "keys", "SELECT id FROM items WHERE id > 0"),
        ("samples", "rows", 2),
        ("samples", "fraction", 0.5),
        ("fields.x", "dtype", "float64"),
        ("fields.x", "columns", ["b", "a"]),
        ("fields", "y", {"columns": ["c"], "dtype": "int64"}),
        ("store", "compression", "zstd"),
    ],
)
def test_sha256_changes_with_what_decides_an_epochs_bytes(tmp_path: Path, section: str, key: str, value: Any) -> None:
    assert sha(tmp_path, changed(section, key, value)) != sha(tmp_path, VALID)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("source", "dsn", "postgresql://elsewhere"),
        ("source", "connections", 3),
        ("source", "statement_timeout", "1s"),
        ("store", "path", "elsewhere.zarr"),
        ("samples", "query", "  SELECT a, b FROM rows WHERE id = $1;\n"),
    ],
)
def test_sha256_ignores_where_and_how_fast(tmp_path: Path, section: str, key: str, value: Any) -> None:
    assert sha(tmp_path, changed(section, key, value)) == sha(tmp_path, VALID)


def test_sha256_ignores_command_line_overrides(tmp_path: Path) -> None:
    overridden = sha(tmp_path, VALID, dsn="postgresql://x", connections=1, store=str(tmp_path / "other.zarr"))
    assert overridden == sha(tmp_path, VALID)


# ---------------------------------------------------------------- frozen


def test_config_objects_are_frozen(cfg: Path) -> None:
    c = load(cfg)
    for obj, attr in [(c, "file"), (c.source, "dsn"), (c.samples, "query"), (c.fields[0], "dtype")]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, attr, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.batches.size = 1  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.store.path = Path("x")  # type: ignore[misc]


# ---------------------------------------------------------------- CLI


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), prog_name="pgprefetch")


def test_cli_prints_a_config_error_as_one_line_with_exit_code_2(cfg: Path) -> None:
    write(cfg, changed("batches", "size", 0))
    result = invoke("dump", "--config", str(cfg), "--epoch", "0")
    assert result.exit_code == 2
    assert result.output == f"Error: {cfg}: [batches] size: expected a positive integer, got 0\n"


def test_cli_debug_lets_the_config_error_propagate(cfg: Path) -> None:
    write(cfg, changed("batches", "size", 0))
    result = invoke("--debug", "dump", "--config", str(cfg), "--epoch", "0")
    assert isinstance(result.exception, ConfigError)
    assert str(result.exception) == f"{cfg}: [batches] size: expected a positive integer, got 0"


def test_cli_help_describes_the_tool() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    assert result.output.startswith("Usage: pgprefetch [OPTIONS] COMMAND [ARGS]...")
    assert "Pre-generate shuffled, snapshot-consistent training epochs" in result.output


def test_cli_version_prints_the_package_version() -> None:
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.output == f"pgprefetch, version {__version__}\n"


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_cli_command_help_exits_0(name: str) -> None:
    result = invoke(name, "--help")
    assert result.exit_code == 0
    assert result.output.startswith(f"Usage: pgprefetch {name} [OPTIONS]")
    assert cli.commands[name].get_short_help_str(limit=200) in " ".join(result.output.split())
