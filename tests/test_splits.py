"""Splits against PostgreSQL (#53): disjoint and covering as the database counts, stable as rows come and go,
one vocabulary, evaluation splits written once, windows split by series, mixed sources split per source.

The expected split of a key is computed by the assignment itself (:func:`split_codes`, proved a partition on
the fast tier): what is checked here is that every way of dumping hands each split exactly its keys.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pgprefetch import EpochArrays
from pgprefetch.config.model import SplitsConfig
from pgprefetch.errors import StoreError
from pgprefetch.write.order.splits import split_codes

from .harness.configs import scan_config
from .harness.db import execute, fetch
from .harness.dumps import chunk_bytes, dump, read_arrays, run_cli
from .harness.mixing import CODE, MIX_TABLES, WEB, mix_config

RULE = SplitsConfig(shares=(("train", 0.9), ("val", 0.05), ("test", 0.05)), seed=0)
SPLITS = "[splits]\ntrain = 0.9\nval = 0.05\ntest = 0.05\n"
N = 100_000


@pytest.fixture
def items(db: str) -> str:
    execute(
        db,
        "CREATE TABLE items (id bigint PRIMARY KEY, v real NOT NULL, label text NOT NULL)",
        "INSERT INTO items SELECT i, i * 0.5, CASE WHEN i % 3 = 0 THEN 'a' ELSE 'b' END "
        f"FROM generate_series(1, {N}) i",
    )
    return db


def _config(folder: Path, splits: str = SPLITS, name: str = "c.toml") -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(
        "[source]\nconnections = 2\n"
        '[samples]\nkeys = "SELECT id FROM items"\nquery = "SELECT v, label FROM items WHERE id = $1"\n'
        '[fields.v]\ncolumns = ["v"]\ndtype = "float32"\n'
        '[fields.label]\ncolumns = ["label"]\ndtype = "int8"\ncategories = "auto"\n'
        "[batches]\nsize = 1000\ndrop_last = false\n"
        f"{splits}"
        '[store]\npath = "store.zarr"\n'
    )
    return path


def _refused(config: Path, dsn: str, *args: str) -> str:
    """The one line ``pgprefetch dump --epoch 0 ARGS`` ends with, having refused (exit 2, no traceback)."""
    code, out = run_cli("dump", "--config", str(config), "--dsn", dsn, "--epoch", "0", *args)
    assert code == 2, out
    assert "Traceback" not in out
    return out.strip().splitlines()[-1]


def _keys(arrays: dict[str, np.ndarray], n: int) -> np.ndarray:
    return arrays["keys"].reshape(-1, arrays["keys"].shape[-1])[:n, 0]


def _expected(db: str, table: str = "items") -> dict[str, set[int]]:
    ids = np.array([r[0] for r in fetch(db, f"SELECT id FROM {table}")], dtype=np.int64)
    codes = split_codes(ids[None, :], RULE)
    return {name: set(ids[codes == i].tolist()) for i, name in enumerate(RULE.names)}


def test_the_splits_are_disjoint_cover_every_key_and_hold_their_shares(items: str, tmp_path: Path) -> None:
    config = _config(tmp_path / "c")
    got = {}
    for name in RULE.names:
        result = dump(config, items, split=name)
        got[name] = set(_keys(read_arrays(result), result.n_samples).tolist())
        assert len(got[name]) == result.n_samples  # each key once
    assert got == _expected(items)
    assert set().union(*got.values()) == set(range(1, N + 1))  # every key the database has, in one split
    for name, share in RULE.shares:
        assert abs(len(got[name]) / N - share) < 0.01


def test_no_key_moves_when_rows_are_inserted_and_deleted_between_epochs(items: str, tmp_path: Path) -> None:
    config = _config(tmp_path / "c")
    before = set(_keys(read_arrays(r := dump(config, items, split="train")), r.n_samples).tolist())
    execute(
        items,
        "DELETE FROM items WHERE id % 7 = 0",
        "INSERT INTO items SELECT i, i * 0.5, 'b' FROM generate_series(100001, 120000) i",
    )
    after = set(_keys(read_arrays(r := dump(config, items, 1, split="train")), r.n_samples).tolist())
    assert after == _expected(items)["train"]
    assert before - after == {k for k in before if k % 7 == 0}  # only the deleted left
    assert all(k > N for k in after - before)  # only inserted keys came in


def test_auto_categories_code_one_value_alike_in_every_split(items: str, tmp_path: Path) -> None:
    """A value present only in a validation key is in the train split's list too: one vocabulary per store."""
    rare = min(_expected(items)["val"])
    execute(items, f"UPDATE items SET label = 'rare' WHERE id = {rare}")
    config = _config(tmp_path / "c")
    train = dump(config, items, split="train")
    val = dump(config, items, split="val")
    store = tmp_path / "c" / "store.zarr"
    lists = [
        EpochArrays(store, 0, split=r, consumer=None).manifest["fields"]["label"]["categories"]
        for r in ("train", "val")
    ]
    assert train.n_samples > val.n_samples
    assert lists[0] == lists[1] == ["a", "b", "rare"]
    recorded = EpochArrays(store, 0, split="val", consumer=None).manifest["split"]
    assert recorded == {"name": "val", "shares": [["train", 0.9], ["val", 0.05], ["test", 0.05]], "seed": 0}
    arrays = read_arrays(val)
    keys = _keys(arrays, val.n_samples)
    assert arrays["label"].reshape(-1)[: val.n_samples][keys == rare].tolist() == [2]


