"""Read-time batch sizes and `EpochStream`: every batch is the stored samples' slice, and resumes are exact.

The store holds three epochs of ``s(id, v = id)``: 470 samples in stored batches of 16 (29 full and one of
6), 2 stored batches per shard file. A sample's value is its key, so a batch names the samples it holds.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from pgprefetch import EpochDataset, EpochStream
from pgprefetch.errors import ConfigError, EpochNotReadyError
from pgprefetch.store.open import open_store

from .harness.db import own_database
from .harness.dumps import dump
from .harness.epochs import counting_config, counting_table, dump_counting, swap_shard_chunks

N, SIZE = 470, 16
pytestmark = [
    pytest.mark.filterwarnings("ignore:pgprefetch. batches are already shuffled"),
    pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),  # torchdata 0.11 on torch 2.13
]


def config_for(folder: Path) -> Path:
    return counting_config(folder, size=SIZE, drop_last=False)


@pytest.fixture(scope="module")
def source(pg_dsn: str) -> Iterator[str]:
    with own_database(pg_dsn, *counting_table(N)) as dsn:
        yield dsn


@pytest.fixture(scope="module")
def store(source: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dump_counting(
        source, tmp_path_factory.mktemp("stream"), size=SIZE, drop_last=False, epochs=(0, 1, 2), shard_batches=2
    )


def order(store: Path, epoch: int) -> np.ndarray:
    """The epoch's samples in stored order, read batch by batch at the dump's size."""
    return np.concatenate([b["v"].numpy() for b in EpochDataset(store, epoch, consumer=None)])


def values(batches: list[dict[str, torch.Tensor]]) -> list[list[int]]:
    return [b["v"].tolist() for b in batches]


def expected(store: Path, epochs: range, size: int, rank: int = 0, world: int = 1) -> list[list[int]]:
    """This rank's batches of each epoch at ``size``, as slices of the stored order."""
    out = []
    for epoch in epochs:
        samples = order(store, epoch)
        n = -(-len(samples) // size) // world
        out += [samples[(i * world + rank) * size : (i * world + rank + 1) * size].tolist() for i in range(n)]
    return out


# --- read-time batch size ---------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [4, 16, 32, 20, 470])
@pytest.mark.parametrize("world", [1, 2])
def test_batches_at_any_size_are_slices_of_the_stored_order(store: Path, size: int, world: int) -> None:
    for rank in range(world):
        ds = EpochDataset(store, 0, batch_size=size, rank=rank, world_size=world, consumer=None)
        assert values(list(ds)) == expected(store, range(1), size, rank, world)
        assert [ds.batch_keys(i)[:, 0].tolist() for i in range(len(ds))] == values(list(ds))  # v is the key


def test_micro_batches_are_views_of_the_mapped_file(store: Path) -> None:
    ds = EpochDataset(store, 0, batch_size=4, consumer=None)
    shard = store / "epoch-00000" / "v" / "c" / "0" / "0"
    first, second = ds[0]["v"], ds[1]["v"]
    assert first.untyped_storage().nbytes() == shard.stat().st_size  # a view of the whole mapped file
    assert second.data_ptr() - first.data_ptr() == 4 * 8


def test_a_multiple_in_one_file_is_a_view_and_across_files_one_copy(store: Path) -> None:
    ds = EpochDataset(store, 0, batch_size=32, consumer=None)  # two stored batches: one shard file
    assert ds[0]["v"].untyped_storage().nbytes() == (store / "epoch-00000" / "v" / "c" / "0" / "0").stat().st_size
    ds = EpochDataset(store, 0, batch_size=48, consumer=None)  # three: always crosses a file
    assert ds[0]["v"].untyped_storage().nbytes() == 48 * 8
    assert ds[0]["v"].tolist() == order(store, 0)[:48].tolist()


@pytest.mark.parametrize("size", [4, 20, 48])
def test_read_into_fills_buffers_at_any_size(store: Path, size: int) -> None:
    ds = EpochDataset(store, 0, batch_size=size, consumer=None)
    buffers = ds.new_buffers()
    assert buffers["v"].shape == (size,)
    got = [ds.read_into(i, buffers)["v"].tolist() for i in range(len(ds))]
    assert got == expected(store, range(1), size)


def test_resume_with_another_batch_and_world_size_reads_each_sample_once(store: Path) -> None:
    ranks = [EpochDataset(store, 1, batch_size=16, rank=r, world_size=2, consumer=None) for r in range(2)]
    seen = [s for ds in ranks for b in (ds[i] for i in range(5)) for s in b["v"].tolist()]
    state = ranks[0].state_dict(batches=5)
    assert (
        state
        == ranks[1].state_dict(batches=5)
        == {"epoch": 1, "next_global_batch": 10, "next_sample": 160, "batch_size": 16}
    )
    rest = []
    for r in range(3):
        ds = EpochDataset(store, 1, batch_size=6, rank=r, world_size=3, consumer=None)
        ds.load_state_dict(state)
        rest += [s for b in ds for s in b["v"].tolist()]
    assert len(rest) == (N - 160) // 18 * 18  # every rank the same count, the remainder dropped
    assert sorted(seen + rest) == sorted(order(store, 1)[: 160 + len(rest)].tolist())


def test_bad_batch_size_is_a_config_error(store: Path) -> None:
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        EpochDataset(store, 0, batch_size=0)
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        EpochStream(store, batch_size=-3)


# --- EpochStream --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("size", "world"), [(None, 1), (16, 2), (8, 3)])
def test_stream_yields_each_epoch_in_turn(store: Path, size: int | None, world: int) -> None:
    for rank in range(world):
        stream = EpochStream(store, 0, 3, batch_size=size, rank=rank, world_size=world, consumer=None)
        assert values(list(stream)) == expected(store, range(3), size or SIZE, rank, world)


@pytest.mark.parametrize("workers", [2, 3])
def test_dataloader_workers_split_the_stream_in_order(store: Path, workers: int) -> None:
    # 15 batches per epoch for each rank: odd, so each epoch's first batch goes to another worker.
    stream = EpochStream(store, 0, 3, rank=1, world_size=2, consumer=None)
    loader = DataLoader(stream, batch_size=None, num_workers=workers)
    assert values(list(loader)) == expected(store, range(3), SIZE, 1, 2)


def test_stream_state_after_k_batches_resumes_at_the_next(store: Path) -> None:
    full = expected(store, range(3), 8, 0, 2)
    stream = EpochStream(store, 0, 3, batch_size=8, rank=0, world_size=2, consumer=None)
    it = iter(stream)
    head = [next(it)["v"].tolist() for _ in range(40)]  # into epoch 1 (29 batches per epoch for this rank)
    state = stream.state_dict()
    assert (state["epoch"], state["next_sample"]) == (1, 11 * 16)
    resumed = EpochStream(store, 0, 3, batch_size=8, rank=0, world_size=2, consumer=None)
    resumed.load_state_dict(state)
    assert head + values(list(resumed)) == full


def test_plain_dataloader_counts_consumed_batches_across_epochs(store: Path) -> None:
    full = expected(store, range(3), SIZE)
    stream = EpochStream(store, 0, 3, consumer=None)
    loader = DataLoader(stream, batch_size=None, num_workers=2)
    head = []
    for batch in loader:
        head.append(batch["v"].tolist())
        if len(head) == 37:
            break
    state = stream.state_dict(batches=37)
    assert (state["epoch"], state["next_sample"]) == (1, 7 * SIZE)
    resumed = EpochStream(store, 0, 3, consumer=None)
    resumed.load_state_dict(state)
    assert head + values(list(DataLoader(resumed, batch_size=None, num_workers=3))) == full


def test_set_epoch_jumps_but_keeps_a_resumed_position_in_that_epoch(store: Path) -> None:
    stream = EpochStream(store, consumer=None, epochs=3)
    stream.set_epoch(2)
    assert values(list(stream)) == expected(store, range(2, 3), SIZE)
    stream = EpochStream(store, consumer=None, epochs=3)
    stream.load_state_dict({"epoch": 1, "next_sample": 64, "batch_size": SIZE})
    stream.set_epoch(1)  # what a framework calls before the epoch it resumes in
    assert values(list(stream)) == expected(store, range(1, 3), SIZE)[4:]


def test_a_finished_stream_starts_over(store: Path) -> None:
    stream = EpochStream(store, 1, 1, consumer=None)
    assert values(list(stream)) == values(list(stream)) == expected(store, range(1, 2), SIZE)


def test_stream_records_the_consumer_as_it_opens_each_epoch(store: Path, tmp_path: Path) -> None:
    stream = EpochStream(store, 0, 3, consumer=f"run-{uuid.uuid4().hex[:6]}")
    it = iter(stream)
    next(it)
    assert open_store(store).consumers()[stream.consumer] == 0
    list(it)
    assert open_store(store).consumers()[stream.consumer] == 2


def test_stream_waits_for_the_next_epoch_while_it_is_dumped(source: str, tmp_path: Path) -> None:
    config = config_for(tmp_path)
    dump(config, source, epoch=0)
    stream = EpochStream(tmp_path / "store.zarr", 0, 2, consumer=None, timeout=60)
    it = iter(stream)
    got = [next(it)["v"].tolist() for _ in range(len(EpochDataset(tmp_path / "store.zarr", 0, consumer=None)))]
    writer = threading.Thread(target=dump, args=(config, source, 1))
    writer.start()  # the stream is at the end of epoch 0, epoch 1 not published yet
    got += values(list(it))
    writer.join()
    assert got == expected(tmp_path / "store.zarr", range(2), SIZE)


def test_stream_gives_up_on_a_missing_epoch_after_its_timeout(store: Path) -> None:
    stream = EpochStream(store, 3, consumer=None, timeout=0.2)
    with pytest.raises(EpochNotReadyError, match=r"epoch 3 is not in .*gave up waiting after 0\.2 s"):
        next(iter(stream))


# --- torchdata's StatefulDataLoader -------------------------------------------------------------------------
def consume(loader: StatefulDataLoader, steps: int) -> tuple[list[list[int]], dict]:
    """``steps`` batches of a fresh pass, and the loader's state after them."""
    got = []
    for batch in loader:
        got.append(batch["v"].tolist())
        if len(got) == steps:
            break
    return got, loader.state_dict()


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_restores_the_same_batches(store: Path, workers: int) -> None:
    full = expected(store, range(3), SIZE)
    stream = EpochStream(store, 0, 3, consumer=None)
    head, state = consume(StatefulDataLoader(stream, batch_size=None, num_workers=workers), 33)
    loader = StatefulDataLoader(EpochStream(store, 0, 3, consumer=None), batch_size=None, num_workers=workers)
    loader.load_state_dict(state)
    assert head + values(list(loader)) == full


def test_stateful_dataloader_with_other_workers_refuses_worker_states_and_resumes_via_the_stream(store: Path) -> None:
    full = expected(store, range(3), SIZE)
    head, state = consume(
        StatefulDataLoader(EpochStream(store, 0, 3, consumer=None), batch_size=None, num_workers=2), 45
    )
    loader = StatefulDataLoader(EpochStream(store, 0, 3, consumer=None), batch_size=None, num_workers=3)
    loader.load_state_dict(state)
    with pytest.raises(ConfigError, match="saved with num_workers=2"):
        next(iter(loader))
    stream = EpochStream(store, 0, 3, consumer=None)
    stream.load_state_dict(state)  # the loader's whole state
    assert head + values(list(StatefulDataLoader(stream, batch_size=None, num_workers=3))) == full


def test_stateful_dataloader_state_resumes_on_another_world_size(store: Path) -> None:
    heads, states = [], []
    for rank in range(2):
        stream = EpochStream(store, 1, 1, rank=rank, world_size=2, consumer=None)
        head, state = consume(StatefulDataLoader(stream, batch_size=None, num_workers=2), 5)
        heads += head
        states.append(state)
    rest = []
    for rank in range(3):
        stream = EpochStream(store, 1, 1, rank=rank, world_size=3, consumer=None)
        stream.load_state_dict(states[rank % 2])  # every rank saved the same position
        rest += values(list(StatefulDataLoader(stream, batch_size=None, num_workers=2)))
    seen = [s for b in heads + rest for s in b]
    # 160 samples read by two ranks; of the 310 left, 19 full batches, of which three ranks share 18
    assert len(rest) == 18
    assert sorted(seen) == sorted(order(store, 1)[: 160 + 18 * SIZE].tolist())


def test_a_shard_whose_chunks_are_out_of_order_reads_the_same(store: Path, tmp_path: Path) -> None:
    """zarr itself may write a shard's chunks in any order; its index says where each one is."""
    copy = tmp_path / "store.zarr"
    chunk = SIZE * 8
    assert swap_shard_chunks(store, copy, chunk) == [0, chunk]  # back to back, as pgprefetch writes them
    for size in (SIZE, 4, 20):
        ds = EpochDataset(copy, 2, batch_size=size, consumer=None)
        assert values(list(ds)) == expected(store, range(2, 3), size)
        buffers = ds.new_buffers()
        assert [ds.read_into(i, buffers)["v"].tolist() for i in range(len(ds))] == expected(store, range(2, 3), size)


def test_stream_with_reused_buffers_reads_the_same_batches_into_a_ring(store: Path) -> None:
    stream = EpochStream(store, 0, 2, batch_size=20, buffers=3, keys=True, consumer=None)
    batches = []
    for batch in stream:
        batches.append(batch["v"])
        assert batch["keys"][:, 0].tolist() == batch["v"].tolist()
        if len(batches) == 4:
            assert batches[3].data_ptr() == batches[0].data_ptr()  # the ring came round
            assert values([{"v": batches[-1]}]) == expected(store, range(1), 20)[3:4]
    assert len(batches) == len(expected(store, range(2), 20))
    reused = EpochStream(store, 0, 2, batch_size=20, buffers=2, consumer=None)
    assert [b["v"].tolist() for b in reused] == expected(store, range(2), 20)  # each used before the ring turns


# --- edges: ends of epochs and streams, snapshots, old states, persistent workers ---------------------------
@pytest.mark.parametrize("steps", [15, 30])  # the end of epoch 0, the end of the stream (rank 1 of 2)
def test_stateful_dataloader_saved_at_an_end_resumes_exactly_there(store: Path, steps: int) -> None:
    full = expected(store, range(2), SIZE, 1, 2)

    def stream() -> EpochStream:
        return EpochStream(store, 0, 2, rank=1, world_size=2, consumer=None)

    head, state = consume(StatefulDataLoader(stream(), batch_size=None, num_workers=2), steps)
    loader = StatefulDataLoader(stream(), batch_size=None, num_workers=2)
    loader.load_state_dict(state)
    assert head + values(list(loader)) == full
    moved = stream()
    moved.load_state_dict(state)
    assert head + values(list(StatefulDataLoader(moved, batch_size=None, num_workers=3))) == full


def test_snapshots_every_few_steps_resume_on_another_world_size(store: Path) -> None:
    """The batches since the loader's last snapshot count as the saving run cut them (world 2, size 16)."""
    stream = EpochStream(store, 1, 1, rank=0, world_size=2, consumer=None)
    loader = StatefulDataLoader(stream, batch_size=None, num_workers=2, snapshot_every_n_steps=3)
    _, state = consume(loader, 5)
    assert state["_steps_since_snapshot"] == 2
    moved = EpochStream(store, 1, 1, rank=0, world_size=1, consumer=None)
    moved.load_state_dict(state)
    assert moved.state_dict()["next_sample"] == 5 * 2 * SIZE


def test_a_worker_state_of_another_batch_size_is_refused(store: Path) -> None:
    _, state = consume(
        StatefulDataLoader(EpochStream(store, 0, 1, batch_size=8, consumer=None), batch_size=None, num_workers=2), 7
    )
    loader = StatefulDataLoader(EpochStream(store, 0, 1, consumer=None), batch_size=None, num_workers=2)
    loader.load_state_dict(state)
    with pytest.raises(ConfigError, match="batch size 8, and this loader has 2, 1, 16"):
        next(iter(loader))


def test_counting_to_an_epoch_end_does_not_need_the_next_epoch(store: Path) -> None:
    stream = EpochStream(store, 2, None, rank=0, world_size=2, consumer=None)  # epoch 3 is not published
    assert stream.state_dict(batches=15) == {"epoch": 3, "next_global_batch": 0, "next_sample": 0, "batch_size": SIZE}


def test_an_older_state_at_the_end_of_an_epoch_with_a_short_batch_loads(store: Path) -> None:
    ds = EpochDataset(store, 0, consumer=None)
    ds.load_state_dict({"epoch": 0, "next_global_batch": 30})  # 30 batches of 16 > 470 samples
    assert len(ds) == 0
    stream = EpochStream(store, 0, 2, consumer=None)
    stream.load_state_dict({"epoch": 0, "next_global_batch": 30})
    assert values(list(stream)) == expected(store, range(1, 2), SIZE)


def test_read_into_does_not_keep_the_callers_buffers_alive(store: Path) -> None:
    import gc
    import weakref

    ds = EpochDataset(store, 0, consumer=None)
    refs = []
    for i in range(10):
        buffers = ds.new_buffers()
        assert ds.read_into(i, buffers)["v"].tolist() == expected(store, range(1), SIZE)[i]
        refs.append(weakref.ref(buffers["v"]))
        del buffers
    gc.collect()
    assert all(r() is None for r in refs)


def test_persistent_workers_start_each_pass_where_the_stream_stood(store: Path) -> None:
    loader = DataLoader(
        EpochStream(store, 0, 1, consumer=None), batch_size=None, num_workers=2, persistent_workers=True
    )
    for n, _ in enumerate(loader):
        if n == 4:
            break  # the workers have produced more than was consumed
    assert values(list(loader)) == expected(store, range(1), SIZE)


def test_set_epoch_outside_the_stream_is_an_error(store: Path) -> None:
    stream = EpochStream(store, 1, 2, consumer=None)
    for bad in (0, 3, -1):
        with pytest.raises(ConfigError, match=r"set_epoch needs an epoch of the stream \(1\.\.2\)"):
            stream.set_epoch(bad)
