"""Category codes shared between stores: ``categories = { from = STORE }``, and the line that says codes are per store.

``"auto"`` codes are a store's own: a validation store dumped from other rows numbers the values it sees,
so one label could get two codes (#51.5: ``'PG'`` was code 1 in the training store, 0 in the validation
store). A store that borrows another's vocabulary codes every value as that store does; ``check`` and the
dump say, when a store's own vocabulary is built, that its codes are per store.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import zarr

from pgprefetch import EpochDataset, load_config
from pgprefetch.errors import ConfigError

from .harness.configs import toml_value
from .harness.db import execute, fetch
from .harness.dumps import dump, run_cli
from .harness.s3 import S3

MODES = ["query", "scan"]
ISLANDS = ["Biscoe", "Dream", "Torgersen"]


@pytest.fixture
def splits(db: str) -> str:
    """``labels(id, split, island)``: 90 training rows on three islands, 30 validation rows on two (no Biscoe)."""
    execute(
        db,
        "CREATE TABLE labels (id int PRIMARY KEY, split text NOT NULL, island text NOT NULL)",
        "INSERT INTO labels SELECT i, 'train', (ARRAY['Biscoe', 'Dream', 'Torgersen'])[i % 3 + 1] "
        " FROM generate_series(1, 90) i",
        "INSERT INTO labels SELECT i, 'val', (ARRAY['Dream', 'Torgersen'])[i % 2 + 1] FROM generate_series(91, 120) i",
    )
    return db


def config(folder: Path, mode: str, split: str, categories: object, *, store: str, name: str) -> Path:
    """One categorical field ``island`` of the ``split`` rows of ``labels``, in either mode."""
    if mode == "query":
        keys = f"SELECT id FROM labels WHERE split = '{split}'"
        samples = [f"keys = {toml_value(keys)}", 'query = "SELECT island FROM labels WHERE id = $1"']
    else:
        table = f"SELECT id, island FROM labels WHERE split = '{split}'"
        samples = [f"table = {toml_value(table)}", 'key = "id"']
    shown = categories if isinstance(categories, str) and categories.startswith("{") else toml_value(categories)
    lines = ["[source]", "connections = 2", "[samples]", *samples, "[batches]", "size = 4", "seed = 3"]
    lines += ["drop_last = false", "[store]", f"path = {toml_value(store)}", "[fields.island]"]
    lines += ['columns = ["island"]', 'dtype = "int8"', f"categories = {shown}"]
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def decoded(store: Path | str, epoch: int = 0) -> tuple[dict[int, str], list[str], dict[int, int]]:
    """Each sample's value as the epoch's own list decodes its code, by key; the list; each sample's code."""
    ds = EpochDataset(store, epoch, consumer=None)
    group = zarr.open_group(str(store) + f"/epoch-{epoch:05d}", mode="r")
    n = ds.n_samples
    keys, codes = group["keys"][:].reshape(-1)[:n].tolist(), group["island"][:].reshape(-1)[:n].tolist()
    vocabulary = ds.categories["island"]
    return {k: vocabulary[c] for k, c in zip(keys, codes, strict=True)}, vocabulary, dict(zip(keys, codes, strict=True))


def truth(dsn: str, split: str) -> dict[int, str]:
    return {r[0]: r[1] for r in fetch(dsn, "SELECT id, island FROM labels WHERE split = $1", split)}


def process(*args: str) -> subprocess.CompletedProcess[str]:
    """``pgprefetch ARGS`` as its own process: what it prints on stdout and stderr, and its real exit status."""
    return subprocess.run([sys.executable, "-m", "pgprefetch", *args], capture_output=True, text=True, check=False)


# ---------------------------------------------------------------- a validation store takes the training codes


@pytest.mark.parametrize("mode", MODES)
def test_a_validation_store_borrows_the_training_stores_codes(splits: str, tmp_path: Path, mode: str) -> None:
    (tmp_path / "val").mkdir()
    dump(config(tmp_path, mode, "train", "auto", store="train.zarr", name="train.toml"), splits)
    train_values, train_list, train_codes = decoded(tmp_path / "train.zarr")
    assert train_list == ISLANDS
    assert train_values == truth(splits, "train")

    # The problem: a validation store of its own "auto" codes numbers Dream 0, the training store 1.
    dump(config(tmp_path, mode, "val", "auto", store="own.zarr", name="own.toml"), splits)
    _, own_list, _ = decoded(tmp_path / "own.zarr")
    assert own_list == ["Dream", "Torgersen"]

    # The fix: the path is relative to the config file's folder, as [store] path is.
    val = config(tmp_path / "val", mode, "val", '{ from = "../train.zarr" }', store="val.zarr", name="val.toml")
    result = dump(val, splits)
    values, vocabulary, codes = decoded(tmp_path / "val" / "val.zarr")
    assert vocabulary == ISLANDS  # the training store's list: Dream is code 1 in both
    assert values == truth(splits, "val")  # every sample decodes to what the database holds
    by_value = {value: train_list.index(value) for value in ISLANDS}
    assert all(codes[k] == by_value[v] for k, v in truth(splits, "val").items())
    manifest = EpochDataset(Path(result.path).parent, 0, consumer=None).manifest
    assert manifest["fields"]["island"]["categories_from"] == str(tmp_path / "train.zarr")  # where they came from
    assert manifest["config_content"]["fields"][0]["categories"] == {"from": "../train.zarr"}
    assert not (tmp_path / "val" / "val.zarr" / ".pgprefetch" / "categories.json").exists()  # nothing of its own
    assert train_codes == decoded(tmp_path / "train.zarr")[2]  # the training store is read, never written


