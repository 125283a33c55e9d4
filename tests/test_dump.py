"""`pgprefetch dump` against the real server: content, order, snapshot, publication."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr

from pgprefetch import load_config
from pgprefetch.decode import wire
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.columns import Column
from pgprefetch.pg.statement import batch_statement
from pgprefetch.write.order.shuffle import order_part
from pgprefetch.write.pipeline import dump_epoch

from .harness.configs import SEQUENCES, s_config, write_config
from .harness.db import S_ROWS, execute, fetch
from .harness.dumps import chunk_bytes, dump, epoch_group, read_arrays


@pytest.fixture
def seq_config(tmp_path: Path) -> Path:
    return write_config(tmp_path, **SEQUENCES)


def ticks_by_key(dsn: str) -> dict[tuple[int, int], np.ndarray]:
    """What the database says each window is: (f0, f1, label) rows per (series_id, start_t)."""
    rows = fetch(dsn, "SELECT series_id, t, f0, f1, label FROM ticks ORDER BY series_id, t")
    table = np.array([tuple(r) for r in rows], dtype=np.float64)
    out = {}
    for s in np.unique(table[:, 0]):
        series = table[table[:, 0] == s]
        for start in range(0, len(series) - 63):
            out[int(s), int(series[start, 1])] = series[start : start + 64, 2:]
    return out


def test_every_dumped_sample_equals_its_per_sample_query(demo_db: str, seq_config: Path) -> None:
    result = dump(seq_config, demo_db)
    arrays = read_arrays(result)
    truth = ticks_by_key(demo_db)
    keys = arrays["keys"].reshape(-1, 2)
    x = arrays["x"].reshape(-1, 64, 2)
    y = arrays["y"].reshape(-1, 64)
    assert len(keys) == result.n_samples > 1000
    for i, (s, t) in enumerate(keys):
        window = truth[int(s), int(t)]
        np.testing.assert_array_equal(x[i], window[:, :2].astype(np.float32))
        np.testing.assert_array_equal(y[i], window[:, 2].astype(np.int64))


def test_batch_shapes_follow_the_config_contract(demo_db: str, seq_config: Path) -> None:
    result = dump(seq_config, demo_db)
    g = epoch_group(result)
    manifest = g.attrs["pgprefetch"]
    assert g["x"].shape == (result.n_batches, 64, 64, 2)
    assert g["y"].shape == (result.n_batches, 64, 64)
    assert g["keys"].shape == (result.n_batches, 64, 2)
    assert g["x"].chunks == (1, 64, 64, 2)
    assert manifest["fields"] == {
        "x": {"dtype": "float32", "shape": [64, 2], "columns": ["f0", "f1"]},
        "y": {"dtype": "int64", "shape": [64], "columns": ["label"]},
    }
    assert manifest["key_columns"] == ["series_id", "start_t"]
    assert manifest["complete"] is True
    assert manifest["n_batches"] == result.n_batches
    assert manifest["server_version"]
    assert manifest["snapshot"]
    # Plain Zarr: batch 7 is zarr.open_group(store)["epoch-00000"]["x"][7].
    root = zarr.open_group(result.path.parent, mode="r")
    np.testing.assert_array_equal(root["epoch-00000"]["x"][7], g["x"][7])


def test_each_key_appears_once_per_epoch(demo_db: str, tmp_path: Path) -> None:
    config = write_config(tmp_path, **{**SEQUENCES, "drop_last": False})
    result = dump(config, demo_db)
    keys = read_arrays(result)["keys"].reshape(-1, 2)[: result.n_samples]
    expected = sorted(tuple(r) for r in fetch(demo_db, "SELECT series_id, start_t FROM train_samples"))
    assert sorted(map(tuple, keys.tolist())) == expected


def test_same_epoch_dumped_twice_is_byte_identical(demo_db: str, tmp_path: Path) -> None:
    a = dump(write_config(tmp_path, **SEQUENCES, name="a.toml", store="a.zarr"), demo_db, epoch=3)
    b = dump(write_config(tmp_path, **SEQUENCES, name="b.toml", store="b.zarr", connections=1), demo_db, epoch=3)
    assert chunk_bytes(a.path) == chunk_bytes(b.path)


def test_another_epoch_gives_another_order(demo_db: str, tmp_path: Path) -> None:
    config = write_config(tmp_path, **{**SEQUENCES, "drop_last": False})
    k0 = read_arrays(dump(config, demo_db, epoch=0))["keys"].reshape(-1, 2)
    k1 = read_arrays(dump(config, demo_db, epoch=1))["keys"].reshape(-1, 2)
    assert sorted(map(tuple, k0.tolist())) == sorted(map(tuple, k1.tolist()))  # same samples...
    assert (k0 != k1).any(axis=1).mean() > 0.95  # ...in another order


def test_order_does_not_follow_the_table_order(demo_db: str, seq_config: Path) -> None:
    keys = read_arrays(dump(seq_config, demo_db))["keys"].reshape(-1, 2)
    as_int = keys[:, 0] * 10_000 + keys[:, 1]
    ascending = np.mean(np.diff(as_int) > 0)
    assert 0.4 < ascending < 0.6  # a shuffle, not heap order


def test_rows_changed_during_the_dump_do_not_reach_the_epoch(db: str, tmp_path: Path) -> None:
    execute(
        db,
        "CREATE TABLE s (id int PRIMARY KEY, v real NOT NULL)",
        "INSERT INTO s SELECT i, i FROM generate_series(1, 512) i",
    )
    config = s_config(tmp_path, connections=1)
    changed = threading.Event()

    class ChangeAfterFirstBatch:
        def start(self, epoch: int, n_samples: int) -> None: ...
        def close(self) -> None: ...
        def advance(self, samples: int, nbytes: int) -> None:
            if not changed.is_set():  # another session commits changes while the dump runs
                t = threading.Thread(
                    target=execute,
                    args=(
                        db,
                        "UPDATE s SET v = -1",
                        "INSERT INTO s SELECT i, -1 FROM generate_series(513, 600) i",
                        "DELETE FROM s WHERE id <= 100",
                    ),
                )
                t.start()
                t.join()
                changed.set()

    cfg = load_config(config, dsn=db)
    result = asyncio.run(dump_epoch(cfg, 0, progress=ChangeAfterFirstBatch()))
    assert changed.is_set()
    arrays = read_arrays(result)
    assert sorted(arrays["keys"].ravel().tolist()) == list(range(1, 513))
    np.testing.assert_array_equal(arrays["v"].ravel(), arrays["keys"].ravel().astype(np.float32))


def test_padded_last_batch_holds_the_database_rows_then_zeros_for_multi_row_samples(
    demo_db: str, tmp_path: Path
) -> None:
    n = len(fetch(demo_db, "SELECT 1 FROM train_samples"))
    # One connection: the last batch reuses the buffers of a full one, so stale rows would show in the padding.
    config = write_config(tmp_path, **{**SEQUENCES, "size": 1000, "drop_last": False, "connections": 1})
    result = dump(config, demo_db)
    g = epoch_group(result)
    assert result.n_batches == -(-n // 1000) >= 2
    assert result.n_samples == g.attrs["pgprefetch"]["n_samples"] == n
    tail = n - (result.n_batches - 1) * 1000
    last = {name: g[name][result.n_batches - 1] for name in ("x", "y", "keys")}
    truth = ticks_by_key(demo_db)
    for i, (s, t) in enumerate(last["keys"][:tail]):
        window = truth[int(s), int(t)]
        np.testing.assert_array_equal(last["x"][i], window[:, :2].astype(np.float32))
        np.testing.assert_array_equal(last["y"][i], window[:, 2].astype(np.int64))
    for name, array in last.items():
        assert not array[tail:].any(), name


def test_padded_last_batch_holds_the_database_rows_then_zeros_for_one_row_samples(s_table: str, tmp_path: Path) -> None:
    config = s_config(tmp_path, size=100, drop_last=False, connections=1)  # 480 rows: 4 full batches and 80
    result = dump(config, s_table)
    assert (result.n_batches, result.n_samples) == (5, 480)
    g = epoch_group(result)
    keys, v = g["keys"][4][:, 0], g["v"][4]
    truth = dict(fetch(s_table, "SELECT id, v FROM s"))
    np.testing.assert_array_equal(v[:80], np.array([truth[int(k)] for k in keys[:80]], dtype=np.float32))
    assert sorted(read_arrays(result)["keys"].ravel()[:480].tolist()) == list(range(1, 481))
    assert not keys[80:].any()
    assert not v[80:].any()


def test_drop_last_drops_the_short_batch(demo_db: str, tmp_path: Path) -> None:
    n = len(fetch(demo_db, "SELECT 1 FROM train_samples"))
    result = dump(write_config(tmp_path, **{**SEQUENCES, "size": 1000}), demo_db)
    assert result.n_batches == n // 1000
    assert result.n_samples == result.n_batches * 1000


def test_fraction_picks_a_deterministic_subset_per_epoch(demo_db: str, tmp_path: Path) -> None:
    config = write_config(tmp_path, **{**SEQUENCES, "size": 8, "fraction": 0.25, "drop_last": False})
    n = len(fetch(demo_db, "SELECT 1 FROM train_samples"))

    def keyset(epoch: int) -> set[tuple[int, int]]:
        r = dump(config, demo_db, epoch=epoch, force=True)
        return set(map(tuple, read_arrays(r)["keys"].reshape(-1, 2)[: r.n_samples].tolist()))

    e0, e0_again, e1 = keyset(0), keyset(0), keyset(1)
    assert e0 == e0_again
    assert e0 != e1
    assert 0.2 * n < len(e0) < 0.3 * n


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
def test_compressed_store_holds_the_same_batches(demo_db: str, tmp_path: Path, compression: str) -> None:
    plain = dump(write_config(tmp_path, **SEQUENCES, name="p.toml", store="p.zarr"), demo_db)
    packed = dump(write_config(tmp_path, **SEQUENCES, name="c.toml", store="c.zarr", compression=compression), demo_db)
    a, b = read_arrays(plain), read_arrays(packed)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_complete_epoch_is_left_untouched_unless_forced(demo_db: str, seq_config: Path) -> None:
    first = dump(seq_config, demo_db)
    stamp = (first.path / "zarr.json").stat().st_mtime_ns
    again = dump(seq_config, demo_db)
    assert again.status == "skipped"
    assert (first.path / "zarr.json").stat().st_mtime_ns == stamp
    forced = dump(seq_config, demo_db, force=True)
    assert forced.status == "written"
    assert chunk_bytes(forced.path) == chunk_bytes(first.path)


def test_failed_dump_publishes_nothing(db: str, tmp_path: Path) -> None:
    execute(
        db,
        "CREATE TABLE s (id int PRIMARY KEY, v real)",
        "INSERT INTO s SELECT i, i FROM generate_series(1, 4000) i",
        "UPDATE s SET v = NULL WHERE id = 3999",
    )
    config = s_config(tmp_path, connections=4)
    with pytest.raises(Exception, match=r"sample \(id=3999\)"):
        dump(config, db)
    store = tmp_path / "store.zarr"
    assert not (store / "epoch-00000").exists()
    # The partial epoch stays, with its journal, for the next dump to resume.
    assert (store / ".pgprefetch" / "partial" / "epoch-00000").is_dir()
    assert (store / ".pgprefetch" / "partial" / "epoch-00000.journal").exists()


def test_one_row_samples_arriving_out_of_key_order_are_put_back_in_order(s_table: str, tmp_path: Path) -> None:
    # No nested loop, no hash join: the server merge-joins the batch's keys with s, so each batch's rows
    # arrive in id order, not in the epoch's (shuffled) order, and the decoder must re-sort them by ordinal.
    (name,) = fetch(s_table, "SELECT current_database()")[0]
    execute(
        s_table, f"ALTER DATABASE {name} SET enable_nestloop = off", f"ALTER DATABASE {name} SET enable_hashjoin = off"
    )
    ids = np.arange(1, S_ROWS + 1, dtype=np.int64).reshape(1, -1)
    keys = ids[:, order_part(ids, seed=0, epoch=0)[0]]
    column = Column("v", "float4", is_array=False)
    sql = batch_statement("SELECT v FROM s WHERE id = $1", KeyColumns(("id",)), [column], rows=1)
    ordinals = wire.flat(fetch(s_table, sql, keys[0, :16].tolist())[0][0], np.dtype(">i4"))
    assert sorted(ordinals.tolist()) == list(range(1, 17))
    assert ordinals.tolist() != list(range(1, 17))  # out of order: the re-sort branch runs
    result = dump(s_config(tmp_path), s_table)
    arrays = read_arrays(result)
    np.testing.assert_array_equal(arrays["keys"].ravel(), keys[0])
    np.testing.assert_array_equal(arrays["v"].ravel(), keys[0].astype(np.float32) * 0.5)


def test_a_dumped_epoch_has_the_pinned_order(s_table: str, tmp_path: Path) -> None:
    # Part of the format (see test_shuffle.GOLDEN): epoch 2 of s, seed 0, as pgprefetch 0.1.0 wrote it.
    keys = read_arrays(dump(s_config(tmp_path), s_table, epoch=2))["keys"].ravel()
    assert keys[:16].tolist() == [98, 136, 43, 315, 313, 133, 54, 51, 444, 157, 285, 305, 261, 21, 77, 373]


def test_drop_last_says_how_many_samples_it_left_out(s_table: str, tmp_path: Path) -> None:
    """``drop_last`` leaves out a different few samples each epoch (24 of 344 penguins): the summary says so."""
    import json

    from click.testing import CliRunner

    from pgprefetch.cli import cli

    def run(name: str, *extra: str, **overrides: object) -> str:
        cfg = s_config(tmp_path, name=f"{name}.toml", store=f"{name}.zarr", size=50, **overrides)
        done = CliRunner().invoke(cli, ["dump", "--epoch", "0", "--dsn", s_table, "--config", str(cfg), *extra])
        assert done.exit_code == 0, done.output
        return done.output

    dropping = run("a")
    assert "9 batches, 450 samples" in dropping
    assert "(30 samples of a short last batch dropped, others each epoch: drop_last = false keeps them)" in dropping
    assert json.loads(run("b", "--json").splitlines()[-1])["last_dropped"] == S_ROWS - 450
    keeping = run("c", drop_last=False)
    assert "10 batches, 480 samples" in keeping
    assert "dropped" not in keeping
