"""Cron-style operation: --ahead/--keep, ls, verify, prune, one writer per epoch, the store's file modes.

Dumps of ``s`` (the ``s_table`` fixture) as cron and a training run use them: the CLI in this process
(``run_cli``) or as its own process, its exit status the real one. A dump interrupted (``kill -9``,
Ctrl-C, SIGTERM, a damaged journal, a failed publish) and resumed is tests/test_operations_resume.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pgprefetch.write.files.shardfiles
from pgprefetch import EpochDataset, EpochStream

from .harness.configs import operations_config as config
from .harness.db import S_ROWS
from .harness.dumps import dump, journal_lines, run_cli, start_dump, wait_for

SIZE = 16  # 30 batches


def test_ahead_and_keep_follow_the_recorded_consumer(s_table: str, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    store = tmp_path / "store.zarr"
    args = ["dump", "--config", str(cfg), "--dsn", s_table, "--quiet"]
    assert run_cli(*args, "--ahead", "2")[0] == 0  # nothing started: epochs 0 and 1
    assert sorted(p.name for p in store.glob("epoch-*")) == ["epoch-00000", "epoch-00001"]
    EpochDataset(store, epoch=1)  # training opens epoch 1 (consumer "default")
    assert json.loads((store / ".pgprefetch" / "consumers" / "default.json").read_text())["epoch"] == 1
    assert run_cli(*args, "--ahead", "2", "--keep", "1")[0] == 0  # dumps 2, 3; keeps epochs >= 0
    assert sorted(p.name for p in store.glob("epoch-*")) == [f"epoch-0000{i}" for i in range(4)]
    EpochDataset(store, epoch=3)
    code, out = run_cli("dump", "--config", str(cfg), "--dsn", s_table, "--ahead", "1", "--keep", "1")
    assert code == 0
    assert out.splitlines()[-1] == (
        "deleted epochs 0, 1 (complete, more than 1 behind the slowest consumer, default at epoch 3)"
    )
    assert sorted(p.name for p in store.glob("epoch-*")) == ["epoch-00002", "epoch-00003", "epoch-00004"]


def test_cron_set_up_before_training_starts_the_loop_at_epoch_0(s_table: str, tmp_path: Path) -> None:
    """The cron side first, naming a consumer no training run has been yet; then training; then cron again."""
    cfg = config(tmp_path)
    store = tmp_path / "store.zarr"
    cron = ["dump", "--config", str(cfg), "--dsn", s_table, "--ahead", "2", "--keep", "1", "--consumer", "train"]
    first = pgprefetch_process(*cron)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in store.glob("epoch-*")) == ["epoch-00000", "epoch-00001"]
    stream = EpochStream(store, epochs=1, consumer="train", timeout=30)
    assert sum(1 for _ in stream) == S_ROWS // SIZE  # the training job reads epoch 0 and records it
    again = pgprefetch_process(*cron)
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in store.glob("epoch-*")) == ["epoch-00000", "epoch-00001", "epoch-00002"]
    # A typo in prune's --consumer, while another consumer exists, is still refused.
    typo = pgprefetch_process("prune", "--store", str(store), "--keep", "1", "--consumer", "trian")
    assert typo.returncode != 0
    assert "no consumer 'trian' has opened an epoch" in typo.stderr


def test_ls_json_lists_complete_and_partial_epochs(s_table: str, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    result = dump(cfg, s_table, epoch=0)
    partial = tmp_path / "store.zarr" / ".pgprefetch" / "partial"
    (partial / "epoch-00001").mkdir(parents=True)
    (partial / "epoch-00001.journal").write_text(
        json.dumps({"n_batches": 30, "n_keys": 480, "batch_size": 16, "arrays": {"a": ["<f4", []], "b": ["<f4", []]}})
        + "\n0 1 2\n1 3 4\n"
    )  # a batch line holds a checksum per array the header names
    code, out = run_cli("ls", "--config", str(cfg), "--json")
    assert code == 0
    epochs = json.loads(out)["epochs"]
    assert [(e["epoch"], e["state"]) for e in epochs] == [(0, "complete"), (1, "partial")]
    complete = epochs[0]
    assert set(complete) == {"epoch", "state", "n_batches", "n_samples", "bytes", "created", "seconds"}
    assert (complete["n_batches"], complete["n_samples"]) == (30, 480)
    assert complete["bytes"] >= result.bytes
    assert complete["created"]
    assert complete["seconds"] > 0
    assert (epochs[1]["n_batches"], epochs[1]["batches_written"]) == (30, 2)
    assert (epochs[1]["n_samples"], epochs[1]["n_samples_total"]) == (32, 480)  # the samples written
    code, out = run_cli("ls", "--store", str(tmp_path / "store.zarr"))
    assert out.splitlines()[1].split()[:3] == ["0", "complete", "30"]


def pgprefetch_process(*args: str) -> subprocess.CompletedProcess[str]:
    """``pgprefetch ARGS`` as its own process, as a user or cron runs it: the exit status is the real one."""
    return subprocess.run([sys.executable, "-m", "pgprefetch", *args], capture_output=True, text=True, check=False)


STORE_COMMANDS = (["ls"], ["verify", "--epoch", "0"], ["prune", "--keep", "1"], ["stats", "--epoch", "0"])


def test_a_missing_store_is_a_usage_error_exit_2_naming_the_path(tmp_path: Path) -> None:
    absent = tmp_path / "absent.zarr"
    for command in STORE_COMMANDS:
        done = pgprefetch_process(*command, "--store", str(absent))
        assert (done.returncode, done.stdout, done.stderr) == (2, "", f"Error: no store at {absent} (nothing there)\n")
        done = pgprefetch_process(*command, "--store", str(absent), "--json")
        assert done.returncode == 2, command
        assert json.loads(done.stdout) == {"error": f"no store at {absent} (nothing there)", "exit_code": 2}
    cfg = config(tmp_path, store="never-dumped.zarr")  # through a config's [store] path too
    done = pgprefetch_process("ls", "--config", str(cfg))
    assert (done.returncode, done.stderr) == (
        2,
        f"Error: no store at {tmp_path / 'never-dumped.zarr'} (nothing there)\n",
    )


def test_a_store_path_that_is_a_file_is_named_a_file_not_a_store(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text("[samples]\n")
    for command in STORE_COMMANDS:
        result = pgprefetch_process(*command, "--store", str(path))
        assert (result.returncode, result.stderr.strip()) == (
            2,
            f"Error: no store at {path} (a file, not a store: a store is a folder)",
        ), command


def test_ls_of_an_existing_empty_store_lists_nothing_and_exits_0(tmp_path: Path) -> None:
    from pgprefetch.store.open import open_store

    open_store(tmp_path / "empty.zarr").create()
    done = pgprefetch_process("ls", "--store", str(tmp_path / "empty.zarr"))
    assert (done.returncode, len(done.stdout.splitlines()), done.stderr) == (0, 1, "")  # the header alone
    assert done.stdout.split()[:2] == ["epoch", "state"]
    done = pgprefetch_process("ls", "--store", str(tmp_path / "empty.zarr"), "--json")
    assert (done.returncode, json.loads(done.stdout)) == (0, {"epochs": [], "consumers": []})


def test_verify_names_a_flipped_byte_and_a_deleted_chunk(
    s_table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pgprefetch.write.files.shardfiles, "SHARD_BYTES", 4 * SIZE * 4)  # 4 batches of v per shard file
    cfg = config(tmp_path)
    dump(cfg, s_table)
    assert run_cli("verify", "--config", str(cfg), "--epoch", "0") == (0, "epoch 0: every chunk matches its checksum\n")
    epoch = tmp_path / "store.zarr" / "epoch-00000"
    shard = epoch / "v" / "c" / "1" / "0"
    data = bytearray(shard.read_bytes())
    data[SIZE * 4 + 5] ^= 0x01  # a byte of batch 5 (the second batch of shard 1)
    shard.write_bytes(bytes(data))
    (epoch / "keys" / "c" / "0" / "0" / "0").unlink()  # the keys of batches 0 and 1 (128 bytes each)
    code, out = run_cli("verify", "--config", str(cfg), "--epoch", "0")
    assert code == 1
    lines = out.splitlines()
    assert "v batch 5: checksum mismatch" in lines
    assert "keys batch 0: missing (epoch-00000/keys/c/0/0/0)" in lines
    assert "keys batch 1: missing (epoch-00000/keys/c/0/0/0)" in lines
    assert lines[-1] == "Error: epoch 0: 3 corrupt or missing chunk(s)"


def test_prune_removes_old_epochs_and_keeps_partials_unless_told(s_table: str, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    for e in range(3):
        dump(cfg, s_table, epoch=e)
    store = tmp_path / "store.zarr"
    partial = store / ".pgprefetch" / "partial" / "epoch-00007"
    partial.mkdir(parents=True)
    EpochDataset(store, epoch=2)
    assert run_cli("prune", "--config", str(cfg), "--keep", "1") == (
        0,
        "deleted epoch 0 (complete, more than 1 behind the slowest consumer, default at epoch 2)\n"
        "kept partial epoch 7: the next dump of each resumes it (delete them with --partials)\n",
    )
    assert sorted(p.name for p in store.glob("epoch-*")) == ["epoch-00001", "epoch-00002"]
    assert partial.exists()
    assert run_cli("prune", "--config", str(cfg), "--keep", "1", "--partials-older-than", "1h") == (
        0,
        "kept partial epoch 7: the next dump of each resumes it (delete them with --partials)\n",
    )
    old = time.time() - 2 * 3600
    os.utime(partial, (old, old))
    code, out = run_cli("prune", "--config", str(cfg), "--keep", "1", "--partials-older-than", "1h", "--dry-run")
    assert (code, out) == (0, "would delete partial epoch 7 (no dump is writing them)\n")
    assert partial.exists()
    assert run_cli("prune", "--config", str(cfg), "--keep", "1", "--partials", "--quiet") == (0, "")
    assert not partial.exists()


def test_prune_before_any_reader_says_why_it_kept_the_epochs(s_table: str, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    dump(cfg, s_table, epoch=0)
    dump(cfg, s_table, epoch=1)
    code, out = run_cli("prune", "--config", str(cfg), "--keep", "1")
    assert (code, out) == (
        0,
        "kept epochs 0, 1: no consumer has opened an epoch yet, and prune deletes only epochs behind what the "
        "training runs opened (EpochDataset and EpochStream record it)\n",
    )
    assert sorted(p.name for p in (tmp_path / "store.zarr").glob("epoch-*")) == ["epoch-00000", "epoch-00001"]


def test_prune_json_lists_what_it_did(s_table: str, tmp_path: Path) -> None:
    cfg = config(tmp_path)
    dump(cfg, s_table, epoch=0)
    code, out = run_cli("prune", "--config", str(cfg), "--keep", "0", "--json")
    assert code == 0
    assert json.loads(out) == {"deleted_epochs": [], "deleted_partials": [], "kept_partials": [], "dry_run": False}


def test_prune_never_touches_a_partial_epoch_a_live_dump_holds(s_table: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, slow=True)
    store = tmp_path / "store.zarr"
    proc = start_dump(cfg, s_table)
    try:
        deadline = time.monotonic() + 30
        while journal_lines(store) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        code, out = run_cli("prune", "--config", str(cfg), "--keep", "0", "--partials")
        assert (code, out) == (0, "nothing to delete\n")
    finally:
        proc.kill()
        proc.wait()
    assert (store / ".pgprefetch" / "partial" / "epoch-00000").exists()


def test_two_dumps_of_one_epoch_never_write_together(s_table: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, slow=True)
    store = tmp_path / "store.zarr"
    first = start_dump(cfg, s_table)
    try:
        wait_for(lambda: journal_lines(store) >= 1)
        code, out = run_cli("dump", "--config", str(cfg), "--epoch", "0", "--dsn", s_table)
        assert code == 0
        assert out == f"epoch 0: another dump is writing it ({os.uname().nodename} {first.pid}); skipped\n"
    finally:
        try:
            assert first.wait(60) == 0
        finally:
            first.kill()
    assert (store / "epoch-00000" / "zarr.json").exists()


def test_store_files_follow_a_permissive_umask(s_table: str, tmp_path: Path) -> None:
    old = os.umask(0o002)  # a group-shared store: files 664, folders 775
    try:
        assert run_cli("dump", "--config", str(config(tmp_path)), "--epoch", "0", "--dsn", s_table, "-q") == (0, "")
        EpochDataset(tmp_path / "store.zarr", epoch=0)  # records the consumer
    finally:
        os.umask(old)
    modes = {str(p.relative_to(tmp_path)): oct(p.stat().st_mode & 0o777) for p in (tmp_path / "store.zarr").rglob("*")}
    assert len(modes) > 10
    wrong = {p: m for p, m in modes.items() if m != (oct(0o775) if (tmp_path / p).is_dir() else oct(0o664))}
    assert wrong == {}
