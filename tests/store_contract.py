"""The store contract: what every backend of :class:`pgprefetch.store.base.Store` does, as one suite (#52).

zarr-python's habit (``zarr.testing.store.StoreTests``): a backend's test module subclasses
:class:`StoreTests` and says only how to make a location of it (``location``); every behaviour the rest of
pgprefetch relies on is checked against each backend the same way, with real epochs dumped from the
suite's PostgreSQL. A new backend (GCS) is its module and one test class.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

from pgprefetch import EpochArrays, load_config
from pgprefetch.store.base import Store, epoch_name
from pgprefetch.store.open import open_store
from pgprefetch.write.pipeline import dump_epoch

from .harness.configs import s_config
from .harness.dumps import StopAfter, dump


class StoreTests:
    """Subclass with a ``location`` fixture: a store location (a folder, ``s3://...``) nothing is at yet."""

    @pytest.fixture
    def location(self, tmp_path: Path) -> str:
        raise NotImplementedError("a backend's test class gives its locations")

    @pytest.fixture
    def dumped(self, location: str, s_table: str, tmp_path: Path) -> Store:
        """The store at ``location`` with epochs 0 and 1 of ``s(id, v)`` (480 samples, 30 batches of 16)."""
        config = s_config(tmp_path, store=location)
        for epoch in (0, 1):
            dump(config, s_table, epoch)
        return open_store(location)

    def test_a_store_exists_once_created_and_holds_nothing_yet(self, location: str) -> None:
        store = open_store(location)
        assert not store.exists()
        store.create()
        assert store.exists()
        assert store.epochs() == []
        assert store.partial_epochs() == []
        assert store.consumers() == {}

    def test_a_dumped_epoch_is_complete_with_its_manifest_and_every_batch(self, dumped: Store) -> None:
        assert dumped.epochs() == [0, 1]
        assert all(dumped.is_complete(e) for e in (0, 1))
        manifest = dumped.manifest(0)
        assert (manifest["n_batches"], manifest["n_samples"], manifest["batch_size"]) == (30, 480, 16)
        assert dumped.epoch_bytes(0) > 480 * 4
        layout = dumped.array_layout(0, "v")
        values = np.concatenate([np.frombuffer(dumped.batch_bytes(layout, b) or b"", "<f4") for b in range(30)])
        assert sorted(values.tolist()) == [i / 2 for i in range(1, 481)]  # a permutation of the table
        read = EpochArrays(dumped.location, 0)
        assert np.array_equal(values, np.concatenate([read[b]["v"].reshape(-1) for b in range(30)]))

    def test_objects_are_read_whole_by_range_and_sized(self, dumped: Store) -> None:
        key = f"{epoch_name(0)}/zarr.json"
        whole = dumped.read(key)
        assert whole is not None
        assert dumped.size(key) == len(whole)
        assert bytes(dumped.read_range(key, 2, 5)) == whole[2:7]
        assert dumped.read(f"{epoch_name(0)}/nothing") is None
        assert dumped.size(f"{epoch_name(0)}/nothing") is None

    def test_a_removed_epoch_is_gone_whole_and_the_others_stay(self, dumped: Store) -> None:
        dumped.remove_epoch(0)
        assert dumped.epochs() == [1]
        assert not dumped.is_complete(0)
        assert dumped.read(f"{epoch_name(0)}/zarr.json") is None
        assert dumped.manifest(1)["n_samples"] == 480

    def test_consumer_records_are_kept_listed_and_removed(self, dumped: Store) -> None:
        dumped.record_consumer("run", 3)
        dumped.record_consumer("run", 4, rank=1, world=2)
        assert dumped.consumers()["run"] == 3
        records = dumped.consumer_records()
        assert len(records) == 2
        for name in records:
            dumped.remove_consumer_record(name)
        assert dumped.consumers() == {}

    def test_the_vocabulary_grows_by_swaps_that_see_each_other(self, location: str) -> None:
        store = open_store(location)
        store.create()

        def add(value: str) -> None:
            store.grow_vocabulary(lambda lists: {"tag": [*lists.get("tag", []), value]})

        threads = [threading.Thread(target=add, args=(f"v{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(store.vocabulary()["tag"]) == ["v0", "v1", "v2", "v3"]  # no grow lost to another

    def test_one_writer_at_a_time_holds_an_epoch(self, location: str) -> None:
        store = open_store(location)
        store.create()
        with store.writer_lock(5) as held:
            assert held
            seen: list[bool] = []

            def second() -> None:
                with open_store(location).writer_lock(5) as other:
                    seen.append(other)

            t = threading.Thread(target=second)
            t.start()
            t.join()
            assert seen == [False]
        with store.writer_lock(5) as again:
            assert again

    def test_a_partial_epoch_is_listed_until_removed_and_its_spill_folder_with_it(
        self, location: str, s_table: str, tmp_path: Path
    ) -> None:
        cfg = load_config(s_config(tmp_path, store=location), dsn=s_table)
        with pytest.raises(RuntimeError, match="interrupted"):
            asyncio.run(dump_epoch(cfg, 0, progress=StopAfter(3)))  # type: ignore[arg-type]
        store = open_store(location)
        assert store.partial_epochs() == [0]
        store.spill_path(0).mkdir(parents=True, exist_ok=True)
        store.remove_partial(0)
        assert store.partial_epochs() == []
        assert not store.spill_path(0).exists()

    def test_its_capabilities_say_what_it_is_not_its_class(self, dumped: Store) -> None:
        """A folder has a local root and is no object store; an object store the reverse: code asks these."""
        assert (dumped.local_root is None) == (dumped.object_store is not None)
        if dumped.local_root is not None:
            assert (dumped.local_root / epoch_name(0) / "zarr.json").is_file()
        else:
            assert dumped.object_store is not None
            sizes = dumped.object_store.sizes(epoch_name(0))
            assert sizes[f"{epoch_name(0)}/zarr.json"] == dumped.size(f"{epoch_name(0)}/zarr.json")
        assert dumped.spill_path(0).parent == dumped.partial_path(0).parent  # local, beside the partial epoch
