"""Two training runs on one store (#51.1): no run's cron deletes an epoch another run may still read.

A team runs one cron line per training run on a shared store (``dump --ahead 2 --keep 1 --consumer runA``,
the same for runB). ``--keep`` and ``prune`` went by the named run alone, so runA's cron deleted the epochs
runB was about to open. Now every recorded run counts for what is deleted, ``--consumer`` steers ``--ahead``
only, a run gone for good is removed by ``pgprefetch forget``, and ``ls`` shows each run's records, stale ones
marked. Each test drives the real commands, as processes where the exit status and the printed line matter,
against the suite's PostgreSQL and a real store.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import pgprefetch
from pgprefetch.store.open import open_store

from .harness.configs import s_config
from .harness.dumps import dump


def pgprefetch_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``pgprefetch ARGS`` as its own process, as cron runs it."""
    return subprocess.run([sys.executable, "-m", "pgprefetch", *args], capture_output=True, text=True, check=False)


def epochs_on_disk(store: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("epoch-")) for p in store.glob("epoch-*"))


def two_runs(s_table: str, tmp_path: Path) -> tuple[Path, Path]:
    """Epochs 0-5 complete; runA has opened epoch 5, runB (two ranks) epoch 2."""
    cfg = s_config(tmp_path)
    for epoch in range(6):
        dump(cfg, s_table, epoch=epoch)
    store = tmp_path / "store.zarr"
    backend = open_store(store)
    backend.record_consumer("runA", 5)
    backend.record_consumer("runB", 2, rank=0, world=2)
    backend.record_consumer("runB", 2, rank=1, world=2)
    return cfg, store


def test_one_runs_cron_keeps_every_epoch_another_run_may_still_read(s_table: str, tmp_path: Path) -> None:
    """runA's ``--ahead 2 --keep 1`` deleted epochs 1-3 while runB was at epoch 2; runB then failed on epoch 3."""
    cfg, store = two_runs(s_table, tmp_path)
    cron = ["dump", "--config", str(cfg), "--dsn", s_table, "--ahead", "2", "--keep", "1", "--consumer", "runA"]
    done = pgprefetch_process(*cron)
    assert done.returncode == 0, done.stderr
    # --consumer steers --ahead: runA's next two epochs were dumped; --keep went by runB (2 - 1): only 0 went.
    assert epochs_on_disk(store) == [1, 2, 3, 4, 5, 6, 7]
    assert "deleted epoch 0 (complete, more than 1 behind the slowest consumer, runB at epoch 2)" in done.stdout
    for epoch in (3, 4):  # runB reads on, each rank
        for rank in (0, 1):
            pgprefetch.EpochDataset(store, epoch, consumer="runB", rank=rank, world_size=2)
    # prune, with or without --consumer, now goes by runB at 4: epochs 1 and 2 go, 3 stays.
    pruned = pgprefetch_process("prune", "--store", str(store), "--keep", "1", "--consumer", "runA")
    assert pruned.returncode == 0, pruned.stderr
    assert (
        pruned.stdout.strip()
        == "deleted epochs 1, 2 (complete, more than 1 behind the slowest consumer, runB at epoch 4)"
    )
    assert epochs_on_disk(store) == [3, 4, 5, 6, 7]


def test_a_run_behind_by_one_rank_holds_the_store_for_that_rank(s_table: str, tmp_path: Path) -> None:
    _, store = two_runs(s_table, tmp_path)
    open_store(store).record_consumer("runB", 5, rank=0, world=2)  # rank 1 still at 2
    pruned = pgprefetch_process("prune", "--store", str(store), "--keep", "0")
    assert pruned.returncode == 0, pruned.stderr
    assert "runB@1 at epoch 2" in pruned.stdout
    assert epochs_on_disk(store) == [2, 3, 4, 5]


def test_a_run_gone_for_good_is_forgotten_by_a_person_and_then_holds_nothing(s_table: str, tmp_path: Path) -> None:
    _, store = two_runs(s_table, tmp_path)
    typo = pgprefetch_process("forget", "--store", str(store), "runb")
    assert typo.returncode == 2
    assert typo.stderr.count("\n") == 1
    assert "Traceback" not in typo.stderr
    assert "did you mean 'runB'?" in typo.stderr
    assert set(open_store(store).consumers()) == {"runA", "runB", "runB@1"}
    forgot = pgprefetch_process("forget", "--store", str(store), "runB", "--json")
    assert forgot.returncode == 0, forgot.stderr
    assert json.loads(forgot.stdout) == {"forgotten": ["runB", "runB@1"]}
    assert open_store(store).consumers() == {"runA": 5}
    assert pgprefetch_process("prune", "--store", str(store), "--keep", "1").returncode == 0
    assert epochs_on_disk(store) == [4, 5]