@pytest.mark.parametrize("mode", MODES)
def test_a_value_the_borrowed_vocabulary_lacks_is_the_error_of_a_listed_one(
    splits: str, tmp_path: Path, mode: str
) -> None:
    execute(splits, "UPDATE labels SET island = 'Dream' WHERE island = 'Biscoe'")  # training sees no Biscoe
    dump(config(tmp_path, mode, "train", "auto", store="train.zarr", name="train.toml"), splits)
    execute(splits, "UPDATE labels SET island = 'Biscoe' WHERE id = 100")  # a validation row that is Biscoe
    listed = config(tmp_path, mode, "val", ["Dream", "Torgersen"], store="listed.zarr", name="listed.toml")
    borrowed = config(tmp_path, mode, "val", '{ from = "train.zarr" }', store="val.zarr", name="val.toml")
    listed_code, listed_out = run_cli("dump", "--config", str(listed), "--epoch", "0", "--dsn", splits)
    code, out = run_cli("dump", "--config", str(borrowed), "--epoch", "0", "--dsn", splits)
    assert (code, listed_code) == (1, 1)
    line, listed_line = out.strip().splitlines()[-1], listed_out.strip().splitlines()[-1]
    # Both modes name the value, and the list it is not in (scan mode's COPY sends -1 for it: it is looked up).
    assert line == listed_line + f" (the vocabulary of {tmp_path / 'train.zarr'})"
    assert listed_line == (
        "Error: sample (id=100): field island, column island value 'Biscoe' is not in [fields.island] categories"
    )
    assert "Traceback" not in out


def test_check_uses_and_shows_the_borrowed_vocabulary(splits: str, tmp_path: Path) -> None:
    dump(config(tmp_path, "query", "train", "auto", store="train.zarr", name="train.toml"), splits)
    val = config(tmp_path, "query", "val", '{ from = "train.zarr" }', store="val.zarr", name="val.toml")
    code, out = run_cli("check", "--config", str(val), "--dsn", splits, "--json")
    assert code == 0, out
    report = json.loads(out)
    assert report["fields"]["island"]["categories"] == ISLANDS
    assert report["fields"]["island"]["categories from"] == str(tmp_path / "train.zarr")
    assert not any("codes are per store" in n for n in report["notes"])  # borrowed codes are not this store's


def test_a_vocabulary_borrowed_from_an_object_store(splits: str, tmp_path: Path, s3: S3) -> None:
    train = f"s3://{s3.bucket()}/runs/train"
    dump(config(tmp_path, "query", "train", "auto", store=train, name="train.toml"), splits)
    val = config(tmp_path, "query", "val", f'{{ from = "{train}" }}', store="val.zarr", name="val.toml")
    dump(val, splits)
    values, vocabulary, _ = decoded(tmp_path / "val.zarr")
    assert (values, vocabulary) == (truth(splits, "val"), ISLANDS)
    manifest = EpochDataset(tmp_path / "val.zarr", 0, consumer=None).manifest
    assert manifest["fields"]["island"]["categories_from"] == train


