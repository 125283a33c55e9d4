"""`pgprefetch.grain.EpochSource` under Grain's own DataLoader: workers, shards, and its checkpoint.

The store holds ``s(id, v = id)`` (470 samples, stored batches of 16 with a short last one): a sample's value
is its key, so a batch names its samples. Loaders with worker processes run as plain scripts
(``tests/harness/scripts/grain_checks.py``), as users run them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import grain
import numpy as np
import pytest

from pgprefetch import EpochArrays
from pgprefetch.errors import EpochNotFoundError
from pgprefetch.grain import EpochSource

from .harness.epochs import counting_store_fixture
from .harness.scripts import SCRIPTS

ROOT = Path(__file__).resolve().parents[1]
N, SIZE = 470, 16


store = counting_store_fixture("grain", n=N, size=SIZE, drop_last=False, shard_batches=4)


def stored(store: Path, size: int = SIZE) -> list[list[int]]:
    return [b["v"].tolist() for b in EpochArrays(store, 0, batch_size=size, consumer=None)]


def loader(source: EpochSource, workers: int = 0, shard: grain.sharding.ShardOptions | None = None) -> grain.DataLoader:
    """The settings the README gives: no second shuffle, one pass, no batching (records are batches)."""
    shard = shard or grain.sharding.NoSharding()
    sampler = grain.samplers.IndexSampler(len(source), shard_options=shard, shuffle=False, num_epochs=1)
    return grain.DataLoader(data_source=source, sampler=sampler, worker_count=workers)


def script(*args: object) -> list[list[int]]:
    cmd = [sys.executable, str(SCRIPTS / "grain_checks.py"), *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])["got"]


def test_records_are_the_stored_batches_as_read_only_arrays(store: Path) -> None:
    source = EpochSource(store, 0, keys=True, consumer=None)
    assert isinstance(source, grain.sources.RandomAccessDataSource)
    assert len(source) == -(-N // SIZE)
    for i in (0, 7, len(source) - 1):
        record = source[i]
        assert record["v"].tolist() == stored(store)[i]
        assert record["keys"][:, 0].tolist() == record["v"].tolist()
        assert not record["v"].flags.writeable
    batched = source._getitems([3, 1, 4])
    assert [b["v"].tolist() for b in batched] == [stored(store)[i] for i in (3, 1, 4)]
    assert [r["v"].tolist() for r in EpochSource(store, 0, batch_size=40, consumer=None)] == stored(store, 40)


def test_the_dataloader_yields_every_batch_once_in_the_stored_order(store: Path) -> None:
    got = [b["v"].tolist() for b in loader(EpochSource(store, 0, consumer=None))]
    assert got == stored(store)  # with two workers: the checkpoint test below, whose two runs make the epoch


def test_a_sampler_sharded_over_two_processes_reads_every_batch_exactly_once(store: Path) -> None:
    source = EpochSource(store, 0, consumer=None)
    shards = [
        [b["v"].tolist() for b in loader(source, shard=grain.sharding.ShardOptions(i, 2, drop_remainder=False))]
        for i in range(2)
    ]
    assert shards[0]
    assert shards[1]
    got = sorted(shards[0] + shards[1])
    assert got == sorted(stored(store))  # each batch once, on one of the two
    even = [
        [b["v"].tolist() for b in loader(source, shard=grain.sharding.ShardOptions(i, 2, drop_remainder=True))]
        for i in range(2)
    ]
    assert len(even[0]) == len(even[1]) == len(source) // 2  # every process the same number of steps


def test_two_workers_and_grains_checkpoint_restored_in_a_fresh_process_read_every_batch_once(
    store: Path, tmp_path: Path
) -> None:
    state = tmp_path / "state.json"
    first = script(store, 2, "--steps", 11, "--state", state)  # two workers, each some batches ahead
    assert len(first) == 11
    rest = script(store, 2, "--resume", state)
    assert first + rest == stored(store)


def test_grains_checkpoint_without_workers_resumes_a_new_loader(store: Path) -> None:
    it = iter(loader(EpochSource(store, 0, consumer=None)))
    first = [next(it)["v"].tolist() for _ in range(5)]
    again = iter(loader(EpochSource(store, 0, consumer=None)))
    again.set_state(it.get_state())
    assert first + [b["v"].tolist() for b in again] == stored(store)


def test_a_missing_epoch_is_epoch_arrays_error(store: Path) -> None:
    with pytest.raises(EpochNotFoundError) as e:
        EpochSource(store, 5)
    assert str(e.value) == f"epoch 5 is not in {store} (epochs present: 0)"
    assert np.array_equal(EpochSource(store, 0, consumer=None)[0]["v"], EpochArrays(store, 0, consumer=None)[0]["v"])
