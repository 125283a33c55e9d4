"""The seams between cron dumping ahead and a training run reading: what the soak (tests/soak) found.

Each test is the smallest reproduction of something a soak run broke, fixed in the product; the soak
itself runs in ``test_soak.py`` (a short round) and ``make soak``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pgprefetch import EpochDataset, EpochStream
from pgprefetch.errors import EpochNotFoundError
from pgprefetch.store.maintenance import prune
from pgprefetch.store.open import open_store

from .harness.configs import s_config
from .harness.db import S_ROWS
from .harness.dumps import dump
from .harness.s3 import S3

SIZE = 16
PER_EPOCH = S_ROWS // SIZE  # 30 batches


def test_saving_a_loaders_position_survives_cron_deleting_the_epochs_it_started_in(
    s_table: str, tmp_path: Path
) -> None:
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


def cron_run(cfg: Path, dsn: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """The crontab's dump command (deploy/crontab), as its own process."""
    argv = [sys.executable, "-m", "pgprefetch", "dump", "--config", str(cfg), "--dsn", dsn]
    argv += ["--ahead", "1", "--keep", "1", "--consumer", "train", "--quiet", *extra]
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def test_a_journal_left_by_a_dump_killed_after_publishing_is_removed_by_the_next_cron_run(
    s_table: str, tmp_path: Path
) -> None:
    """kill -9 between the rename that publishes an epoch and the removal of its journal left the journal
    in ``.pgprefetch/partial`` for good: no partial epoch named it, so nothing ever removed it."""
    cfg = s_config(tmp_path)
    store = tmp_path / "store.zarr"
    assert cron_run(cfg, s_table).returncode == 0  # epoch 0
    journal = store / ".pgprefetch" / "partial" / "epoch-00000.journal"
    journal.write_text('{"n_batches": 30}\n0 1 2\n')  # what the kill leaves: the epoch published, its journal
    assert open_store(store).partial_epochs() == [0]
    EpochDataset(store, 0, consumer="train")
    done = cron_run(cfg, s_table)
    assert done.returncode == 0, done.stderr
    assert list((store / ".pgprefetch" / "partial").iterdir()) == []
    assert open_store(store).epochs() == [0, 1]


def test_partial_epochs_no_cron_run_will_resume_are_removed_and_the_others_kept(s_table: str, tmp_path: Path) -> None:
    """A dump killed on an epoch that training has since left behind (the consumer's record went back when
    training resumed from an older checkpoint, and cron planned past it) leaves a partial epoch that
    ``--ahead``, which dumps only after the newest epoch opened, never resumes: kept, it grew the store."""
    cfg = s_config(tmp_path)
    store = tmp_path / "store.zarr"
    for epoch in (2, 3):
        dump(cfg, s_table, epoch=epoch)
    partial = store / ".pgprefetch" / "partial"
    for epoch in (1, 6):  # behind what --keep 1 keeps, and ahead of the consumer
        (partial / f"epoch-0000{epoch}").mkdir(parents=True)
        (partial / f"epoch-0000{epoch}.journal").write_text('{"n_batches": 30}\n')
    EpochDataset(store, 3, consumer="train")
    done = cron_run(cfg, s_table)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in partial.iterdir()) == ["epoch-00006", "epoch-00006.journal"]
    assert open_store(store).epochs() == [2, 3, 4]