def test_an_evaluation_split_is_written_once_and_serves_every_epoch_number(items: str, tmp_path: Path) -> None:
    config = _config(tmp_path / "c")
    code, out = run_cli("dump", "--config", str(config), "--dsn", items, "--split", "val", "--epoch", "7", "--json")
    assert code == 0, out
    said = json.loads(out.strip().splitlines()[-1])
    assert (said["epoch"], said["status"]) == (0, "written")
    store = tmp_path / "c" / "store.zarr" / "splits" / "val"
    assert sorted(p.name for p in store.glob("epoch-*")) == ["epoch-00000"]
    code, out = run_cli("dump", "--config", str(config), "--dsn", items, "--split", "val", "--epoch", "3", "--json")
    assert code == 0, out
    assert json.loads(out.strip().splitlines()[-1])["status"] == "skipped"
    seven, zero = (EpochArrays(tmp_path / "c" / "store.zarr", e, split="val", consumer=None) for e in (7, 0))
    assert seven.epoch == zero.epoch == 0
    for a, b in zip(seven, zero, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)
    assert seven.n_samples == len(_expected(items)["val"])  # every sample: no short last batch dropped


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ([], "--split is required (split= in Python): the config's [splits] are train, val, test"),
        (["--split", "holdout"], "--split holdout: "),
        (["--split", "train", "--config-splits", "train = 0.8\nval = 0.1\ntest = 0.1"], "[splits] train is 0.9 there"),
    ],
)
def test_split_mistakes_are_one_line(items: str, tmp_path: Path, args: list[str], said: str) -> None:
    config = _config(tmp_path / "c")
    if "--config-splits" in args:
        assert dump(config, items, split="val").n_samples  # the store's rule, recorded
        rule = args[args.index("--config-splits") + 1]
        config = _config(tmp_path / "c", f"[splits]\n{rule}\n", name="changed.toml")
        args = args[: args.index("--config-splits")]
    assert said in _refused(config, items, *args)


def test_a_split_asked_of_a_config_without_splits_is_one_line(items: str, tmp_path: Path) -> None:
    config = _config(tmp_path / "c", splits="")
    assert "the config has no [splits]" in _refused(config, items, "--split", "train")


def test_windows_are_split_by_series(ticks: str, tmp_path: Path) -> None:
    config = scan_config(tmp_path / "w", table="ticks", key=["series_id"], order="t", window=8, stride=4)
    config.write_text(config.read_text() + SPLITS)
    series = {}
    for name in RULE.names:
        result = dump(config, ticks, split=name)
        keys = read_arrays(result)["keys"].reshape(-1, 2)[: result.n_samples]
        series[name] = set(keys[:, 0].tolist())
        codes = split_codes(keys[:, :1].T.copy(), RULE)
        assert (codes == RULE.names.index(name)).all()  # a window's split is its series'
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        assert not series[a] & series[b]