def test_ls_shows_each_runs_records_and_marks_a_stale_one_which_still_holds_its_epochs(
    s_table: str, tmp_path: Path
) -> None:
    _, store = two_runs(s_table, tmp_path)
    record = store / ".pgprefetch" / "consumers" / "runB@1.json"
    old = json.loads(record.read_bytes())
    old["updated"] = (datetime.now(UTC) - timedelta(days=9)).isoformat(timespec="seconds")
    record.write_text(json.dumps(old))
    listed = pgprefetch_process("ls", "--store", str(store))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    runb1 = next(line for line in lines if line.strip().startswith("runB@1"))
    assert "epoch 2, 9 days ago" in runb1
    assert "stale: if runB is gone for good, `pgprefetch forget runB`" in runb1
    runa = next(line for line in lines if line.strip().startswith("runA"))
    assert "epoch 5" in runa
    assert "stale" not in runa
    as_json = json.loads(pgprefetch_process("ls", "--store", str(store), "--json").stdout)
    stale = {(c["consumer"], c["rank"]): c["stale"] for c in as_json["consumers"]}
    assert stale == {("runA", 0): False, ("runB", 0): False, ("runB", 1): True}
    # Stale is a word for a person, not a rule: the record still holds epoch 2 against any cron.
    assert pgprefetch_process("prune", "--store", str(store), "--keep", "0").returncode == 0
    assert epochs_on_disk(store) == [2, 3, 4, 5]


@pytest.mark.parametrize("name", ["../../x", "a/b", ".hidden", "x\n", "", "a" * 65])
def test_a_consumer_name_that_cannot_be_a_file_name_is_refused_before_the_store_is_touched(
    s_table: str, tmp_path: Path, name: str
) -> None:
    """#51.13: ``--consumer '../../x' --new`` on a store without consumers was not name-checked."""
    cfg = s_config(tmp_path)
    store = tmp_path / "store.zarr"
    for argv in (
        ["dump", "--config", str(cfg), "--dsn", s_table, "--ahead", "1", "--consumer", name, "--new"],
        ["dump", "--config", str(cfg), "--dsn", s_table, "--epoch", "0", "--keep", "1", "--consumer", name],
    ):
        refused = pgprefetch_process(*argv)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.startswith("Error: --consumer ")
        assert refused.stderr.count("\n") == 1
        assert not store.exists()
    dump(cfg, s_table, epoch=0)  # a store without consumers: still refused, nothing recorded
    refused = pgprefetch_process("dump", "--config", str(cfg), "--dsn", s_table, "--ahead", "1", "--consumer", name,
                                 "--new")  # fmt: skip
    assert refused.returncode == 2
    assert open_store(store).consumer_records() == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([cfg.name, "store.zarr"])
    assert not list(tmp_path.rglob("x.json"))


@pytest.mark.parametrize(
    "damage", [b'{"consumer": "runB", "epo', b'{"consumer": "runB", "epoch": 1e400, "world": 2}', b"[2]"]
)
def test_a_damaged_record_keeps_every_epoch_and_is_named_not_ignored(
    s_table: str, tmp_path: Path, damage: bytes
) -> None:
    """A record that cannot be read says nothing of where its run is: no other run's cron deletes its epochs."""
    cfg, store = two_runs(s_table, tmp_path)
    (store / ".pgprefetch" / "consumers" / "runB.json").write_bytes(damage)  # rank 1's count is unknown too
    cron = ["dump", "--config", str(cfg), "--dsn", s_table, "--ahead", "1", "--keep", "0", "--consumer", "runA"]
    done = pgprefetch_process(*cron)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert epochs_on_disk(store) == [0, 1, 2, 3, 4, 5, 6]
    assert "kept every complete epoch: consumer record runB, runB@1 is damaged" in done.stdout
    pruned = pgprefetch_process("prune", "--store", str(store), "--keep", "0", "--json")
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["deleted_epochs"] == []
    listed = pgprefetch_process("ls", "--store", str(store))
    assert listed.returncode == 0, listed.stderr
    runb = next(line for line in listed.stdout.splitlines() if line.strip().startswith("runB "))
    assert "damaged record (holds every epoch until it is rewritten or forgotten)" in runb
    pgprefetch.EpochDataset(store, 3, consumer="runB", rank=0, world_size=2)  # runB's next open rewrites it
    assert pgprefetch_process("prune", "--store", str(store), "--keep", "0").returncode == 0
    assert epochs_on_disk(store) == [2, 3, 4, 5, 6]  # runB@1 at 2 holds the rest
