"""Category codes: always within their dtype, in both modes.

Both modes resolve the category lists with one function (``plan.resolve_categories``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pgprefetch import EpochDataset, load_config
from pgprefetch.cli import cli
from pgprefetch.errors import ConfigError

from .conftest import fetch
from .helpers import dump, execute, toml_value

MODES = ["query", "scan"]


@pytest.fixture
def penguins(db: str) -> str:
    """``penguins(id, island)``: 120 rows on three islands; ``tags(id, tag)``: 200 distinct tags;
    ``pace(seconds)``: how long each sample of a slow query-mode dump takes (0: not slow)."""
    execute(
        db,
        "CREATE TABLE penguins (id int PRIMARY KEY, island text NOT NULL)",
        "INSERT INTO penguins SELECT i, (ARRAY['Biscoe', 'Dream', 'Torgersen'])[i % 3 + 1] "
        " FROM generate_series(1, 120) i",
        "CREATE TABLE tags (id int PRIMARY KEY, tag text NOT NULL)",
        "INSERT INTO tags SELECT i, 'tag' || lpad(i::text, 3, '0') FROM generate_series(1, 200) i",
        "CREATE TABLE pace (seconds float8)",
        "INSERT INTO pace VALUES (0)",
    )
    return db


def config(
    folder: Path,
    mode: str,
    *,
    table: str = "penguins",
    column: str = "island",
    dtype: str = "int8",
    categories: object = "auto",
    size: int = 4,
    slow: bool = False,
    name: str = "c.toml",
    store: str = "store.zarr",
    **options: object,
) -> Path:
    """A config of one categorical field ``column`` of ``table``, one row a sample, in either mode."""
    if mode == "query":
        pause = ", pg_sleep(pace.seconds)" if slow else ""
        query = f"SELECT {column}{pause} FROM {table}{', pace' if slow else ''} WHERE id = $1"
        samples = [f"keys = {toml_value(f'SELECT id FROM {table}')}", f"query = {toml_value(query)}"]
    else:
        samples = [f'table = "{table}"', 'key = "id"']
    lines = ["[source]", "connections = 2", "[samples]", *samples, "[batches]", f"size = {size}", "seed = 3"]
    lines += ["drop_last = false", "[store]", f"path = {toml_value(store)}", f"[fields.{column}]"]
    lines += [f'columns = ["{column}"]', f'dtype = "{dtype}"', f"categories = {toml_value(categories)}"]
    lines += [f"{k} = {toml_value(v)}" for k, v in options.items()]
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def truth(dsn: str, table: str = "penguins", column: str = "island") -> dict[int, str]:
    return {r[0]: r[1] for r in fetch(dsn, f"SELECT id, {column} FROM {table}")}


def epoch_of(store: Path, epoch: int) -> EpochDataset:
    return EpochDataset(store, epoch, consumer=None)


def decoded(store: Path, epoch: int, column: str = "island") -> tuple[dict[int, str], list[str]]:
    """Each sample's value as the epoch's codes and category list decode it, by key; and the list."""
    ds = epoch_of(store, epoch)
    vocabulary = ds.categories[column]
    values = {}
    for i in range(len(ds)):
        batch = ds.batch(i, keys=True)
        keys = batch["keys"].reshape(-1).tolist()
        codes = batch[column].reshape(-1).tolist()
        values.update({k: vocabulary[c] for k, c in zip(keys, codes, strict=True)})
    return values, vocabulary


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


# ---------------------------------------------------------------- codes always fit their dtype


@pytest.mark.parametrize("cast", ["safe", "unsafe"])
@pytest.mark.parametrize("mode", MODES)
def test_auto_categories_that_do_not_fit_the_dtype_stop_the_dump_whatever_the_cast(
    penguins: str, tmp_path: Path, mode: str, cast: str
) -> None:
    cfg = config(tmp_path, mode, table="tags", column="tag", cast=cast)
    code, out = run_cli("dump", "--config", str(cfg), "--epoch", "0", "--dsn", penguins)
    assert code == 1
    assert out.splitlines()[-1] == (
        "Error: [fields.tag] categories: 200 distinct values do not fit int8 (at most 128 codes); "
        "use a wider integer dtype"
    )
    assert not (tmp_path / "store.zarr").exists()  # nothing published, no vocabulary recorded


@pytest.mark.parametrize("mode", MODES)
def test_check_reports_categories_that_do_not_fit_as_the_dump_does(penguins: str, tmp_path: Path, mode: str) -> None:
    cfg = config(tmp_path, mode, table="tags", column="tag", cast="unsafe")
    code, out = run_cli("check", "--config", str(cfg), "--dsn", penguins)
    assert code == 1
    assert (
        "error: [fields.tag] categories: 200 distinct values do not fit int8 (at most 128 codes); "
        "use a wider integer dtype"
    ) in out.splitlines()
    assert not (tmp_path / "store.zarr").exists()


@pytest.mark.parametrize("categories", ["auto", "list"])
@pytest.mark.parametrize("mode", MODES)
def test_categories_that_fill_the_dtype_exactly_are_dumped_as_the_database_has_them(
    penguins: str, tmp_path: Path, mode: str, categories: str
) -> None:
    execute(penguins, "DELETE FROM tags WHERE id > 128")  # 128 tags: codes 0..127, all of int8
    tags = [f"tag{i:03d}" for i in range(128, 0, -1)]  # a list defines the codes: backwards, unlike "auto"
    cfg = config(
        tmp_path, mode, table="tags", column="tag", size=16, categories=tags if categories == "list" else "auto"
    )
    dump(cfg, penguins)
    values, vocabulary = decoded(tmp_path / "store.zarr", 0, "tag")
    assert vocabulary == (tags if categories == "list" else sorted(tags))
    assert values == truth(penguins, "tags", "tag")


def test_a_category_list_longer_than_the_dtype_is_refused_when_the_config_is_read(tmp_path: Path) -> None:
    tags = [f"tag{i:03d}" for i in range(129)]
    with pytest.raises(ConfigError, match=r"\[fields.tag\] categories: 129 categories do not fit int8$"):
        load_config(config(tmp_path, "query", table="tags", column="tag", categories=tags))
