"""Cron-style operation, interrupted: ``kill -9``, Ctrl-C and SIGTERM, a damaged or cut journal, a failed
publish; nothing is published short, and the next dump resumes to the bytes of a clean one.

Dumps of ``s`` (the ``s_table`` fixture), slowed where a signal must land mid-dump; the killed ones run as
processes of their own (tests/harness/dumps.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from pgprefetch import load_config
from pgprefetch.errors import StoreError
from pgprefetch.store.layout import ArrayLayout
from pgprefetch.write.pipeline import dump_epoch

from .harness.configs import operations_config as config
from .harness.configs import s_config
from .harness.db import S_ROWS, execute
from .harness.dumps import (
    StopAfter,
    chunk_bytes,
    dump,
    dump_argv,
    journal_lines,
    kill_9_after,
    kill_9_mid_dump,
    run_cli,
    wait_for,
)


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
def test_ctrl_c_and_sigterm_stop_at_once_and_leave_a_resumable_epoch(
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
    victim.send_signal(sig)
    at_signal = journal_lines(store)
    _, err = victim.communicate(timeout=10)
    assert victim.returncode == code
    assert journal_lines(store) - at_signal <= 2  # at once: the units in flight (2 connections), no new one
    assert err.strip().splitlines()[-1] == line
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
        os.kill(pid, signal.SIGTERM)
        at_signal = journal_lines(store)
        assert shell.wait(10) == 143  # bash passes the dump's status on
        assert journal_lines(store) - at_signal <= 2  # at once: the units in flight, no new one
    finally:
        shell.kill()
        _, err = shell.communicate()  # reaped, its pipes closed
    # Said by the dump itself: killed by the signal, it would print nothing (and bash would say 143 too).
    assert err.strip().splitlines()[-1] == "Terminated."
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


def test_a_publish_that_failed_is_done_by_the_next_dump(
    s_table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import pgprefetch.store.local

    real, calls = pgprefetch.store.local.publish_epoch, []

    def full_disk_once(*args: object) -> None:  # the disk fills up at the very last step, once
        calls.append(args)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(*args)

    monkeypatch.setattr(pgprefetch.store.local, "publish_epoch", full_disk_once)
    cfg = config(tmp_path)
    with pytest.raises(StoreError, match="free some space and run the dump again"):
        dump(cfg, s_table)
    result = dump(cfg, s_table)  # the epoch's checksums array is there already: written again
    assert result.resumed == result.n_batches
    clean = dump(config(tmp_path, name="clean.toml", store="clean.zarr"), s_table)
    assert chunk_bytes(result.path) == chunk_bytes(clean.path)
