"""The TOML config: valid files load as expected; the shipped configs, defaults, overrides, the hash, the CLI.

No database: configs are written into ``tmp_path`` (the ``cfg`` fixture names the file) and read with
:func:`pgprefetch.config.load_config`; tests/harness/loading.py holds the valid config they change. What a
refused file is told (one exact line naming the file and key) is tests/test_config_messages.py's.
"""

from __future__ import annotations

import copy
import dataclasses
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

from .harness.loading import VALID, changed, load, write

ROOT = Path(__file__).parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))


def test_helper_writes_a_valid_config(cfg: Path) -> None:
    assert load(cfg).fields[0].columns == ("a", "b")


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
    c = load(
        cfg,
        with_dsn("postgresql://file"),
        dsn="postgresql://arg",
        environ={"PGPREFETCH_DSN": "postgresql://env"},
    )
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