def test_mixed_sources_are_each_split_by_the_same_rule(db: str, tmp_path: Path) -> None:
    execute(db, *MIX_TABLES)
    sources = {"web": {"weight": 1, **WEB}, "code": {"weight": 1, **CODE}}
    config = mix_config(tmp_path, sources, size=10, samples=100)
    config.write_text(config.read_text() + SPLITS)
    for name in ("train", "val"):
        arrays = read_arrays(result := dump(config, db, split=name))
        keys = arrays["keys"].reshape(-1, arrays["keys"].shape[-1])[: result.n_samples, 0]
        source = arrays["source"].reshape(-1)[: result.n_samples]
        for code, table in enumerate(("web", "code_docs")):
            mine = keys[source == code]
            assert mine.size, f"{name}: no sample of {table}"
            codes = split_codes(mine[None, :].astype(np.int64), RULE)
            assert (codes == RULE.names.index(name)).all()


def test_readers_open_a_split_and_refuse_one_the_store_lacks(items: str, tmp_path: Path) -> None:
    from pgprefetch.torch import EpochStream

    config = _config(tmp_path / "c")
    dump(config, items, split="test")
    store = tmp_path / "c" / "store.zarr"
    later = EpochStream(store, 3, 2, split="test", consumer=None, timeout=1)  # its epochs 3 and 4: the one epoch
    assert later.categories == {"label": ["a", "b"]}
    assert later.sources == []
    stream = EpochStream(store, 0, 2, split="test", keys=True, consumer=None)  # its epochs 0 and 1: the one epoch
    seen = [int(k) for batch in stream for k in batch["keys"][:, 0]]
    expected = sorted(_expected(items)["test"])
    assert sorted(seen) == sorted(expected * 2)
    from pgprefetch import ArrayStream, EpochDataset
    from pgprefetch.grain import EpochSource

    one = sorted(expected)
    torch_reader = EpochDataset(store, 5, split="test", consumer=None)  # the test split's one epoch, as epoch 5
    assert sorted(int(k[0]) for i in range(len(torch_reader)) for k in torch_reader.sample_keys(i)) == one
    arrays = ArrayStream(store, 0, 1, split="test", keys=True, consumer=None)
    assert sorted(int(k) for batch in arrays for k in batch["keys"][:, 0]) == one
    source = EpochSource(store, 3, split="test", keys=True, consumer=None)
    assert sorted(int(k) for i in range(len(source)) for k in source[i]["keys"][:, 0]) == one
    with pytest.raises(StoreError, match="has no split 'holdout'; its splits: train, val, test"):
        EpochArrays(store, 0, split="holdout")
    with pytest.raises(StoreError, match="has no splits: open it without split="):
        EpochArrays(tmp_path / "c" / "store.zarr" / "splits" / "test", 0, split="train")


def test_store_commands_show_every_split_or_the_one_asked_for(items: str, tmp_path: Path) -> None:
    config = _config(tmp_path / "c")
    dump(config, items, split="train")
    dump(config, items, 1, split="train")
    dump(config, items, split="val")
    code, out = run_cli("ls", "--config", str(config))
    assert code == 0, out
    assert [line for line in out.splitlines() if line.startswith("split ")] == ["split train:", "split val:"]
    code, out = run_cli("ls", "--config", str(config), "--json")
    listed = json.loads(out)["splits"]
    assert [e["epoch"] for e in listed["train"]["epochs"]] == [0, 1]
    assert [e["epoch"] for e in listed["val"]["epochs"]] == [0]
    code, out = run_cli("verify", "--config", str(config), "--split", "val", "--epoch", "5", "--json")
    assert code == 0, out
    assert json.loads(out) == {"epoch": 0, "problems": [], "ok": True}  # an evaluation split's one epoch
    code, out = run_cli("stats", "--config", str(config), "--epoch", "0", "--json")
    assert code == 0, out
    assert set(json.loads(out)["splits"]) == {"train", "val"}
    EpochArrays(tmp_path / "c" / "store.zarr", 1, split="train")  # a training run records it opened epoch 1
    code, out = run_cli("prune", "--config", str(config), "--split", "train", "--keep", "0", "--json")
    assert code == 0, out
    assert [
        e["epoch"] for e in json.loads(run_cli("ls", "--config", str(config), "--json")[1])["splits"]["train"]["epochs"]
    ] == [1]
    code, out = run_cli("ls", "--config", str(config), "--split", "holdout")
    assert code != 0
    assert "has no split 'holdout'; its splits: train, val, test" in out.strip().splitlines()[-1]


