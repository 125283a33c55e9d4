"""The mistakes a cron line makes that did work nobody asked for, or called a failure success (#37).

A mistyped ``--consumer`` under ``--ahead --keep`` dumped stale epochs and only then failed; ``dump`` into
another config's store said "already complete" for an epoch number that store has; a mistyped store path
was created, parents and all; a dump that failed before writing an epoch left an empty store behind;
``--ahead`` with nothing to do said nothing. Each test runs the mistake against the real thing: the
suite's PostgreSQL, a real store, ``pgprefetch`` as its own process where the exit status matters.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import pgprefetch
from pgprefetch.store.open import open_store

from .harness.configs import s_config
from .harness.dumps import dump


def pgprefetch_process(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``pgprefetch ARGS`` as its own process, as cron runs it: the exit status is the real one."""
    return subprocess.run(
        [sys.executable, "-m", "pgprefetch", *args], capture_output=True, text=True, check=False, env=env
    )


def epoch_folders(store: Path) -> list[str]:
    return sorted(p.name for p in store.glob("epoch-*"))


def partials(store: Path) -> list[str]:
    folder = store / ".pgprefetch" / "partial"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def trained_store(s_table: str, tmp_path: Path) -> tuple[Path, Path]:
    """A store where consumer ``runA`` reads epoch 3, epochs 2 and 3 are there, 0 and 1 long pruned."""
    cfg = s_config(tmp_path)
    store = tmp_path / "store.zarr"
    for epoch in (2, 3):
        dump(cfg, s_table, epoch=epoch)
    open_store(store).record_consumer("runA", 3)
    return cfg, store


def test_a_mistyped_consumer_under_ahead_and_keep_is_refused_before_any_work(s_table: str, tmp_path: Path) -> None:
    """#37.1: ``--consumer runB`` (for runA) dumped epochs 0 and 1 again, then exited 1 on the --keep half."""
    cfg, store = trained_store(s_table, tmp_path)
    cron = ["dump", "--config", str(cfg), "--dsn", s_table, "--ahead", "2", "--keep", "1", "--consumer", "runB"]
    typo = pgprefetch_process(*cron)
    assert epoch_folders(store) == ["epoch-00002", "epoch-00003"]  # epochs 0 and 1 not dumped again
    assert partials(store) == []
    assert typo.returncode == 2, typo.stderr
    assert typo.stdout == ""
    line = typo.stderr.strip()
    assert "no consumer 'runB' has opened an epoch" in line
    assert "did you mean 'runA'?" in line
    assert "(consumers: runA)" in line
    assert "--consumer runB --new" in line  # the way to say it is a new run
    assert "Traceback" not in typo.stderr
    assert epoch_folders(store) == ["epoch-00002", "epoch-00003"]  # nothing dumped, nothing pruned
    assert partials(store) == []
    # The --keep half alone decides the same way, before the epoch is dumped.
    keep_only = pgprefetch_process("dump", "--config", str(cfg), "--dsn", s_table, "--epoch", "4", "--keep", "1",
                                   "--consumer", "runB")  # fmt: skip
    assert keep_only.returncode == 2
    assert "did you mean 'runA'?" in keep_only.stderr
    assert epoch_folders(store) == ["epoch-00002", "epoch-00003"]
    assert partials(store) == []


def test_a_name_nothing_like_any_consumer_lists_them_without_a_guess(s_table: str, tmp_path: Path) -> None:
    cfg, store = trained_store(s_table, tmp_path)
    done = pgprefetch_process("dump", "--config", str(cfg), "--dsn", s_table, "--ahead", "1", "--consumer", "zzz")
    assert done.returncode == 2
    assert "did you mean" not in done.stderr
    assert "(consumers: runA)" in done.stderr
    assert epoch_folders(store) == ["epoch-00002", "epoch-00003"]


def test_new_registers_a_run_that_has_not_read_yet_and_it_starts_at_epoch_0(s_table: str, tmp_path: Path) -> None:
    """``--consumer runB --new``: runB is a new training run, which will read from epoch 0."""
    cfg, store = trained_store(s_table, tmp_path)
    cron = ["dump", "--config", str(cfg), "--dsn", s_table, "--ahead", "2", "--keep", "1", "--consumer", "runB"]
    new = pgprefetch_process(*cron, "--new", "--quiet")
    assert new.returncode == 0, new.stderr
    assert epoch_folders(store) == [f"epoch-0000{e}" for e in range(4)]  # 0 and 1 for runB; 2, 3 kept
    assert open_store(store).consumers() == {"runA": 3, "runB": -1}
    # Registered: the same line without --new is not a typo any more, and has nothing to do.
    again = pgprefetch_process(*cron)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "nothing to do: epochs 0, 1 ready"
    # runA's cron deletes nothing runB may read before runB opens its first epoch (prune goes by the slowest).
    assert pgprefetch_process("prune", "--store", str(store), "--keep", "1").returncode == 0
    assert epoch_folders(store) == [f"epoch-0000{e}" for e in range(4)]
    # --new for a run already recorded changes nothing.
    assert pgprefetch_process(*cron, "--new", "--quiet").returncode == 0
    assert open_store(store).consumers() == {"runA": 3, "runB": -1}
    pgprefetch.EpochDataset(store, 0, consumer="runB")  # runB's first read replaces the registration
    assert open_store(store).consumers() == {"runA": 3, "runB": 0}


