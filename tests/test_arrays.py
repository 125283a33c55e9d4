"""`EpochArrays` and `ArrayStream`: the NumPy reader holds what the database says, as EpochDataset does.

Two stores: *rows* (``r``: a variable-length int array padded with its lengths, a float with NULLs kept as
NaN plus a mask, a text field coded by categories), compared with the database row by row; and *values*
(``s(id, v = id)``, three epochs of 470 samples in stored batches of 16, two per shard file), where a
sample's value is its key, compared with EpochDataset byte for byte.
"""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from pgprefetch import ArrayStream, EpochArrays, EpochDataset, EpochStream
from pgprefetch.errors import ConfigError, EpochNotFoundError, FormatVersionError
from pgprefetch.read.mapping import PrivateMapping
from pgprefetch.read.padding import lengths_to_mask
from pgprefetch.store.open import open_store

from .harness.configs import write_config
from .harness.db import fetch, own_database
from .harness.dumps import dump
from .harness.epochs import (
    assert_a_partial_epoch_is_not_read,
    claim_format_version,
    counting_config,
    counting_table,
    dump_counting,
    swap_shard_chunks,
)

N, SIZE = 470, 16
ROWS = 300


# --- the stores ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def database(pg_dsn: str) -> Iterator[str]:
    with own_database(
        pg_dsn,
        *counting_table(N),
        "CREATE TABLE r (id int PRIMARY KEY, tokens int[] NOT NULL, score real, kind text NOT NULL)",
        "INSERT INTO r SELECT i, (SELECT array_agg(i * 10 + j) FROM generate_series(1, 1 + i % 7) j),"
        " CASE WHEN i % 5 = 0 THEN NULL ELSE i / 4.0 END, (ARRAY['ant', 'bee', 'cat'])[1 + i % 3]"
        f" FROM generate_series(1, {ROWS}) i",
    ) as dsn:
        yield dsn


def values_config(folder: Path) -> Path:
    return counting_config(folder, size=SIZE, drop_last=False)