def test_check_goes_through_every_split_or_the_one_asked_for(items: str, tmp_path: Path) -> None:
    config = _config(tmp_path / "c")
    code, out = run_cli("check", "--config", str(config), "--dsn", items, "--batches", "2", "--json")
    assert code == 0, out
    checked = json.loads(out)["splits"]
    assert list(checked) == ["train", "val", "test"]
    code, out = run_cli("check", "--config", str(config), "--dsn", items, "--batches", "2", "--split", "val")
    assert code == 0, out
    assert "split " not in out


def test_a_mixed_split_epoch_read_by_four_ranks_resumes_on_three_at_another_batch_size(db: str, tmp_path: Path) -> None:
    """Every sample of the epoch once: what four ranks read, then what three read from their saved state.

    The remainder three ranks cannot share evenly (fewer than 3 x 7 samples) is the readers' documented drop.
    """
    from .harness.mixing import by_source

    execute(db, *MIX_TABLES)
    sources = {"web": {"weight": 2, **WEB}, "code": {"weight": 1, **CODE}}
    config = mix_config(tmp_path, sources, size=10, samples=400)
    config.write_text(config.read_text() + SPLITS)
    result = dump(config, db, split="train")
    store = tmp_path / "store.zarr"

    def samples(batch: dict[str, np.ndarray]) -> list[tuple[int, int]]:
        source, key = by_source(batch)
        return list(zip(source.tolist(), key.tolist(), strict=True))

    four = [EpochArrays(store, 0, rank=r, world_size=4, split="train", consumer=None) for r in range(4)]
    seen = [s for ds in four for _, batch in zip(range(3), ds, strict=False) for s in samples(batch)]
    state = four[0].state_dict(batches=3)
    assert all(ds.state_dict(batches=3) == state for ds in four)
    rest = []
    for r in range(3):
        ds = EpochArrays(store, 0, rank=r, world_size=3, batch_size=7, split="train", consumer=None)
        ds.load_state_dict(state)
        rest += [s for batch in ds for s in samples(batch)]
    everything = samples({"x": read_arrays(result)["x"].reshape(-1, 2)[: result.n_samples]})
    assert len(seen) == 120
    # the epoch's samples from the first on, each once (a key comes again in a later pass: count, not set)
    assert Counter(seen + rest) == Counter(everything[: len(seen) + len(rest)])
    assert Counter(seen) == Counter(everything[:120])
    assert result.n_samples - len(seen) - len(rest) < 3 * 7  # the remainder three ranks cannot share
    assert {s for s, _ in seen + rest} == {1, 2}  # both sources, each split by the rule


TIME_CUT = '[splits]\nby = "order"\ntrain = {}\nval = { from = "2024-02-15" }\ntest = { from = "2024-03-20" }\n'