def test_a_borrowed_vocabulary_is_refused_in_one_line_where_there_is_none(splits: str, tmp_path: Path) -> None:
    (tmp_path / "not-a-store").mkdir()
    (tmp_path / "not-a-store" / "notes.txt").write_text("mine\n")
    dump(config(tmp_path, "query", "train", ISLANDS, store="listed.zarr", name="listed.toml"), splits)
    where = "[fields.island] categories = { from = "
    cases = {
        "absent.zarr": f'{where}"absent.zarr" }}: no pgprefetch store at {tmp_path / "absent.zarr"}: dump that '
        "store first, or fix the path (relative to the config file's folder)",
        "not-a-store": f'{where}"not-a-store" }}: no pgprefetch store at {tmp_path / "not-a-store"}: dump that '
        "store first, or fix the path (relative to the config file's folder)",
        "listed.zarr": f'{where}"listed.zarr" }}: {tmp_path / "listed.zarr"} has no vocabulary of field island '
        '(it has none; a field has one where it is "auto")',
        "val.zarr": f'{where}"val.zarr" }}: that is this config\'s own store; give the store to share codes '
        'with, or "auto"',
    }
    for source, message in cases.items():
        val = config(tmp_path, "query", "val", f'{{ from = "{source}" }}', store="val.zarr", name="val.toml")
        for command in ("dump", "check"):
            extra = ["--epoch", "0"] if command == "dump" else []
            done = process(command, "--config", str(val), "--dsn", splits, *extra)
            assert (done.returncode, done.stdout, done.stderr) == (2, "", f"Error: {message}\n"), (source, command)
    assert not (tmp_path / "val.zarr").exists()
    assert sorted(p.name for p in (tmp_path / "not-a-store").iterdir()) == ["notes.txt"]  # nothing written there


@pytest.mark.parametrize(
    ("written", "message"),
    [
        (
            '{ form = "train.zarr" }',
            'expected { from = "STORE" } (a store path or s3://...), got {"form": "train.zarr"}',
        ),
        ("{ from = 3 }", 'expected { from = "STORE" } (a store path or s3://...), got {"from": 3}'),
        ('{ from = "gs://b/train" }', "unsupported store URL gs://...: use a local folder or s3://bucket/prefix"),
    ],
    ids=["misspelt", "not-a-string", "other-scheme"],
)
def test_a_malformed_borrowed_vocabulary_is_refused_when_the_config_is_read(
    tmp_path: Path, written: str, message: str
) -> None:
    path = config(tmp_path, "query", "val", written, store="val.zarr", name="val.toml")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"{path}: [fields.island] categories: {message}"


def test_the_auto_and_list_forms_keep_their_meaning_and_identity(tmp_path: Path) -> None:
    auto = load_config(config(tmp_path, "query", "val", "auto", store="a.zarr", name="a.toml"))
    listed = load_config(config(tmp_path, "query", "val", ISLANDS, store="b.zarr", name="b.toml"))
    assert auto.field("island").categories == "auto"
    assert listed.field("island").categories == tuple(ISLANDS)
    # Where the other store lies decides the codes: it is part of the config's identity, as written.
    one = load_config(config(tmp_path, "query", "val", '{ from = "t.zarr" }', store="v.zarr", name="one.toml"))
    two = load_config(config(tmp_path, "query", "val", '{ from = "u.zarr" }', store="v.zarr", name="two.toml"))
    (tmp_path / "moved").mkdir()
    moved = load_config(
        config(tmp_path / "moved", "query", "val", '{ from = "t.zarr" }', store="v.zarr", name="c.toml")
    )
    assert len({auto.sha256(), listed.sha256(), one.sha256(), two.sha256()}) == 4
    assert moved.sha256() == one.sha256()  # both stores moved together: the same config


# ---------------------------------------------------------------- "codes are per store", said when they are fixed


@pytest.mark.parametrize("mode", MODES)
def test_check_and_the_dump_say_codes_are_per_store_when_a_store_fixes_them(
    splits: str, tmp_path: Path, mode: str
) -> None:
    cfg = config(tmp_path, mode, "train", "auto", store="train.zarr", name="train.toml")
    store = tmp_path / "train.zarr"
    notice = (
        f"[fields.island] categories: codes are per store: {store} {{}} the 3 value(s) found in sorted order; a "
        "store dumped from other rows (a validation split) codes its own: give its field categories = "
        f'{{{{ from = "{store}" }}}} to share these codes'
    )
    checked = process("check", "--config", str(cfg), "--dsn", splits)
    assert checked.returncode == 0, checked.stderr
    assert f"note: {notice.format('will code')}" in checked.stdout.splitlines()
    first = process("dump", "--config", str(cfg), "--dsn", splits, "--epoch", "0")
    assert first.returncode == 0, first.stderr
    said = [line for line in first.stderr.splitlines() if "codes are per store" in line]
    assert len(said) == 1
    assert said[0].endswith(f"pgprefetch INFO: {notice.format('codes')}")
    # Once the store has its codes, neither says it again: they are fixed.
    again = process("dump", "--config", str(cfg), "--dsn", splits, "--epoch", "1")
    rechecked = process("check", "--config", str(cfg), "--dsn", splits, "--epoch", "2")
    assert (again.returncode, rechecked.returncode) == (0, 0)
    assert "codes are per store" not in again.stderr + rechecked.stdout