@pytest.fixture(scope="module")
def store(database: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dump_counting(
        database, tmp_path_factory.mktemp("values"), size=SIZE, drop_last=False, epochs=(0, 1, 2), shard_batches=2
    )


@pytest.fixture(scope="module")
def rows(database: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rows")
    fields = {
        "tokens": (["tokens"], "int32", {"max_length": 8, "pad": -1}),
        "score": (["score"], "float32", {"null": "nan"}),
        "kind": (["kind"], "int8", {"categories": "auto"}),
    }
    config = write_config(
        folder, keys="SELECT id FROM r", query="SELECT tokens, score, kind FROM r WHERE id = $1", fields=fields, size=32
    )
    dump(config, database, epoch=0)
    return folder / "store.zarr"


def order(store: Path, epoch: int) -> list[int]:
    return [v for b in EpochArrays(store, epoch, consumer=None) for v in b["v"].tolist()]


def expected(store: Path, epochs: range, size: int, rank: int = 0, world: int = 1) -> list[list[int]]:
    out: list[list[int]] = []
    for epoch in epochs:
        samples = order(store, epoch)
        n = -(-len(samples) // size) // world
        out += [samples[(i * world + rank) * size : (i * world + rank + 1) * size] for i in range(n)]
    return out


def values(batches: Iterator[dict[str, np.ndarray]] | list[dict[str, np.ndarray]]) -> list[list[int]]:
    return [b["v"].tolist() for b in batches]


# --- what the database says ---------------------------------------------------------------------------------
def test_batches_hold_what_the_database_says_lengths_null_masks_and_codes_included(database: str, rows: Path) -> None:
    ep = EpochArrays(rows, 0, consumer=None)
    assert set(ep.arrays) == {"tokens", "score", "kind", "tokens_length", "score_null"}
    kinds = ep.categories["kind"]
    assert kinds == ["ant", "bee", "cat"]
    seen = []
    for i, batch in enumerate(ep):
        ids = [key[0] for key in ep.sample_keys(i)]
        seen += ids
        db = {r["id"]: r for r in fetch(database, "SELECT * FROM r WHERE id = ANY($1)", ids)}
        for j, key in enumerate(ids):
            row = db[key]
            n = len(row["tokens"])
            assert batch["tokens_length"][j] == n
            assert batch["tokens"][j, :n].tolist() == row["tokens"]
            assert (batch["tokens"][j, n:] == -1).all()
            assert bool(batch["score_null"][j]) is (row["score"] is None)
            if row["score"] is None:
                assert math.isnan(batch["score"][j])
            else:
                assert batch["score"][j] == pytest.approx(row["score"])
            assert kinds[batch["kind"][j]] == row["kind"]
    assert len(set(seen)) == len(seen) == ROWS // 32 * 32  # each sample once; drop_last left the rest
    assert set(seen) <= set(range(1, ROWS + 1))


def test_trim_cuts_each_batch_to_its_longest_sample_as_the_published_longest_says(rows: Path) -> None:
    full, cut = EpochArrays(rows, 0, consumer=None), EpochArrays(rows, 0, consumer=None, trim=True)
    longest = full.longest["tokens_length"]
    for i in range(len(full)):
        a, b = full[i], cut[i]
        assert b["tokens"].shape == (32, longest[i]) == (32, int(a["tokens_length"].max()))
        np.testing.assert_array_equal(b["tokens"], a["tokens"][:, : longest[i]])
        assert np.shares_memory(b["tokens"], a["tokens"]) or not full.remote  # a view of the same mapping
        assert lengths_to_mask(b["tokens_length"]).shape == b["tokens"].shape


def test_stats_and_categories_are_the_torch_readers(rows: Path) -> None:
    ep, ds = EpochArrays(rows, 0, consumer=None), EpochDataset(rows, 0, consumer=None)
    assert ep.stats == ds.stats
    assert ep.stats["score"]["score"]["count"] > 0
    assert ep.categories == ds.categories
    assert ep.key_columns == ds.key_columns


def mapping_of(array: np.ndarray) -> object:
    """What the array's memory belongs to, past every view."""
    base: object = array
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base


# --- the same bytes as EpochDataset, zero copy, read-only ----------------------------------------------------
@pytest.mark.parametrize(("size", "world"), [(None, 1), (4, 2), (20, 3), (48, 1)])
def test_every_batch_is_epoch_datasets_batch_at_any_size_and_rank(store: Path, size: int | None, world: int) -> None:
    for rank in range(world):
        kwargs = {"batch_size": size, "rank": rank, "world_size": world, "consumer": None}
        ep, ds = EpochArrays(store, 1, **kwargs), EpochDataset(store, 1, **kwargs)
        assert len(ep) == len(ds)
        assert ep.n_global == ds.n_global
        for i in range(len(ep)):
            a, t = ep.batch(i, keys=True), ds.batch(i, keys=True)
            assert set(a) == set(t) == {"v", "keys"}
            for name in a:
                assert type(a[name]) is np.ndarray
                assert a[name].dtype == np.int64
                assert a[name].tobytes() == t[name].numpy().tobytes()
            assert ep.sample_keys(i) == ds.sample_keys(i)
        assert values(ep) == expected(store, range(1, 2), size or SIZE, rank, world)


def test_batches_are_read_only_views_of_one_mapping_of_the_shard_file(store: Path) -> None:
    ep = EpochArrays(store, 0, consumer=None)
    first, second = ep[0]["v"], ep[1]["v"]
    assert second.ctypes.data - first.ctypes.data == SIZE * 8  # back to back in one mapping: no copy
    shard = store / "epoch-00000" / "v" / "c" / "0" / "0"
    assert mapping_of(first) is mapping_of(second)
    assert isinstance(mapping_of(first), PrivateMapping)
    assert mapping_of(first).size == shard.stat().st_size  # the whole shard file, mapped once
    for batch in (ep[0], ep.batch(0, keys=True), EpochArrays(store, 0, batch_size=48, consumer=None)[0]):
        for array in batch.values():  # views and the copy over two files alike
            assert not array.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                array[0] = 0
    assert ep[0]["v"].tolist() == order(store, 0)[:SIZE]  # nothing changed


def test_read_into_fills_the_callers_writable_buffers(store: Path) -> None:
    ep = EpochArrays(store, 0, batch_size=20, consumer=None)
    buffers = ep.new_buffers()
    assert buffers["v"].ctypes.data % 4096 == 0
    assert buffers["v"].flags.writeable
    got = [ep.read_into(i, buffers)["v"].tolist() for i in range(len(ep))]
    assert got == expected(store, range(1), 20)


def test_a_shard_whose_chunks_are_out_of_order_reads_the_same(store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "store.zarr"
    swap_shard_chunks(store, copy, SIZE * 8)
    for size in (SIZE, 4, 20):
        ep = EpochArrays(copy, 2, batch_size=size, consumer=None)
        assert values(ep) == expected(store, range(2, 3), size)
        assert all(not a.flags.writeable for i in range(len(ep)) for a in ep[i].values())


# --- one state for both readers -----------------------------------------------------------------------------
def test_a_state_saved_by_either_reader_resumes_the_other_exactly(store: Path) -> None:
    ep = EpochArrays(store, 1, consumer=None)
    it = iter(ep)
    seen = [next(it)["v"].tolist() for _ in range(7)]
    state = ep.state_dict()
    assert state == {"epoch": 1, "next_global_batch": 7, "next_sample": 7 * SIZE, "batch_size": SIZE}
    ds = EpochDataset(store, 1, consumer=None)
    ds.load_state_dict(state)
    rest = [b["v"].tolist() for b in ds]
    assert seen + rest == expected(store, range(1, 2), SIZE)
    back = EpochArrays(store, 1, batch_size=6, rank=1, world_size=2, consumer=None)
    ds = EpochDataset(store, 1, batch_size=6, rank=1, world_size=2, consumer=None)
    next(iter(ds))
    back.load_state_dict(ds.state_dict())
    assert back.state_dict() == ds.state_dict()
    assert values(back) == [b["v"].tolist() for b in ds]


def test_stream_states_are_interchangeable_across_epochs(store: Path) -> None:
    numpy_stream = ArrayStream(store, 0, 3, batch_size=20, consumer=None)
    it = iter(numpy_stream)
    seen = [next(it)["v"].tolist() for _ in range(30)]  # into epoch 1
    state = numpy_stream.state_dict()
    assert state["epoch"] == 1
    torch_stream = EpochStream(store, 0, 3, batch_size=20, consumer=None)
    torch_stream.load_state_dict(state)
    rest = [b["v"].tolist() for b in torch_stream]
    assert seen + rest == expected(store, range(3), 20)
    again = ArrayStream(store, 0, 3, batch_size=20, consumer=None)
    torch_stream = EpochStream(store, 0, 3, batch_size=20, consumer=None)
    t = iter(torch_stream)
    for _ in range(5):
        next(t)
    again.load_state_dict(torch_stream.state_dict())
    assert values(again) == expected(store, range(3), 20)[5:]


# --- ArrayStream: EpochStream's semantics in NumPy ----------------------------------------------------------
@pytest.mark.parametrize(("size", "world"), [(None, 1), (16, 2), (8, 3)])
def test_the_stream_yields_each_epoch_in_turn_as_epoch_stream_does(store: Path, size: int | None, world: int) -> None:
    for rank in range(world):
        kwargs = {"batch_size": size, "rank": rank, "world_size": world, "consumer": None}
        got = values(ArrayStream(store, 0, 3, **kwargs))
        assert got == expected(store, range(3), size or SIZE, rank, world)
        assert got == [b["v"].tolist() for b in EpochStream(store, 0, 3, **kwargs)]


def test_the_stream_waits_for_the_next_epoch_and_records_the_consumer(database: str, tmp_path: Path) -> None:
    config = values_config(tmp_path)
    dump(config, database, epoch=0)
    consumer = f"run-{uuid.uuid4().hex[:6]}"
    stream = ArrayStream(tmp_path / "store.zarr", 0, 2, consumer=consumer, timeout=60)
    it = iter(stream)
    got = [next(it)["v"].tolist() for _ in range(len(EpochArrays(tmp_path / "store.zarr", 0, consumer=None)))]
    assert open_store(tmp_path / "store.zarr").consumers()[consumer] == 0
    writer = threading.Thread(target=dump, args=(config, database, 1))
    writer.start()  # the stream is at the end of epoch 0, epoch 1 not published yet
    got += values(list(it))
    writer.join()
    assert got == expected(tmp_path / "store.zarr", range(2), SIZE)
    assert open_store(tmp_path / "store.zarr").consumers()[consumer] == 1


def test_set_epoch_ranks_and_a_finished_stream_behave_as_epoch_streams(store: Path) -> None:
    stream = ArrayStream(store, 0, 3, consumer=None)
    stream.set_epoch(2)
    assert values(stream) == expected(store, range(2, 3), SIZE)
    assert values(stream) == expected(store, range(3), SIZE)  # finished: starts over
    with pytest.raises(ConfigError, match=r"set_epoch needs an epoch of the stream \(0..2\), got 3"):
        stream.set_epoch(3)
    late = ArrayStream(store, 1, 1, consumer=None)
    late.use_ranks(1, 2)
    assert late.ranks() == (1, 2)
    assert late.ranks_given
    assert values(late) == expected(store, range(1, 2), SIZE, 1, 2)


def test_the_stream_with_a_ring_of_buffers_reads_the_same_batches(store: Path) -> None:
    ring = ArrayStream(store, 0, 2, batch_size=20, buffers=3, keys=True, consumer=None)
    got = []
    for batch in ring:
        assert batch["keys"][:, 0].tolist() == batch["v"].tolist()
        got.append(batch["v"].tolist())
    assert got == expected(store, range(2), 20)


# --- errors, as EpochDataset raises them ---------------------------------------------------------------------
@pytest.mark.parametrize("reader", [EpochArrays, EpochDataset])
def test_errors_are_epoch_datasets(store: Path, tmp_path: Path, reader: type) -> None:
    with pytest.raises(EpochNotFoundError) as missing:
        reader(store, epoch=9)
    assert str(missing.value) == f"epoch 9 is not in {store} (epochs present: 0, 1, 2)"
    copy = tmp_path / "s.zarr"
    assert_a_partial_epoch_is_not_read(reader, store, copy, 0.2)
    claim_format_version(copy / "epoch-00000", 99)
    with pytest.raises(FormatVersionError) as newer:
        reader(copy, epoch=0)
    assert str(newer.value) == f"{copy / 'epoch-00000'} has format version 99; this pgprefetch reads version 1"
    with pytest.raises(ConfigError) as unknown:
        reader(store, epoch=0, fields=["v", "w"])
    assert str(unknown.value) == "unknown field 'w': epoch 0 has fields v"
    with pytest.raises(ConfigError, match=r"rank 2 is outside 0..1 \(world_size 2\)"):
        reader(store, epoch=0, rank=2, world_size=2)


# --- no framework needed ----------------------------------------------------------------------------------
def test_the_numpy_reader_runs_without_torch_jax_or_grain(store: Path) -> None:
    code = (
        "import sys\n"
        "for name in ('torch', 'jax', 'grain'):\n    sys.modules[name] = None  # as if not installed\n"
        "from pgprefetch import ArrayStream, EpochArrays\n"
        "ep = EpochArrays(sys.argv[1], 0, consumer=None)\n"
        "n = sum(len(b['v']) for b in ep) + sum(len(b['v']) for b in ArrayStream(sys.argv[1], 0, 1, consumer=None))\n"
        "print(n, sorted(m for m in ('torch', 'jax', 'grain') if sys.modules.get(m) is not None))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{2 * N} []\n"
    assert torch.equal(
        torch.from_numpy(np.array(EpochArrays(store, 0, consumer=None)[0]["v"])), EpochDataset(store, 0)[0]["v"]
    )


def open_files(store: Path) -> set[str]:
    fds = Path("/proc/self/fd")
    return {t for p in fds.iterdir() if p.is_symlink() and str(store) in (t := str(p.readlink()))}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_batches_kept_after_the_reader_is_gone_hold_no_file_descriptor(store: Path) -> None:
    kept = []
    for reader in (EpochArrays, EpochDataset):
        ep = reader(store, 0, consumer=None)
        kept += [ep[i]["v"] for i in range(len(ep))]  # batches of all 15 shard files
        assert open_files(store)  # the reader keeps its files open while it reads
        del ep
    assert not open_files(store)  # Python's mmap would keep a descriptor per mapping alive with the batches
    assert [b.tolist() for b in kept[: len(kept) // 2]] == expected(store, range(1), SIZE)