def test_a_time_cut_gives_each_split_the_windows_wholly_inside_its_range(ticks: str, tmp_path: Path) -> None:
    """``by = "order"``: a window is in the split whose range holds all its rows' days; one across a cut, in none."""
    import datetime as dt

    window, stride = 8, 4
    config = scan_config(tmp_path / "t", table="ticks", key=["series_id"], order="day", window=window, stride=stride)
    config.write_text(config.read_text() + TIME_CUT)
    cuts = [dt.date(2024, 2, 15), dt.date(2024, 3, 20)]
    rows: dict[int, list[dt.date]] = {}
    for series, day in fetch(ticks, "SELECT series_id, day FROM ticks ORDER BY series_id, day"):
        rows.setdefault(series, []).append(day)
    expected: dict[str, set[tuple[int, dt.date]]] = {"train": set(), "val": set(), "test": set()}
    across = 0
    for series, days in rows.items():
        for i in range(0, len(days) - window + 1, stride):
            first, last = days[i], days[i + window - 1]
            ranges = zip(RULE.names, [None, *cuts], [*cuts, None], strict=True)
            which = [name for name, lo, hi in ranges if (lo is None or first >= lo) and (hi is None or last < hi)]
            if which:
                expected[which[0]].add((series, first))
            else:
                across += 1
    assert across  # the cuts fall inside some series' windows: those are in no split
    for name in RULE.names:
        result = dump(config, ticks, split=name)
        keys = read_arrays(result)["keys"].reshape(-1, 2)[: result.n_samples]
        got = {(int(s), dt.date(1970, 1, 1) + dt.timedelta(days=int(d))) for s, d in keys}
        assert got == expected[name], name


@pytest.mark.parametrize(
    ("splits", "said"),
    [
        (
            '[splits]\nby = "order"\ntrain = {}\nval = { from = 50 }\n',
            "[splits] val from = 50: the order column is date",
        ),
        ('[splits]\nby = "order"\ntrain = { from = "2024-01-01" }\nval = { from = "2024-02-01" }\n', "starts at the"),
        (
            '[splits]\nby = "order"\ntrain = {}\nval = { from = "2024-03-01" }\ntest = { from = "2024-02-01" }\n',
            "must come after the split before it's",
        ),
    ],
)
def test_a_time_cut_that_cannot_be_applied_is_one_line(ticks: str, tmp_path: Path, splits: str, said: str) -> None:
    config = scan_config(tmp_path / "t", table="ticks", key=["series_id"], order="day", window=8)
    config.write_text(config.read_text() + splits)
    assert said in _refused(config, ticks, "--split", "val")


def test_a_time_cut_of_samples_without_times_is_one_line(items: str, tmp_path: Path) -> None:
    config = _config(tmp_path / "q", splits='[splits]\nby = "order"\ntrain = {}\nval = { from = 3 }\n')
    assert '[splits] by: "order" cuts windows by their rows\' times' in _refused(config, items, "--split", "val")


def test_a_store_cut_in_time_refuses_a_moved_cut_naming_it(ticks: str, tmp_path: Path) -> None:
    config = scan_config(tmp_path / "t", table="ticks", key=["series_id"], order="day", window=8)
    config.write_text(config.read_text() + TIME_CUT)
    assert dump(config, ticks, split="val").n_samples
    config.write_text(config.read_text().replace('"2024-02-15"', '"2024-02-20"'))
    assert "[splits] val from is 2024-02-15 there, 2024-02-20 in the config" in _refused(
        config, ticks, "--split", "train"
    )


def test_splits_in_an_object_store_hold_the_local_splits_bytes(items: str, s3: Any, tmp_path: Path) -> None:
    """The splits of an S3 store: the same rule record, a prefix per split, the local store's bytes."""
    from .harness.s3 import epoch_objects

    bucket = s3.bucket()
    local_config = _config(tmp_path / "c")
    remote_config = _config(tmp_path / "c", name="s3.toml")
    remote_config.write_text(remote_config.read_text().replace('"store.zarr"', f'"s3://{bucket}/runs/s"'))
    for name in ("train", "val"):
        local = dump(local_config, items, split=name)
        remote = dump(remote_config, items, split=name)
        assert remote.path == f"s3://{bucket}/runs/s/splits/{name}/epoch-00000"
        assert epoch_objects(s3, bucket, f"runs/s/splits/{name}") == chunk_bytes(local.path)
    assert json.loads(s3.objects(bucket, "runs/s/.pgprefetch/splits.json")[""])["shares"][1] == ["val", 0.05]
    val = EpochArrays(f"s3://{bucket}/runs/s", 9, split="val", consumer=None)
    assert val.epoch == 0
    assert val.n_samples == len(_expected(items)["val"])