def test_an_s3_epochs_staging_left_by_a_dump_that_died_after_publishing_is_removed_by_the_next_cron_run(
    s_table: str, s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The soak found an epoch's whole staging (journal, shards, checksums) left after a clean cron run: a
    dump that published its epoch (or lost it to another) and died before removing its staging. ``prune``
    skipped partial epochs of complete epochs as "a --force rewrite in progress", and no dump goes back to
    a complete epoch, so one epoch of disk stayed for good each time."""
    from pgprefetch.store.s3 import S3Store

    url = f"s3://{s3.bucket()}/leftover"
    cfg = s_config(tmp_path, store=url)

    def killed(self: S3Store, epoch: int) -> None:
        raise RuntimeError("killed")  # the moment after publishing, before the staging is removed

    with monkeypatch.context() as m:
        m.setattr(S3Store, "remove_partial_staging", killed)
        with pytest.raises(RuntimeError, match="killed"):
            dump(cfg, s_table)
    assert open_store(url).epochs() == [0]  # published ...
    staging = open_store(url).staging  # type: ignore[attr-defined]
    assert (staging / "partial" / "epoch-00000").is_dir()  # ... and staged still
    EpochDataset(url, 0, consumer="train")
    done = cron_run(cfg, s_table)
    assert done.returncode == 0, done.stderr
    assert not any((staging / "partial").iterdir())
    assert open_store(url).partial_epochs() == []


def test_on_one_machine_an_s3_epochs_staging_has_one_writer_even_past_its_lease(s3: S3) -> None:
    """A dump stalled past its lease's expiry (stopped, swapping) goes on writing into its staging folder
    when it wakes; another dump of this machine that took the lease over resumed the same folder, so both
    wrote into it. The staging folder is held with a ``flock`` as a local store's epoch is, which the
    stalled holder keeps: the other dump is busy."""
    import json
    import time

    from pgprefetch.store.s3 import S3Store

    url = f"s3://{s3.bucket()}/stalled"
    first, second = S3Store(url), S3Store(url)
    with first.writer_lock(0) as held:
        assert held
        lease = first.held_lease(0)
        assert lease is not None
        lease._stop.set()  # the holder stalls: no more renewals ...
        lease._thread.join()  # type: ignore[union-attr]
        expired = {"holder": lease.holder, "node": lease._node, "expires": time.time() - 1}
        s3.client().put_object(Bucket=url.split("/")[2], Key="stalled/.pgprefetch/locks/epoch-00000.lease",
                               Body=json.dumps(expired).encode())  # fmt: skip
        with second.writer_lock(0) as taken:  # ... and its lease expired
            assert not taken


def test_a_dump_starting_while_the_server_restarts_waits_for_it(
    s_table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart in the soak failed every cron run that was between two epochs: the next epoch's first
    connection met "the database system is shutting down", and a refused first connection was an error
    (so that a wrong DSN fails at once). A server that answers it cannot take connections *now* is there."""
    import asyncio

    import asyncpg

    import pgprefetch.pg.session
    from pgprefetch import dump_epoch, load_config
    from pgprefetch.pg.retry import RetryPolicy

    real, calls = asyncpg.connect, []

    async def restarting(*args: object, **kwargs: object) -> asyncpg.Connection:
        calls.append(1)
        if len(calls) <= 2:
            raise asyncpg.CannotConnectNowError("the database system is shutting down")
        return await real(*args, **kwargs)

    monkeypatch.setattr(pgprefetch.pg.session.asyncpg, "connect", restarting)
    cfg = load_config(s_config(tmp_path), dsn=s_table)
    result = asyncio.run(dump_epoch(cfg, 0, retries=RetryPolicy(retries=5, first_wait=0.05)))
    assert (result.status, result.retry_causes) == ("written", {"server unavailable": 2})


def test_a_reader_rides_out_seconds_of_s3_throttling(
    s_table: str, s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the soak's throttling (503 SlowDown on 40% of requests for seconds), dumps gave up after their 6
    retries, about 1.5 s, and a reader under the same fault ended with a StoreError, which ends training: a
    ranged GET refused 7 times in a row. Ten retries at base 3 wait about 10 s; here one GET is refused
    7 times, then served."""
    from .harness.s3 import throttling_proxy

    url = f"s3://{s3.bucket()}/slow"
    dump(s_config(tmp_path, store=url), s_table)
    refusals: dict[str, int] = {}

    def seven_times(request: str) -> int | None:  # the first range of a shard, refused 7 times over
        if request.startswith("GET") and "/v/c/" in request and refusals.get(request, 0) < 7:
            refusals[request] = refusals.get(request, 0) + 1
            return 503
        return None

    monkeypatch.delenv("PGPREFETCH_S3_RETRIES")  # the default, as users run it (the test server's says 1)
    with throttling_proxy(s3.endpoint, every=1, refuse_with=seven_times) as (endpoint, refused):
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        batches = list(EpochDataset(url, 0, consumer=None, prefetch=1))
    assert len(batches) == PER_EPOCH
    assert refused[0] >= 7


def test_prune_and_ls_never_fail_on_a_partial_epoch_a_dump_is_publishing(tmp_path: Path) -> None:
    """A cron run's ``--keep`` (or ``ls``) measured a partial epoch just as another run published it (renamed
    it into place): ``FileNotFoundError: .../partial/epoch-00118/keys``, and the cron run failed with no
    fault to blame (found by the soak). Here a thread publishes and un-publishes one over and over."""
    import os
    import threading

    from pgprefetch.store.local import LocalStore
    from pgprefetch.store.maintenance import list_epochs

    store = LocalStore(tmp_path / "store.zarr")
    store.create()
    partial = store.partial_path(1)
    for i in range(30):
        (partial / "v" / "c" / str(i)).mkdir(parents=True)
        (partial / "v" / "c" / str(i) / "0").write_bytes(b"x" * 5000)
    store.journal_path(1).write_text("{}\n")
    aside, stop = store.path / "aside", threading.Event()

    def publishing() -> None:
        while not stop.is_set():
            os.rename(partial, aside)
            os.rename(aside, partial)

    thread = threading.Thread(target=publishing)
    thread.start()
    try:
        for _ in range(300):
            prune(store, keep=1, partials_older_than=1e9)
            list_epochs(store)
    finally:
        stop.set()
        thread.join()


def test_a_rank_that_fell_epochs_behind_keeps_the_epochs_it_has_yet_to_read(s_table: str, tmp_path: Path) -> None:
    """Ranks that read without a barrier drift apart: in the soak, rank 1 restarted from its checkpoint in
    epoch 17 while rank 0 read on. Only rank 0 recorded where the run was, cron's --keep deleted epoch 17,
    and rank 1 waited for it for the rest of the run. Each rank now records its epoch."""
    cfg = s_config(tmp_path)
    store = tmp_path / "store.zarr"
    for epoch in range(4):
        dump(cfg, s_table, epoch=epoch)
    for _ in EpochStream(store, 1, 1, rank=1, world_size=2, consumer="train"):
        pass  # rank 1 reads epoch 1 ...
    EpochDataset(store, 3, rank=0, world_size=2, consumer="train")  # ... while rank 0 is at epoch 3
    assert open_store(store).consumers() == {"train": 3, "train@1": 1}
    done = cron_run(cfg, s_table)  # --ahead 1 --keep 1 --consumer train
    assert done.returncode == 0, done.stderr
    assert open_store(store).epochs() == [0, 1, 2, 3, 4]  # after the furthest rank; what the slowest reads kept
    EpochDataset(store, 4, consumer="train")  # a later run of the name, on one rank: rank 1's record is stale
    assert open_store(store).consumers() == {"train": 4}
    assert cron_run(cfg, s_table).returncode == 0
    assert open_store(store).epochs() == [3, 4, 5]
