"""`EpochDataset` reads what `pgprefetch dump` published: same values, zero copy, ranks, resume, errors."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from torch.utils.data import DataLoader

import pgprefetch
import pgprefetch.write.files.shardfiles
from pgprefetch import EpochDataset
from pgprefetch.errors import ConfigError, EpochNotFoundError, EpochNotReadyError, FormatVersionError, StoreError

from .harness.configs import SEQUENCES, write_config
from .harness.db import execute
from .harness.dumps import dump
from .harness.epochs import assert_a_partial_epoch_is_not_read, claim_format_version, sequences_store

SIZE = 100


@pytest.fixture(scope="module")
def store(demo_db: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Epochs 0 and 1 of the demo sequences, batch size 100 with a short last batch, 3 batches per shard."""
    return sequences_store(demo_db, tmp_path_factory.mktemp("reader"), size=SIZE, shard_batches=3)


def zarr_batch(store: Path, epoch: int, name: str, g: int) -> np.ndarray:
    return zarr.open_group(store, mode="r")[f"epoch-{epoch:05d}"][name][g]


def test_batches_equal_the_arrays_the_dump_wrote(store: Path) -> None:
    ds = EpochDataset(store, epoch=0)
    n_samples = ds.n_samples
    assert len(ds) == ds.n_global == -(-n_samples // SIZE)
    assert zarr.open_array(store / "epoch-00000" / "x", mode="r").shards[0] == 3  # several shard files
    for i in range(len(ds)):
        batch = ds[i]
        valid = min(SIZE, n_samples - i * SIZE)
        for name in ("x", "y"):
            np.testing.assert_array_equal(batch[name].numpy(), zarr_batch(store, 0, name, i)[:valid])
        np.testing.assert_array_equal(ds.batch_keys(i).numpy(), zarr_batch(store, 0, "keys", i)[:valid])
    assert ds[len(ds) - 1]["x"].shape == (n_samples - (len(ds) - 1) * SIZE, 64, 2)  # the short batch, trimmed
    assert ds[0]["x"].dtype == torch.float32
    assert ds[0]["y"].shape == (SIZE, 64)


def test_uncompressed_batches_share_the_file_mapping(store: Path) -> None:
    ds = EpochDataset(store, epoch=0)
    a, b = ds[0]["x"], ds[1]["x"]
    shard = store / "epoch-00000" / "x" / "c" / "0" / "0" / "0" / "0"
    assert a.untyped_storage().nbytes() == shard.stat().st_size  # a view of the whole mapped file
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert b.data_ptr() - a.data_ptr() == a.numel() * 4


def test_compressed_store_reads_the_same_batches(demo_db: str, tmp_path: Path, store: Path) -> None:
    config = write_config(tmp_path, **{**SEQUENCES, "size": SIZE, "drop_last": False, "compression": "zstd"})
    dump(config, demo_db, epoch=0)
    packed, plain = EpochDataset(tmp_path / "store.zarr", epoch=0), EpochDataset(store, epoch=0)
    for i in (0, 5, len(plain) - 1):
        assert torch.equal(packed[i]["x"], plain[i]["x"])


def test_from_config_opens_the_config_store(demo_db: str, tmp_path: Path) -> None:
    config = write_config(tmp_path, **{**SEQUENCES, "size": SIZE})
    dump(config, demo_db, epoch=2)
    assert len(EpochDataset.from_config(config, epoch=2)) > 0


@pytest.mark.filterwarnings("ignore::UserWarning")  # the advice to use num_workers=0
def test_dataloader_with_two_workers_yields_every_batch_once(store: Path) -> None:
    ds = EpochDataset(store, epoch=0)
    seen = [int(b["x"][0, 0, 0].item() * 1e6) for b in DataLoader(ds, batch_size=None, num_workers=2)]
    expected = [int(ds[i]["x"][0, 0, 0].item() * 1e6) for i in range(len(ds))]
    assert seen == expected


def _drop_first_sample(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t[1:] for name, t in batch.items()}  # a slice: no longer the reader's own tensor


@pytest.mark.filterwarnings("ignore::UserWarning")  # the advice to use num_workers=0: tested below
def test_dataloader_workers_send_file_ranges_that_the_main_process_maps_itself(store: Path) -> None:
    ds = EpochDataset(store, epoch=0)
    shards = store / "epoch-00000" / "x" / "c"
    got = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert len(got) == len(ds)
    for i, batch in enumerate(got):
        assert set(batch) == {"x", "y"}
        for name, t in batch.items():
            assert type(t) is torch.Tensor
            assert torch.equal(t, ds[i][name])  # the short last batch included
        # Not a shared-memory block of the batch's bytes: a view of the main process's mapping of the file.
        assert batch["x"].untyped_storage().nbytes() == (shards / str(i // 3) / "0" / "0" / "0").stat().st_size
    sliced = list(DataLoader(ds, batch_size=None, num_workers=1, collate_fn=_drop_first_sample))
    for i, batch in enumerate(sliced):
        assert torch.equal(batch["y"], ds[i]["y"][1:])  # a derived tensor travels the usual way, by value


def test_dataloader_workers_say_once_that_the_main_process_is_the_fast_path(store: Path) -> None:
    script = (
        "import sys\nfrom torch.utils.data import DataLoader\nfrom pgprefetch import EpochDataset\n"
        "ds = EpochDataset(sys.argv[1], 0, consumer=None)\n"
        "assert len(list(DataLoader(ds, batch_size=None, num_workers=2))) == len(ds)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(store)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("is faster") == 1, done.stderr
    assert "num_workers=0" in done.stderr


# _rebuild is what a DataLoader worker runs: it says once that workers are the slow path (tested above).
@pytest.mark.filterwarnings("ignore:pgprefetch. batches are already shuffled:UserWarning")
def test_a_batch_whose_file_was_replaced_is_an_error_not_other_bytes(store: Path, tmp_path: Path) -> None:
    from pgprefetch.torch.workers import FileRef, _rebuild

    path = tmp_path / "shard"
    path.write_bytes(bytes(64))
    ref = FileRef.of(str(path), path.stat())
    assert _rebuild(ref.path, ref.ident, ref.serial, 16, (4,), torch.int32).tolist() == [0, 0, 0, 0]
    replacement = tmp_path / "new"
    replacement.write_bytes(bytes(range(64)))
    replacement.replace(path)  # a new inode at the same path, as a rewritten epoch would be
    with pytest.raises(StoreError, match="was replaced while a DataLoader worker read it"):
        _rebuild(ref.path, ref.ident, (0, 0), 16, (4,), torch.int32)


def test_ranks_are_disjoint_equal_and_cover_all_but_the_remainder(store: Path) -> None:
    world = 3
    ranks = [EpochDataset(store, epoch=0, rank=r, world_size=world) for r in range(world)]
    n_global = ranks[0].n_global
    assert {len(r) for r in ranks} == {n_global // world}
    globals_ = [r.global_batch(i) for r in ranks for i in range(len(r))]
    assert sorted(globals_) == list(range(n_global // world * world))
    for r in ranks:
        assert all(r.global_batch(i) % world == r.rank for i in range(len(r)))


@pytest.mark.parametrize("world", [2, 3])
def test_each_rank_batch_is_that_global_batch_of_the_whole_epoch(store: Path, world: int) -> None:
    whole = EpochDataset(store, epoch=0)
    for rank in range(world):
        ds = EpochDataset(store, epoch=0, rank=rank, world_size=world)
        for i in range(len(ds)):
            g = ds.global_batch(i)
            assert g == i * world + rank
            batch, expected = ds[i], whole[g]
            assert set(batch) == set(expected) == {"x", "y"}
            for name in batch:
                assert torch.equal(batch[name], expected[name])
            assert torch.equal(ds.batch_keys(i), whole.batch_keys(g))


def test_resume_yields_exactly_the_batches_not_seen(store: Path) -> None:
    full = [b["y"].clone() for b in EpochDataset(store, epoch=0)]
    ds = EpochDataset(store, epoch=0)
    it = iter(ds)
    seen = [next(it)["y"].clone() for _ in range(7)]
    state = ds.state_dict()
    assert state == {"epoch": 0, "next_global_batch": 7, "next_sample": 700, "batch_size": SIZE}
    resumed = EpochDataset(store, epoch=0)
    resumed.load_state_dict(state)
    rest = [b["y"] for b in resumed]
    assert len(seen) + len(rest) == len(full)
    for a, b in zip(seen + rest, full, strict=True):
        assert torch.equal(a, b)
    assert resumed.state_dict()["next_global_batch"] == len(full)


def test_resume_from_two_ranks_to_one_sees_the_remaining_global_batches(store: Path) -> None:
    two = [EpochDataset(store, epoch=0, rank=r, world_size=2) for r in range(2)]
    iters = [iter(d) for d in two]
    for _ in range(3):  # three steps on each rank: global batches 0..5
        for it in iters:
            next(it)
    state = two[0].state_dict()
    assert state == two[1].state_dict() == {"epoch": 0, "next_global_batch": 6, "next_sample": 600, "batch_size": SIZE}
    one = EpochDataset(store, epoch=0, rank=0, world_size=1)
    one.load_state_dict(state)
    assert [one.global_batch(i) for i in range(len(one))] == list(range(6, one.n_global))


def test_to_device_cpu_yields_the_mapped_batches(store: Path) -> None:
    ds = EpochDataset(store, epoch=0)
    batches = list(ds.to_device("cpu"))
    assert len(batches) == len(ds)
    assert torch.equal(batches[3]["x"], ds[3]["x"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_to_device_cuda_yields_the_same_batches_on_the_gpu(store: Path) -> None:
    ds = EpochDataset(store, epoch=0)
    for i, batch in enumerate(ds.to_device("cuda", prefetch=2)):
        assert batch["x"].is_cuda
        assert torch.equal(batch["x"].cpu(), ds[i]["x"])


@pytest.mark.parametrize("reader", ["EpochDataset", "EpochArrays"])
def test_negative_indices_count_from_the_end_as_in_a_python_sequence(store: Path, reader: str) -> None:
    ds = getattr(pgprefetch, reader)(store, 0, consumer=None, world_size=2, rank=1)
    n = len(ds)
    for i in (-1, -2, -n):
        got, want = ds[i], ds[n + i]
        assert got.keys() == want.keys()
        assert all(np.array_equal(np.asarray(got[k]), np.asarray(want[k])) for k in got)
        assert np.array_equal(np.asarray(ds.batch_keys(i)), np.asarray(ds.batch_keys(n + i)))
    for i in (n, -n - 1):
        with pytest.raises(IndexError, match=f"batch {i} out of range for a rank with {n} batches"):
            ds[i]


def test_missing_epoch_lists_the_epochs_present(store: Path) -> None:
    with pytest.raises(EpochNotFoundError) as e:
        EpochDataset(store, epoch=9)
    assert str(e.value) == f"epoch 9 is not in {store} (epochs present: 0, 1)"


def test_epoch_being_written_is_not_read(store: Path, tmp_path: Path) -> None:
    assert_a_partial_epoch_is_not_read(EpochDataset, store, tmp_path / "s.zarr", 0.3)


def test_wait_blocks_until_the_epoch_is_published(store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "s.zarr"
    shutil.copytree(store, copy)
    (copy / "epoch-00001").rename(copy / "later")
    published = threading.Event()

    def publish() -> None:
        published.set()  # set first: a reader that returns has seen it, or returned before publication
        (copy / "later").rename(copy / "epoch-00001")

    t = threading.Timer(0.5, publish)
    t.start()
    ds = EpochDataset(copy, epoch=1, wait=True, timeout=30)
    assert published.is_set()  # it waited for the epoch, not returned before it was there
    assert len(ds) > 0


def test_unknown_format_version_is_refused(store: Path, tmp_path: Path) -> None:
    copy = tmp_path / "s.zarr"
    shutil.copytree(store, copy)
    claim_format_version(copy / "epoch-00000", 99)
    with pytest.raises(FormatVersionError) as e:
        EpochDataset(copy, epoch=0)
    assert str(e.value) == f"{copy / 'epoch-00000'} has format version 99; this pgprefetch reads version 1"


def test_unknown_field_is_refused(store: Path) -> None:
    with pytest.raises(ConfigError) as e:
        EpochDataset(store, epoch=0, fields=["x", "z"])
    assert str(e.value) == "unknown field 'z': epoch 0 has fields x, y"
    assert set(EpochDataset(store, epoch=0, fields=["y"])[0]) == {"y"}


def test_read_into_fills_caller_buffers_with_the_same_batch(store: Path) -> None:
    ds = EpochDataset(store, epoch=0)
    out = {"x": torch.empty(SIZE, 64, 2), "y": torch.empty(SIZE, 64, dtype=torch.int64)}
    for i in (0, 4, len(ds) - 1):  # within and across shards, and the short last batch
        got = ds.read_into(i, out)
        assert got["x"].data_ptr() == out["x"].data_ptr()
        assert torch.equal(got["x"], ds[i]["x"])
        assert torch.equal(got["y"], ds[i]["y"])


def expected_batch(store: Path, g: int) -> dict[str, np.ndarray]:
    """Global batch ``g`` of epoch 0 as zarr reads it, trimmed like the reader's."""
    n_batches, n_samples = (EpochDataset(store, epoch=0, consumer=None).manifest[k] for k in ("n_batches", "n_samples"))
    valid = n_samples - g * SIZE if g == n_batches - 1 else SIZE
    return {name: zarr_batch(store, 0, name, g)[:valid] for name in ("x", "y")}


def ring_pass(ds: EpochDataset, depth: int = 2) -> list[tuple[int, dict[str, np.ndarray]]]:
    """Read this rank's batches as ``to_device("cuda")`` does, into ``depth + 1`` reused buffers filled ahead.

    Each batch is looked at when it is consumed, after the batches ahead of it were read into the other
    buffers; returns (global batch, copy of what it held) in consumption order.
    """
    slots = [{"x": torch.empty(SIZE, 64, 2), "y": torch.empty(SIZE, 64, dtype=torch.int64)} for _ in range(depth + 1)]
    filled: list[dict[str, torch.Tensor]] = []
    seen = []
    ahead = 0
    for i in range(len(ds)):
        while ahead < len(ds) and ahead <= i + depth:
            batch = ds.read_into(ahead, slots[ahead % (depth + 1)])
            assert all(batch[k].data_ptr() == slots[ahead % (depth + 1)][k].data_ptr() for k in batch)
            filled.append(batch)
            ahead += 1
        seen.append((ds.global_batch(i), {k: v.numpy().copy() for k, v in filled.pop(0).items()}))
    return seen


def test_read_into_a_ring_of_reused_buffers_yields_the_epoch_in_order(store: Path) -> None:
    ds = EpochDataset(store, epoch=0)
    seen = ring_pass(ds)
    assert [g for g, _ in seen] == list(range(ds.n_global))
    for g, batch in seen:
        for name, expected in expected_batch(store, g).items():
            np.testing.assert_array_equal(batch[name], expected)


@pytest.mark.parametrize(("world", "start"), [(1, 13), (2, 6), (3, 4)])
def test_read_into_a_ring_of_reused_buffers_resumes_at_the_saved_batch(store: Path, world: int, start: int) -> None:
    n_global = EpochDataset(store, epoch=0).n_global
    for rank in range(world):
        ds = EpochDataset(store, epoch=0, rank=rank, world_size=world)
        ds.load_state_dict({"epoch": 0, "next_global_batch": start})
        seen = ring_pass(ds)
        assert [g for g, _ in seen] == list(range(start + rank, start + (n_global - start) // world * world, world))
        for g, batch in seen:
            for name, expected in expected_batch(store, g).items():
                np.testing.assert_array_equal(batch[name], expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_to_device_cuda_resumes_at_the_saved_batch(store: Path) -> None:
    ds = EpochDataset(store, epoch=0)
    it = ds.to_device("cuda", prefetch=2)
    first = [next(it) for _ in range(5)]
    state = ds.state_dict()
    assert state == {"epoch": 0, "next_global_batch": 5, "next_sample": 5 * SIZE, "batch_size": SIZE}
    resumed = EpochDataset(store, epoch=0)
    resumed.load_state_dict(state)
    rest = list(resumed.to_device("cuda", prefetch=2))
    assert len(first) + len(rest) == ds.n_global
    for g, batch in enumerate(first + rest):
        for name, expected in expected_batch(store, g).items():
            np.testing.assert_array_equal(batch[name].cpu().numpy(), expected)


def mapped_regions() -> list[tuple[int, int, str, int]]:
    """This process's mappings from ``/proc/self/smaps``: (start, end, file or "", resident bytes)."""
    regions: list[tuple[int, int, str, int]] = []
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(maxsplit=5)
        if "-" in head[0] and ":" not in head[0]:
            start, end = (int(a, 16) for a in head[0].split("-"))
            regions.append((start, end, head[5] if len(head) > 5 else "", 0))
        elif head[0] == "Rss:":
            start, end, path, _ = regions[-1]
            regions[-1] = (start, end, path, int(head[1]) * 1024)
    return regions


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_a_pass_maps_the_shard_file_and_makes_resident_only_the_batches_it_reads(db: str, tmp_path: Path) -> None:
    execute(
        db,
        "CREATE TABLE big (id int PRIMARY KEY, emb real[] NOT NULL)",
        "INSERT INTO big SELECT i, array_fill(i::real, ARRAY[1024]) FROM generate_series(1, 2048) i",
    )
    fields = {"emb": (["emb"], "float32")}
    config = write_config(
        tmp_path, keys="SELECT id FROM big", query="SELECT emb FROM big WHERE id = $1", fields=fields, size=64
    )
    dump(config, db)  # 32 batches of 256 KiB in one 8 MiB shard file
    shard = tmp_path / "store.zarr" / "epoch-00000" / "emb" / "c" / "0" / "0" / "0"
    assert shard.stat().st_size > 32 * 256 * 1024
    ds = EpochDataset(tmp_path / "store.zarr", epoch=0, rank=1, world_size=4)  # 8 batches, one in four

    def holds_its_keys(emb: torch.Tensor, keys: torch.Tensor) -> bool:  # reads every byte of the batch
        return torch.equal(emb.sum(dim=1), keys[:, 0].to(torch.float32) * 1024)

    # torch's first call of each kernel allocates (thread pools, caches): not the reader's doing.
    assert holds_its_keys(torch.zeros(64, 1024), torch.zeros(64, 1, dtype=torch.int64))
    mapped_regions()
    before = resident_bytes()
    batches = []
    for i, batch in enumerate(ds):
        assert holds_its_keys(batch["emb"], ds.batch_keys(i))
        batches.append(batch["emb"])
    grown = resident_bytes() - before
    read = sum(emb.nbytes for emb in batches)
    assert read == 8 * 256 * 1024
    regions = [(start, end, rss) for start, end, path, rss in mapped_regions() if path == str(shard)]
    assert len(regions) == 1, regions  # one mapping of the shard file...
    start, end, resident = regions[0]
    for emb in batches:  # ...that every batch lies in
        assert start <= emb.data_ptr() < emb.data_ptr() + emb.nbytes <= end
    # Fault-around may map up to 64 KiB around each first touch; the shard index sits in the last page.
    slack = len(ds) * 128 * 1024 + 64 * 1024
    assert resident <= read + slack < shard.stat().st_size / 2
    assert grown <= read + slack + (1 << 20)


def test_waiting_for_a_store_that_is_not_there_warns_at_once_and_every_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import pgprefetch.store.base

    monkeypatch.setattr(pgprefetch.store.base, "WAIT_NOTICE_S", 0.5)  # a minute, in the product
    missing = tmp_path / "not-yet.zarr"
    started = time.time()
    with caplog.at_level("INFO", logger="pgprefetch"), pytest.raises(EpochNotReadyError, match="gave up waiting"):
        EpochDataset(missing, 0, wait=True, timeout=1.6, consumer=None)
    said = [(r.levelname, r.getMessage()) for r in caplog.records if "waiting for epoch 0" in r.getMessage()]
    assert said[0] == (
        "WARNING",
        f"waiting for epoch 0 of {missing}: no store is there yet (a misspelt path, or cron has not dumped yet)",
    )
    assert caplog.records[0].created - started < 0.5  # at once, not after the timeout
    assert len(said) >= 3  # and again every interval, saying how long so far
    assert all(level == "WARNING" and f"of {missing} (for " in text for level, text in said[1:])
