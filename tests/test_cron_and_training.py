"""The seams between cron dumping ahead and a training run reading: what the soak (tests/soak) found.

Each test is the smallest reproduction of something a soak run broke, fixed in the product; the soak
itself runs in ``test_soak.py`` (a short round) and ``make soak``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pgprefetch import EpochDataset, EpochStream
from pgprefetch.errors import EpochNotFoundError
from pgprefetch.store.maintenance import prune
from pgprefetch.store.open import open_store

from .helpers import S_ROWS, dump, s_config

SIZE = 16
PER_EPOCH = S_ROWS // SIZE  # 30 batches


def test_saving_a_loaders_position_survives_cron_deleting_the_epochs_it_started_in(s_table: str, tmp_path: Path) -> None:
    """With DataLoader workers, the main process saves ``stream.state_dict(batches=n)``, n counted from where
    the loader started: epochs ago, and cron's ``--keep`` has deleted them since. The soak's training ranks
    failed at their first save after a prune (EpochNotFoundError: epoch 0 is not in the store)."""
    cfg = s_config(tmp_path)
    for epoch in range(4):
        dump(cfg, s_table, epoch=epoch)
    store = tmp_path / "store.zarr"
    stream = EpochStream(store, consumer=None)  # the main process's stream: the workers iterate their copies
    assert stream.state_dict(batches=10)["epoch"] == 0  # saves in epoch 0, then in epoch 1
    assert stream.state_dict(batches=PER_EPOCH + 10)["epoch"] == 1
    EpochDataset(store, 2)  # the ranks' workers open epoch 2 ...
    assert prune(open_store(store), keep=0).epochs == [0, 1]  # ... and cron's --keep deletes what is behind
    state = stream.state_dict(batches=2 * PER_EPOCH + 5)
    assert (state["epoch"], state["next_sample"]) == (2, 5 * SIZE)
    resumed = EpochStream(store, 0, 4, consumer=None)
    resumed.load_state_dict(state)
    assert len(list(resumed)) == 2 * PER_EPOCH - 5  # the rest of epoch 2, and epoch 3


def test_a_position_through_an_epoch_deleted_before_any_save_in_it_says_what_to_do(
    s_table: str, tmp_path: Path
) -> None:
    cfg = s_config(tmp_path)
    for epoch in range(3):
        dump(cfg, s_table, epoch=epoch)
    store = tmp_path / "store.zarr"
    stream = EpochStream(store, consumer=None)
    EpochDataset(store, 2)
    prune(open_store(store), keep=0)
    with pytest.raises(EpochNotFoundError, match="save it at least once an epoch, or raise the dump's --keep"):
        stream.state_dict(batches=2 * PER_EPOCH + 5)