def test_a_split_folder_planted_as_a_link_is_refused_and_nothing_is_written_through_it(
    items: str, tmp_path: Path
) -> None:
    config = _config(tmp_path / "c")
    dump(config, items, split="train")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "c" / "store.zarr" / "splits" / "val").symlink_to(elsewhere)
    code, out = run_cli("dump", "--config", str(config), "--dsn", items, "--epoch", "0", "--split", "val")
    assert code != 0
    assert "is a link: a store's folders are never reached through links" in out.strip().splitlines()[-1]
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(StoreError, match="is a link"):
        EpochArrays(tmp_path / "c" / "store.zarr", 0, split="val")


def test_the_python_api_dumps_one_split_as_the_command_does(items: str, tmp_path: Path) -> None:
    import pgprefetch

    config = _config(tmp_path / "c")
    (result,) = pgprefetch.dump(config, 4, split="val", dsn=items)
    assert result.epoch == 0  # an evaluation split's one epoch
    store = tmp_path / "c" / "store.zarr"
    assert [i.epoch for i in pgprefetch.ls(store, split="val")] == [0]
    assert pgprefetch.verify(store, 4, split="val") == []
    assert pgprefetch.prune(store, 0, split="val").epochs == []
    code, out = run_cli("dump", "--config", str(config), "--dsn", items, "--split", "val", "--epoch", "0", "--json")
    assert code == 0, out
    assert json.loads(out.strip().splitlines()[-1])["status"] == "skipped"  # the API's epoch, found complete


def test_query_mode_windows_split_by_series_as_their_scan_mode_twin(db: str, tmp_path: Path) -> None:
    """co2_query.toml writes co2.toml's epochs byte for byte (the README's twins): split, they stay twins."""
    root = Path(__file__).resolve().parent.parent / "configs"
    execute(db, (root / "penguins.sql").read_text())
    (tmp_path / "configs").mkdir()
    (tmp_path / "prefetch").mkdir()
    rule = "[splits]\ntrain = 0.5\nval = 0.5\nseed = 2\n"
    for name in ("co2.toml", "co2_query.toml"):
        (tmp_path / "configs" / name).write_text((root / name).read_text() + rule)
    for split in ("train", "val"):
        scan = dump(tmp_path / "configs" / "co2.toml", db, split=split)
        query = dump(tmp_path / "configs" / "co2_query.toml", db, split=split)
        assert scan.n_samples
        assert chunk_bytes(scan.path) == chunk_bytes(query.path)
    stations = {
        split: {int(k) for k in read_arrays(r)["keys"].reshape(-1, 2)[: r.n_samples, 0]}
        for split in ("train", "val")
        if (r := dump(tmp_path / "configs" / "co2_query.toml", db, split=split))
    }
    assert stations["train"]
    assert stations["val"]
    assert not stations["train"] & stations["val"]  # no station in both


def test_a_split_dumped_on_a_ray_cluster_is_the_single_process_split_byte_for_byte(
    ray_cluster: object, items: str, tmp_path: Path
) -> None:
    from .harness.raycluster import on_ray

    config = _config(tmp_path / "c")
    spread = _config(tmp_path / "c", name="ray.toml")
    spread.write_text(spread.read_text().replace('"store.zarr"', '"ray.zarr"'))
    for name in ("train", "val"):
        single = dump(config, items, split=name)
        result = on_ray(spread, items, parts=2, split=name)
        assert (result.executor, result.parts) == ("ray", 2)
        assert chunk_bytes(Path(result.path)) == chunk_bytes(single.path)