def test_new_and_consumer_are_refused_where_they_mean_nothing(s_table: str, tmp_path: Path) -> None:
    cfg = s_config(tmp_path)
    base = ["dump", "--config", str(cfg), "--dsn", s_table]
    lonely = pgprefetch_process(*base, "--ahead", "1", "--new")
    assert lonely.returncode == 2
    assert lonely.stderr.strip() == "Error: --new needs --consumer NAME: the training run to register"
    unused = pgprefetch_process(*base, "--epoch", "0", "--consumer", "runA")
    assert unused.returncode == 2
    assert "--consumer needs --ahead K or --keep N" in unused.stderr
    assert not (tmp_path / "store.zarr").exists()


def test_a_store_of_another_config_is_refused_for_an_epoch_it_has_as_for_one_it_has_not(
    s_table: str, tmp_path: Path
) -> None:
    """#37.2: epoch 0 of another config was "already complete", exit 0; epoch 1 was refused."""
    mine = s_config(tmp_path, name="mine.toml")
    theirs = s_config(tmp_path, name="theirs.toml", seed=7, store="theirs.zarr")
    dump(theirs, s_table, epoch=0)
    store = tmp_path / "theirs.zarr"
    before = sorted(str(p.relative_to(store)) for p in store.rglob("*"))
    for epoch in ("0", "1"):
        done = pgprefetch_process("dump", "--config", str(mine), "--dsn", s_table, "--epoch", epoch,
                                  "--store", str(store))  # fmt: skip
        assert done.returncode == 2, (epoch, done.stdout, done.stderr)
        assert "holds epochs of another config (epoch 0:" in done.stderr
        assert "already complete" not in done.stdout
    ahead = pgprefetch_process("dump", "--config", str(mine), "--dsn", s_table, "--ahead", "2", "--store", str(store))
    assert ahead.returncode == 2
    assert "holds epochs of another config" in ahead.stderr
    assert sorted(str(p.relative_to(store)) for p in store.rglob("*")) == before  # nothing written
    # The API says the same; --force still writes there on purpose.
    with pytest.raises(pgprefetch.ConfigError, match="holds epochs of another config"):
        pgprefetch.dump(mine, 0, dsn=s_table, store=str(store))
    (forced,) = pgprefetch.dump(mine, 0, dsn=s_table, store=str(store), force=True)
    assert forced.status == "written"


def test_a_store_whose_parent_folder_is_missing_is_refused_and_nothing_made(s_table: str, tmp_path: Path) -> None:
    """#37.3: ``--store /nonexistent/dir/aq.zarr`` made the folders, and --ahead a fresh store from epoch 0."""
    cfg = s_config(tmp_path)
    wrong = tmp_path / "nonexistent" / "dir" / "aq.zarr"
    for mode in (["--epoch", "0"], ["--ahead", "2", "--keep", "1"]):
        done = pgprefetch_process("dump", "--config", str(cfg), "--dsn", s_table, "--store", str(wrong), *mode)
        assert done.returncode == 2, done.stderr
        assert f"its parent folder {wrong.parent} does not exist" in done.stderr
        assert "--parents" in done.stderr
        assert not (tmp_path / "nonexistent").exists()
    # A [store] path in a config (relative to the config's folder) is held to the same rule.
    (tmp_path / "configs").mkdir()
    nested = s_config(tmp_path / "configs", store="../prefetch/s.zarr")  # as the repository's configs/ do
    refused = pgprefetch_process("dump", "--config", str(nested), "--dsn", s_table, "--epoch", "0")
    assert refused.returncode == 2
    assert f"its parent folder {tmp_path / 'prefetch'} does not exist" in refused.stderr
    assert not (tmp_path / "prefetch").exists()
    # Asked for, the parents are made; the store's own folder never needs asking.
    made = pgprefetch_process("dump", "--config", str(cfg), "--dsn", s_table, "--store", str(wrong), "--epoch", "0",
                              "--parents", "--quiet")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert epoch_folders(wrong) == ["epoch-00000"]
    (result,) = pgprefetch.dump(cfg, 0, dsn=s_table, store=str(tmp_path / "api" / "s.zarr"), parents=True)
    assert result.status == "written"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_dump_that_fails_before_writing_an_epoch_leaves_no_store(s_table: str, tmp_path: Path) -> None:
    """#37.16: a wrong RAY_ADDRESS left a store (zarr.json, an empty partial epoch) where there was none."""
    cfg = s_config(tmp_path)
    store = tmp_path / "store.zarr"
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{closed_port()}"}
    done = pgprefetch_process("dump", "--config", str(cfg), "--dsn", s_table, "--epoch", "0", "--executor", "ray",
                              env=env)  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "cannot join the Ray cluster" in done.stderr
    assert not store.exists(), sorted(str(p.relative_to(store)) for p in store.rglob("*"))
    # A store that was there already is left as it was, its epochs and all.
    dump(cfg, s_table, epoch=0)
    again = pgprefetch_process("dump", "--config", str(cfg), "--dsn", s_table, "--epoch", "1", "--executor", "ray",
                               env=env)  # fmt: skip
    assert again.returncode == 1
    assert epoch_folders(store) == ["epoch-00000"]


