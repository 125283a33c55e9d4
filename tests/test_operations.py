"""Cron-style operation: --ahead/--keep, ls, verify, prune, one writer per epoch, kill -9, Ctrl-C."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import pgprefetch.write.files.shardfiles
from pgprefetch import EpochDataset, EpochStream, load_config
from pgprefetch.cli import cli
from pgprefetch.errors import StoreError
from pgprefetch.store.layout import ArrayLayout
from pgprefetch.write.pipeline import dump_epoch

from .harness.configs import operations_config as config
from .harness.configs import s_config
from .harness.db import S_ROWS, execute
from .harness.dumps import (
    chunk_bytes,
    dump,
    dump_argv,
    journal_lines,
    kill_9_after,
    kill_9_mid_dump,
    start_dump,
    wait_for,
)

SIZE = 16  # 30 batches


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


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
    assert out.splitlines()[-1] == "deleted epochs 0, 1 (complete, more than 1 behind the slowest consumer)"
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
    assert (done.returncode, json.loads(done.stdout)) == (0, {"epochs": []})


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
        "deleted epoch 0 (complete, more than 1 behind the slowest consumer)\n"
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


@pytest.mark.parametrize("kill_after", [0, 1, 12])
def test_kill_9_then_resume_gives_the_same_bytes_as_a_clean_dump(s_table: str, tmp_path: Path, kill_after: int) -> None:
    cfg = config(tmp_path, slow=True)
    store = tmp_path / "store.zarr"
    if kill_after == 0:  # before its first batch: it holds the epoch's lock
        kill_9_mid_dump(cfg, s_table, lambda: (store / ".pgprefetch" / "locks" / "epoch-00000.lock").exists())
    else:
        kill_9_after(cfg, s_table, store, kill_after)
    assert not (store / "epoch-00000").exists()  # nothing published
    resumed = dump(cfg, s_table)
    if kill_after > 1:
        assert resumed.resumed >= kill_after - 1
    clean = dump(config(tmp_path, slow=True, name="clean.toml", store="clean.zarr"), s_table)
    assert chunk_bytes(resumed.path) == chunk_bytes(clean.path)
    assert not (store / ".pgprefetch" / "partial" / "epoch-00000").exists()


def test_changed_keys_after_a_crash_restart_the_epoch(s_table: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, slow=True)
    store = tmp_path / "store.zarr"
    kill_9_after(cfg, s_table, store)
    execute(s_table, f"INSERT INTO s SELECT i, i * 0.5 FROM generate_series({S_ROWS + 1}, {S_ROWS + 16}) i")
    result = dump(cfg, s_table)
    assert result.restarted == f"the keys changed ({S_ROWS} keys then, {S_ROWS + 16} now)"
    assert result.resumed == 0
    assert result.n_samples == S_ROWS + 16


@pytest.mark.parametrize(
    ("sig", "code", "line"), [(signal.SIGINT, 130, "Interrupted."), (signal.SIGTERM, 143, "Terminated.")]
)
def test_ctrl_c_and_sigterm_stop_within_a_second_and_leave_a_resumable_epoch(
    s_table: str, tmp_path: Path, sig: signal.Signals, code: int, line: str
) -> None:
    cfg = config(tmp_path, slow=True)
    store = tmp_path / "store.zarr"
    # Started as a terminal's foreground job is, SIGINT at its default: a suite run from a script's background
    # job inherits SIGINT ignored, and so would the dump (that case is the next test's).
    victim = subprocess.Popen(
        dump_argv(cfg, s_table),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    wait_for(lambda: journal_lines(store) >= 2)
    sent = time.monotonic()
    victim.send_signal(sig)
    assert victim.wait(10) == code
    assert time.monotonic() - sent < 1.5
    assert victim.stderr is not None
    assert victim.stderr.read().strip().splitlines()[-1] == line
    assert not (store / "epoch-00000").exists()
    assert journal_lines(store) >= 2
    assert dump(cfg, s_table).resumed >= 2


def ignored_signals(pid: int) -> int:
    """The mask of signals process ``pid`` ignores (bit ``n - 1`` for signal ``n``), from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)