def test_a_failed_first_dump_of_a_split_leaves_no_store(items: str, tmp_path: Path) -> None:
    """A wrong DSN: the split's store and the store made for it go; a store with another split stays."""
    config = _config(tmp_path / "c")
    wrong = items.replace("/t_", "/no_such_database_")
    code, _ = run_cli("dump", "--config", str(config), "--dsn", wrong, "--epoch", "0", "--split", "val")
    assert code != 0
    assert not (tmp_path / "c" / "store.zarr").exists()
    dump(config, items, split="train")
    code, _ = run_cli("dump", "--config", str(config), "--dsn", wrong, "--epoch", "0", "--split", "val")
    assert code != 0
    assert sorted(p.name for p in (tmp_path / "c" / "store.zarr" / "splits").iterdir()) == ["train"]
    assert EpochArrays(tmp_path / "c" / "store.zarr", 0, split="train", consumer=None).n_samples


def test_an_evaluation_split_stream_saves_its_own_epoch_and_resumes_the_rest(items: str, tmp_path: Path) -> None:
    from pgprefetch import ArrayStream

    config = _config(tmp_path / "c")
    dump(config, items, split="val")
    store = tmp_path / "c" / "store.zarr"
    first = ArrayStream(store, 3, 2, split="val", consumer=None)
    it = iter(first)
    for _ in range(2):
        next(it)
    state = first.state_dict()
    assert state["epoch"] == 3  # the stream's epoch, though the split's one epoch (0) is what it reads
    rest = ArrayStream(store, 3, 2, split="val", consumer=None)
    rest.load_state_dict(state)
    per_epoch = len(EpochArrays(store, 0, split="val", consumer=None))
    assert sum(1 for _ in rest) == 2 * per_epoch - 2  # epochs 3 and 4, less the two batches read


def test_a_reader_of_a_split_waits_for_the_first_dump_and_a_store_with_splits_needs_one_named(
    items: str, tmp_path: Path
) -> None:
    import threading

    config = _config(tmp_path / "c")
    store = tmp_path / "c" / "store.zarr"
    opened: list[EpochArrays] = []
    reader = threading.Thread(
        target=lambda: opened.append(EpochArrays(store, 0, split="test", wait=True, timeout=120, consumer=None))
    )
    reader.start()  # before the store exists, as a training job started before cron's first dump
    dump(config, items, split="test")
    reader.join()
    assert opened[0].n_samples == len(_expected(items)["test"])
    with pytest.raises(StoreError, match=r"has splits \(train, val, test\): open one with split=NAME"):
        EpochArrays(store, 0)


def test_forget_goes_through_the_splits_that_know_the_run(items: str, tmp_path: Path) -> None:
    config = _config(tmp_path / "c")
    dump(config, items, split="train")
    dump(config, items, split="val")
    store = tmp_path / "c" / "store.zarr"
    EpochArrays(store, 0, split="train", consumer="runA")
    code, out = run_cli("forget", "--config", str(config), "runA", "--json")
    assert code == 0, out
    said = json.loads(out)["splits"]
    assert said["train"]["forgotten"]
    assert "skipped" in said["val"]  # val never saw runA: said, not the end
    code, out = run_cli("forget", "--config", str(config), "runA")
    assert code == 2, out  # no split knows it now


def test_an_evaluation_split_takes_no_subsample(items: str, tmp_path: Path) -> None:
    config = _config(tmp_path / "c")
    config.write_text(config.read_text().replace('query = "SELECT', 'fraction = 0.5\nquery = "SELECT'))
    val = dump(config, items, split="val")
    assert val.n_samples == len(_expected(items)["val"])  # every sample, whatever fraction says
    train = dump(config, items, split="train")
    assert train.n_samples < 0.6 * len(_expected(items)["train"])  # training's epochs still subsample


def test_cut_points_with_and_without_an_offset_are_one_line(tmp_path: Path) -> None:
    from pgprefetch.config.load import load_config
    from pgprefetch.errors import ConfigError

    config = scan_config(tmp_path / "t", table="ticks", key=["series_id"], order="ts", window=8)
    cuts = (
        '[splits]\nby = "order"\ntrain = {}\nval = { from = "2024-01-02T00:00" }\n'
        'test = { from = "2024-01-03T00:00+00:00" }\n'
    )
    config.write_text(config.read_text() + cuts)
    with pytest.raises(ConfigError, match="must come after the split before it's, of the same kind"):
        load_config(config)
