"""Category codes: always within their dtype, and meaning the same value in every epoch of a store.

Both modes resolve the category lists with one function (``plan.resolve_categories``); an ``"auto"`` field's
codes extend the store's vocabulary (``.pgprefetch/categories.json``), which outlives the epochs.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import zarr
from click.testing import CliRunner

from pgprefetch import EpochDataset, EpochStream, load_config
from pgprefetch.cli import cli
from pgprefetch.errors import ConfigError, SourceError, StoreError
from pgprefetch.store.base import VOCABULARY
from pgprefetch.store.open import open_store

from .harness.configs import toml_value
from .harness.db import execute, fetch
from .harness.dumps import chunk_bytes, dump, kill_9_after
from .harness.s3 import S3

ISLANDS = ["Biscoe", "Dream", "Torgersen"]
MODES = ["query", "scan"]


@pytest.fixture
def penguins(db: str) -> str:
    """A database with ``penguins(id, island)``, 120 rows on three islands, and ``tags(id, tag)``, 200 tags.

    ``pace(seconds)`` is how long each sample of a slow query-mode config takes (0: not slow).
    """
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
    compression: str = "none",
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
    lines += ["drop_last = false", "[store]", f"path = {toml_value(store)}", f'compression = "{compression}"']
    lines += [f"[fields.{column}]"]
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
    group = zarr.open_group(store / f"epoch-{epoch:05d}", mode="r")
    n = ds.n_samples  # the padding after them is not samples
    keys, codes = group["keys"][:].reshape(-1)[:n].tolist(), group[column][:].reshape(-1)[:n].tolist()
    vocabulary = ds.categories[column]
    return {k: vocabulary[c] for k, c in zip(keys, codes, strict=True)}, vocabulary


def recorded(store: Path) -> dict[str, list[str]] | None:
    path = store / VOCABULARY
    return json.loads(path.read_text())["fields"] if path.exists() else None


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


@pytest.mark.parametrize("mode", ["query", "scan"])
def test_a_null_category_names_the_fill_that_works_and_the_fill_dumps(penguins: str, tmp_path: Path, mode: str) -> None:
    execute(
        penguins,
        "ALTER TABLE penguins ALTER COLUMN island DROP NOT NULL",
        "UPDATE penguins SET island = NULL WHERE id = 7",
    )
    with pytest.raises(SourceError, match=re.escape("set [fields.island] null = -1 to code NULLs as -1")):
        dump(config(tmp_path, mode), penguins)
    result = dump(config(tmp_path, mode, name="fixed.toml", store="fixed.zarr", null=-1), penguins)
    got, vocabulary = decoded(Path(result.path).parent, 0)
    want = truth(penguins)
    assert vocabulary == ["Biscoe", "Dream", "Torgersen"]
    assert {k: v for k, v in got.items() if k != 7} == {k: v for k, v in want.items() if k != 7}
    group = zarr.open_group(result.path, mode="r")
    keys = group["keys"][:].reshape(-1).tolist()
    at = keys.index(7)
    assert group["island"][:].reshape(-1)[at] == -1
    assert group["island_null"][:].reshape(-1)[at]


def test_a_category_list_longer_than_the_dtype_is_refused_when_the_config_is_read(tmp_path: Path) -> None:
    tags = [f"tag{i:03d}" for i in range(129)]
    with pytest.raises(ConfigError, match=r"\[fields.tag\] categories: 129 categories do not fit int8$"):
        load_config(config(tmp_path, "query", table="tags", column="tag", categories=tags))


# ---------------------------------------------------------------- codes keep their meaning across epochs


@pytest.mark.parametrize("mode", MODES)
def test_auto_codes_keep_their_meaning_when_a_new_value_appears(
    penguins: str, tmp_path: Path, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(tmp_path, mode)
    store = tmp_path / "store.zarr"
    dump(cfg, penguins, epoch=0)
    before, vocabulary = decoded(store, 0)
    assert vocabulary == ISLANDS  # a fresh store: the sorted values
    assert before == truth(penguins)
    execute(penguins, "INSERT INTO penguins VALUES (121, 'Anvers')")  # sorts before every other island
    with caplog.at_level(logging.INFO, logger="pgprefetch"):
        dump(cfg, penguins, epoch=1)
    after, vocabulary = decoded(store, 1)
    assert vocabulary == [*ISLANDS, "Anvers"]  # old codes unchanged, the new value appended
    assert after == truth(penguins)
    assert "[fields.island] categories: new value 'Anvers' gets code 3" in caplog.messages
    assert recorded(store) == {"island": [*ISLANDS, "Anvers"]}
    assert epoch_of(store, 0).categories == {"island": ISLANDS}  # published epochs are not rewritten
    assert EpochStream(store, 0, 2, consumer=None).categories == {"island": [*ISLANDS, "Anvers"]}
    dump(cfg, penguins, epoch=0, force=True)  # --force renumbers nothing either
    again, vocabulary = decoded(store, 0)
    assert (again, vocabulary) == (truth(penguins), [*ISLANDS, "Anvers"])


@pytest.mark.parametrize("mode", MODES)
def test_codes_outlive_every_epoch_that_held_them(penguins: str, tmp_path: Path, mode: str) -> None:
    cfg = config(tmp_path, mode)
    store = tmp_path / "store.zarr"
    dump(cfg, penguins, epoch=0)
    execute(penguins, "INSERT INTO penguins VALUES (121, 'Anvers')")
    dump(cfg, penguins, epoch=1)
    open_store(store).record_consumer("trainer", 2)
    assert run_cli("prune", "--config", str(cfg), "--keep", "0")[0] == 0
    assert open_store(store).epochs() == []  # no manifest is left to say what the codes meant
    execute(penguins, "DELETE FROM penguins WHERE island = 'Torgersen'")
    dump(cfg, penguins, epoch=2)
    values, vocabulary = decoded(store, 2)
    assert vocabulary == [*ISLANDS, "Anvers"]  # Torgersen is gone from the data and keeps its code
    assert values == truth(penguins)


@pytest.mark.parametrize("mode", MODES)
def test_a_vocabulary_grown_past_the_dtype_stops_the_dump_and_records_nothing(
    penguins: str, tmp_path: Path, mode: str
) -> None:
    execute(penguins, "DELETE FROM tags WHERE id > 128")
    cfg = config(tmp_path, mode, table="tags", column="tag", size=16)
    store = tmp_path / "store.zarr"
    dump(cfg, penguins, epoch=0)
    before = recorded(store)
    execute(penguins, "INSERT INTO tags VALUES (129, 'a new tag')")
    with pytest.raises(SourceError) as e:
        dump(cfg, penguins, epoch=1)
    assert str(e.value) == (
        "[fields.tag] categories: 129 values (128 in the store's vocabulary, 1 new) do not fit int8 "
        "(at most 128 codes); use a wider integer dtype"
    )
    assert recorded(store) == before
    assert open_store(store).epochs() == [0]
    assert open_store(store).partial_epochs() == []


@pytest.mark.parametrize("mode", MODES)
def test_check_plans_with_the_stores_vocabulary_and_records_nothing(penguins: str, tmp_path: Path, mode: str) -> None:
    cfg = config(tmp_path, mode)
    store = tmp_path / "store.zarr"
    dump(cfg, penguins, epoch=0)
    execute(penguins, "INSERT INTO penguins VALUES (121, 'Anvers')")
    code, out = run_cli("check", "--config", str(cfg), "--dsn", penguins, "--epoch", "1", "--json")
    assert code == 0, out
    assert json.loads(out)["fields"]["island"]["categories"] == [*ISLANDS, "Anvers"]
    assert recorded(store) == {"island": ISLANDS}


def test_a_stream_over_epochs_coded_differently_refuses_to_name_one_vocabulary(penguins: str, tmp_path: Path) -> None:
    store = tmp_path / "store.zarr"
    dump(config(tmp_path, "query", categories=ISLANDS), penguins, epoch=0)
    dump(config(tmp_path, "query", categories=ISLANDS[::-1], name="reversed.toml"), penguins, epoch=1, force=True)
    with pytest.raises(StoreError, match=r"^epochs 0 and 1 of .* code field island with different category lists"):
        _ = EpochStream(store, 0, 2, consumer=None).categories


# ---------------------------------------------------------------- resume


def kill_mid_dump(cfg: Path, dsn: str, store: Path, epoch: int, after: int = 3) -> None:
    """Start a slow dump of ``epoch`` in its own process and ``kill -9`` it once ``after`` batches are journaled."""
    execute(dsn, "UPDATE pace SET seconds = 0.02")
    kill_9_after(cfg, dsn, store, batches=after, epoch=epoch)
    execute(dsn, "UPDATE pace SET seconds = 0")
    assert not (store / f"epoch-{epoch:05d}").exists()


@pytest.mark.parametrize("mode", MODES)
def test_a_dump_killed_after_a_new_value_resumes_to_the_bytes_of_an_uninterrupted_one(
    penguins: str, tmp_path: Path, mode: str
) -> None:
    # Query mode: each sample sleeps (pace), a batch at a time. Scan mode has nothing to wait for once the
    # table is read: a thousand batches of two, compressed (milliseconds each through zarr), keep it writing.
    slow = {"slow": True} if mode == "query" else {"size": 2, "compression": "zstd"}
    killed = config(tmp_path, mode, **slow)
    clean = config(tmp_path, mode, **slow, name="clean.toml", store="clean.zarr")
    for cfg in (killed, clean):
        dump(cfg, penguins, epoch=0)
    execute(penguins, "INSERT INTO penguins VALUES (121, 'Anvers')")
    if mode == "scan":
        execute(penguins, "INSERT INTO penguins SELECT i, 'Dream' FROM generate_series(122, 1200) i")
    kill_mid_dump(killed, penguins, tmp_path / "store.zarr", 1, after=3 if mode == "query" else 20)
    resumed = dump(killed, penguins, epoch=1)
    assert resumed.resumed >= 2
    assert resumed.restarted is None
    uninterrupted = dump(clean, penguins, epoch=1)
    assert chunk_bytes(resumed.path) == chunk_bytes(uninterrupted.path)
    values, vocabulary = decoded(tmp_path / "store.zarr", 1)
    assert (values, vocabulary) == (truth(penguins), [*ISLANDS, "Anvers"])


def test_a_partial_epoch_whose_vocabulary_grew_meanwhile_is_started_over(penguins: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, "query", slow=True)
    store = tmp_path / "store.zarr"
    dump(cfg, penguins, epoch=0)
    kill_mid_dump(cfg, penguins, store, 1)
    execute(penguins, "UPDATE penguins SET island = 'Anvers' WHERE id = 7")  # the same keys, a new value
    result = dump(cfg, penguins, epoch=1)
    assert result.restarted == "the category lists changed (the store's vocabulary grew)"
    assert result.resumed == 0
    assert decoded(store, 1) == (truth(penguins), [*ISLANDS, "Anvers"])


# ---------------------------------------------------------------- the store's record


def grow_by(value: str, pause: float = 0.0) -> Callable[[dict[str, list[str]]], dict[str, list[str]]]:
    """A ``grow`` for ``Store.grow_vocabulary`` that appends ``value`` to field ``f``, slowly."""

    def grow(current: dict[str, list[str]]) -> dict[str, list[str]]:
        time.sleep(pause)  # widen the window in which another dump changes the record
        known = current.get("f", [])
        return {"f": known if value in known else [*known, value]}

    return grow


@pytest.mark.parametrize("backend", ["local", pytest.param("s3", marks=pytest.mark.server)])
def test_dumps_growing_the_vocabulary_at_once_give_every_value_its_own_code(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    if backend == "s3":
        s3: S3 = request.getfixturevalue("s3")
        store = open_store(f"s3://{s3.bucket()}/runs/a")
    else:
        store = open_store(tmp_path / "store.zarr")
    store.create()
    values = [f"v{i}" for i in range(8)]
    seen: dict[str, list[str]] = {}

    def one(value: str) -> None:
        seen[value] = store.grow_vocabulary(grow_by(value, 0.05))["f"]

    threads = [threading.Thread(target=one, args=(v,)) for v in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == len(values)  # no dump failed
    final = store.vocabulary()["f"]
    assert sorted(final) == values  # every value once: no dump's value was lost or given a taken code
    for value, vocabulary in seen.items():
        assert final[: len(vocabulary)] == vocabulary  # what each dump coded with is a prefix of the record
        assert vocabulary[final.index(value)] == value


def test_a_growth_that_would_move_a_code_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store.zarr")
    store.create()
    store.grow_vocabulary(lambda _: {"f": ["b", "c"]})
    with pytest.raises(StoreError, match=r"\[fields.f\] categories: a store's codes only grow"):
        store.grow_vocabulary(lambda _: {"f": ["a", "b", "c"]})
    assert store.vocabulary() == {"f": ["b", "c"]}


def test_a_damaged_vocabulary_is_an_error_never_a_fresh_start(tmp_path: Path) -> None:
    store = open_store(tmp_path / "store.zarr")
    store.create()
    (tmp_path / "store.zarr" / VOCABULARY).write_text('{"fields": ')
    with pytest.raises(StoreError, match=r"categories.json is damaged"):
        store.grow_vocabulary(grow_by("a"))
    assert (tmp_path / "store.zarr" / VOCABULARY).read_text() == '{"fields": '


def test_stats_says_which_fields_it_leaves_out_and_why(penguins: str, tmp_path: Path) -> None:
    dump(config(tmp_path, "query"), penguins)
    code, out = run_cli("stats", "--store", str(tmp_path / "store.zarr"), "--epoch", "0")
    assert code == 0, out
    assert out.splitlines()[-1] == "not summarised: island (category codes: count them with np.bincount)"