def test_sigterm_stops_a_dump_a_script_started_in_the_background(s_table: str, tmp_path: Path) -> None:
    """``pgprefetch dump ... &`` in a script (or nohup, or a scheduler) starts with SIGINT ignored."""
    cfg = config(tmp_path, slow=True)
    store = tmp_path / "store.zarr"
    script = '"$@" & echo $!; wait $!'  # no job control: the background job inherits SIGINT ignored
    shell = subprocess.Popen(
        ["bash", "-c", script, "bash", *dump_argv(cfg, s_table)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert shell.stdout is not None
    assert shell.stderr is not None
    pid = int(shell.stdout.readline())
    try:
        wait_for(lambda: journal_lines(store) >= 2)
        assert ignored_signals(pid) & (1 << (signal.SIGINT - 1)), "the dump must start with SIGINT ignored"
        sent = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        assert shell.wait(10) == 143  # bash passes the dump's status on
        assert time.monotonic() - sent < 1.5
    finally:
        shell.kill()
        shell.wait()
    # Said by the dump itself: killed by the signal, it would print nothing (and bash would say 143 too).
    assert shell.stderr.read().strip().splitlines()[-1] == "Terminated."
    assert not (store / "epoch-00000").exists()
    assert journal_lines(store) >= 2
    resumed = dump(cfg, s_table)
    assert resumed.resumed >= 2
    clean = dump(config(tmp_path, name="clean.toml", store="clean.zarr"), s_table)
    assert chunk_bytes(resumed.path) == chunk_bytes(clean.path)


def test_resumed_epoch_lists_both_snapshots_and_force_starts_over(s_table: str, tmp_path: Path) -> None:
    cfg = config(tmp_path, slow=True)
    store = tmp_path / "store.zarr"

    def crash(epoch: int) -> None:
        kill_9_after(cfg, s_table, store, epoch=epoch)

    crash(0)
    resumed = dump(cfg, s_table)
    manifest = json.loads((resumed.path / "zarr.json").read_text())["attributes"]["pgprefetch"]
    assert resumed.resumed >= 3
    assert len(manifest["snapshots"]) == 2  # batches kept from the first dump, the rest from the second
    crash(1)
    forced = dump(cfg, s_table, epoch=1, force=True)
    manifest = json.loads((forced.path / "zarr.json").read_text())["attributes"]["pgprefetch"]
    assert forced.resumed == 0
    assert len(manifest["snapshots"]) == 1  # --force: the whole epoch from one snapshot


def damage_partial_epoch(store: Path) -> int:
    """Damage a killed dump's partial epoch four ways; return how many journaled batches are still intact.

    The first journaled batch gets a flipped byte in its data; a middle one loses its journal line (its data
    stays: written, not journaled); the last journal line is cut short mid-number, its tail NUL bytes and
    no newline, as a crash on a journaling filesystem can leave it; and a chunk write killed before zarr
    renamed its temporary file leaves that file.
    """
    journal = store / ".pgprefetch" / "partial" / "epoch-00000.journal"
    lines = journal.read_text().splitlines()
    batch_lines = [i for i, line in enumerate(lines) if i > 0 and not line.startswith("#")]
    assert len(batch_lines) >= 6, lines
    flipped, dropped, cut = batch_lines[0], batch_lines[len(batch_lines) // 2], batch_lines[-1]
    assert cut == len(lines) - 1  # the journal ends with a batch line

    layout = ArrayLayout.read(store / ".pgprefetch" / "partial" / "epoch-00000" / "v")
    path, slot = layout.file(int(lines[flipped].split()[0]))
    data = bytearray(path.read_bytes())
    data[slot * layout.batch_bytes + 5 if layout.raw else len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    path.with_name(f"{path.name}.{'0' * 32}.partial").write_bytes(bytes(data[:100]))  # zarr's temporary name

    batch, crc_v, crc_keys = lines[cut].split()
    lines[cut] = f"{batch} {crc_v} {crc_keys[: len(crc_keys) // 2]}\0\0\0"
    del lines[dropped]
    journal.write_text("\n".join(lines))  # no newline after the cut line
    return len(batch_lines) - 3


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_resume_refetches_exactly_the_damaged_batches_and_equals_a_clean_dump(
    s_table: str, tmp_path: Path, compression: str
) -> None:
    # Each sample sleeps pace.seconds: 15 ms while the victim runs (about 4 s for the epoch, so the kill
    # lands mid-way), nothing for the resume. The config stays the same, so the resume is allowed.
    execute(s_table, "CREATE TABLE pace (seconds float8)", "INSERT INTO pace VALUES (0.015)")
    query = "SELECT v, pg_sleep(pace.seconds) FROM s, pace WHERE id = $1"
    cfg = s_config(tmp_path, query=query, compression=compression)
    store = tmp_path / "store.zarr"
    kill_9_after(cfg, s_table, store, 8)
    assert not (store / "epoch-00000").exists()
    intact = damage_partial_epoch(store)
    execute(s_table, "UPDATE pace SET seconds = 0")
    code, out = run_cli("dump", "--config", str(cfg), "--epoch", "0", "--dsn", s_table, "--json")
    assert code == 0, out
    summary = json.loads(out.splitlines()[-1])
    assert summary["status"] == "written"
    assert summary["resumed_batches"] == intact  # the flipped, the unjournaled and the cut batch are refetched
    clean = dump(s_config(tmp_path, name="clean.toml", store="clean.zarr", compression=compression), s_table)
    resumed = Path(summary["path"])
    assert chunk_bytes(resumed) == chunk_bytes(clean.path)
    checksums = [
        json.loads((p / "zarr.json").read_text())["attributes"]["pgprefetch"]["checksums"]
        for p in (resumed, clean.path)
    ]
    assert checksums[0] == checksums[1]


class StopAfter:
    """A progress hook that fails the dump after ``batches`` writes (an interrupted dump).

    A write is a unit of batches: one batch each only when fetching a batch is slow (``slow=True``).
    """

    def __init__(self, batches: int) -> None:
        self.left = batches

    def start(self, epoch: int, n_samples: int) -> None: ...
    def close(self) -> None: ...
    def advance(self, samples: int, nbytes: int) -> None:
        if nbytes:
            self.left -= 1
            if self.left == 0:
                raise RuntimeError("interrupted")


def test_a_cut_journal_line_loses_no_snapshot_of_a_later_resume(s_table: str, tmp_path: Path) -> None:
    cfg = load_config(s_config(tmp_path, connections=1, slow=True), dsn=s_table)  # slow: units of one batch
    journal = tmp_path / "store.zarr" / ".pgprefetch" / "partial" / "epoch-00000.journal"
    for _ in range(2):
        with pytest.raises(RuntimeError, match="interrupted"):
            asyncio.run(dump_epoch(cfg, 0, progress=StopAfter(4)))  # type: ignore[arg-type]
        journal.write_text(journal.read_text()[:-5])  # the last journal line cut short, no newline
    result = asyncio.run(dump_epoch(cfg, 0))
    manifest = json.loads((result.path / "zarr.json").read_text())["attributes"]["pgprefetch"]
    assert result.resumed == 6  # 4 + 4 batches written, the two cut short fetched again
    assert len(set(manifest["snapshots"])) == 3  # batches of all three dumps, each dump's snapshot listed


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


def test_a_publish_that_failed_is_done_by_the_next_dump(
    s_table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import pgprefetch.store.local

    real, calls = pgprefetch.store.local.publish_epoch, []

    def full_disk_once(partial: Path, final: Path) -> Path:  # the disk fills up at the very last step, once
        calls.append(partial)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(partial, final)

    monkeypatch.setattr(pgprefetch.store.local, "publish_epoch", full_disk_once)
    cfg = config(tmp_path)
    with pytest.raises(StoreError, match="free some space and run the dump again"):
        dump(cfg, s_table)
    result = dump(cfg, s_table)  # the epoch's checksums array is there already: written again
    assert result.resumed == result.n_batches
    clean = dump(config(tmp_path, name="clean.toml", store="clean.zarr"), s_table)
    assert chunk_bytes(result.path) == chunk_bytes(clean.path)