def test_a_dump_whose_database_refuses_leaves_no_store(tmp_path: Path) -> None:
    cfg = s_config(tmp_path)
    done = pgprefetch_process("dump", "--config", str(cfg), "--dsn", f"postgresql://u@127.0.0.1:{closed_port()}/x",
                              "--epoch", "0")  # fmt: skip
    assert done.returncode == 1
    assert not (tmp_path / "store.zarr").exists()


def test_ahead_with_nothing_to_do_says_so(s_table: str, tmp_path: Path) -> None:
    """``dump --ahead`` with every epoch ready printed nothing, with --keep and with --json."""
    cfg = s_config(tmp_path)
    store = tmp_path / "store.zarr"
    base = ["dump", "--config", str(cfg), "--dsn", s_table, "--ahead", "2"]
    assert pgprefetch_process(*base, "--quiet").returncode == 0
    open_store(store).record_consumer("default", 5)  # training opened epoch 5: 6 and 7 are next
    assert pgprefetch_process(*base, "--quiet").returncode == 0
    assert epoch_folders(store)[-2:] == ["epoch-00006", "epoch-00007"]
    for extra in ([], ["--keep", "9"]):
        done = pgprefetch_process(*base, *extra)
        assert (done.returncode, done.stdout) == (0, "nothing to do: epochs 6, 7 ready\n")
    as_json = pgprefetch_process(*base, "--keep", "9", "--json")
    assert as_json.returncode == 0
    assert json.loads(as_json.stdout) == {"status": "nothing to do", "ready": [6, 7]}
    assert pgprefetch_process(*base, "--quiet").stdout == ""


def test_the_python_api_dumps_ahead_and_keeps_as_cron_does(s_table: str, tmp_path: Path) -> None:
    """``pgprefetch.dump(ahead=, keep=, consumer=)`` writes and deletes what ``dump --ahead --keep`` does (#52)."""
    cli_store, api_store = tmp_path / "cli" / "s.zarr", tmp_path / "api" / "s.zarr"
    cfg = s_config(tmp_path)
    for store in (cli_store, api_store):
        store.parent.mkdir()
        open_store(str(store)).create()
        open_store(str(store)).record_consumer("run", 3)  # a training run that has opened epoch 3
    argv = ["dump", "--config", str(cfg), "--dsn", s_table, "--store", str(cli_store), "--quiet"]
    for _ in range(2):  # cron, twice: the second run finds nothing to do
        ran = pgprefetch_process(*argv, "--ahead", "2", "--keep", "1", "--consumer", "run")
        assert ran.returncode == 0, ran.stderr
        results = pgprefetch.dump(cfg, ahead=2, keep=1, consumer="run", dsn=s_table, store=str(api_store))
    assert results == []  # nothing to do the second time
    assert epoch_folders(api_store) == epoch_folders(cli_store) == ["epoch-00004", "epoch-00005"]
    with pytest.raises(pgprefetch.ConfigError, match="--new needs --consumer"):
        pgprefetch.dump(cfg, ahead=2, new_consumer=True, dsn=s_table, store=str(api_store))
    with pytest.raises(pgprefetch.ConfigError, match="give one of"):
        pgprefetch.dump(cfg, 0, ahead=2, dsn=s_table, store=str(api_store))
