"""The soak's faults: which, and when, drawn from its seed; each struck as the real thing would strike.

A dump process is killed (``kill -9``) or stopped (SIGTERM) mid-run; the database's connections are ended
(``pg_terminate_backend``), its route frozen (the chaos bed's proxy) or the server restarted; the training
ranks are killed with their workers and started again; the crontab's prune runs by hand. On S3, requests
are refused (their connection dropped unanswered, as by a restarting server) or throttled (503 SlowDown)
for a few seconds, and a dump holding a lease
is stopped (SIGSTOP) past its lease's expiry, so that another takes the epoch over. Each fault is recorded
with whether it struck something (a dump running, connections open).
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..harness.faults import kill_every_connection, restart_server
from . import deploy
from .bed import LEASE_SECONDS, Bed, python
from .cron import Cron, DumpRun
from .timeline import Timeline
from .training import Training

BOTH = ("dump kill -9", "dump SIGTERM", "pg terminate", "pg freeze", "pg restart", "training kill -9", "prune by hand")
S3_ONLY = ("s3 throttled", "s3 refused", "lease expired")
STARTED = 1.0  # seconds a dump has run before it is a target: past its imports, in the epoch's work


def kinds(store: str, short: bool = False) -> tuple[str, ...]:
    """The faults a soak of ``store`` (local or s3) strikes; a short round of an S3 store, only its own few.

    (A short round is half a minute on 2 cores: a training restart there, with its workers started anew over
    S3, would take most of it. The local round has it, and ``make soak`` every kind on both stores.)
    """
    if short and store == "s3":
        return (*S3_ONLY, "dump kill -9", "prune by hand")
    return BOTH + (S3_ONLY if store == "s3" else ())


def draw(kinds: tuple[str, ...], seconds: float, rng: random.Random, start: float = 5.0) -> list[tuple[float, str]]:
    """The schedule: every kind once in a shuffled first round, then kinds at random, evenly spread in time.

    The last tenth of the run (at least 8 s) is left quiet, so the ranks read the last epochs cleanly.
    """
    every = list(kinds)
    rng.shuffle(every)
    end = seconds - max(8.0, seconds / 10)
    gap = max(2.5, min(12.0, (end - start) / len(every)))
    n = max(len(every), int((end - start) / gap))
    names = every + [rng.choice(kinds) for _ in range(n - len(every))]
    return [(start + i * gap + rng.uniform(0, gap * 0.5), name) for i, name in enumerate(names)]


class Faults:
    """Strikes the schedule's faults from a thread of its own, recording each in the timeline."""

    def __init__(self, bed: Bed, timeline: Timeline, cron: Cron, training: Training, rng: random.Random) -> None:
        self.bed, self.timeline, self.cron, self.training, self.rng = bed, timeline, cron, training, rng
        self.prunes: list[subprocess.CompletedProcess[str]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._threads: list[threading.Thread] = []
        self._choosing = threading.Lock()
        self.strike: dict[str, Callable[[], dict[str, Any]]] = {
            "dump kill -9": lambda: self._signal_dump(signal.SIGKILL, "kill -9"),
            "dump SIGTERM": lambda: self._signal_dump(signal.SIGTERM, "SIGTERM"),
            "pg terminate": self._terminate,
            "pg freeze": self._freeze,
            "pg restart": self._restart,
            "training kill -9": training.kill_and_restart,
            "prune by hand": self._prune,
            "s3 throttled": lambda: self._s3_window(503),
            "s3 refused": lambda: self._s3_window(0),
            "lease expired": self._expire_lease,
        }

    def start(self, schedule: list[tuple[float, str]]) -> None:
        self._thread = threading.Thread(target=self._run, args=(schedule,), name="soak-faults", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, schedule: list[tuple[float, str]]) -> None:
        """Each fault on a thread of its own at its moment: one that lasts (a window, a stopped dump) delays none."""
        for at, name in schedule:
            if self._stop.wait(max(0.0, at - self.timeline.now())):
                break
            thread = threading.Thread(target=self._one, args=(at, name), name=f"soak-fault-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        for thread in self._threads:
            thread.join()

    def _one(self, at: float, name: str) -> None:
        started = self.timeline.now()
        try:
            detail = self.strike[name]()
        except Exception as e:  # a fault that could not be struck is a finding, not a crash of the soak
            detail = {"struck": False, "error": f"{type(e).__name__}: {e}"}
        self.timeline.add(name, at=round(started, 2), took=round(self.timeline.now() - started, 2), **detail)

    def _target(self, wait: float = 15.0, anyone: float = 0.2, claim: bool = True) -> tuple[DumpRun, bool] | None:
        """A dump to strike, and whether it is writing an epoch (it holds the epoch's lock or lease).

        Mostly one that writes, waiting for one up to ``wait`` seconds; with odds ``anyone``, or when none
        comes, any run past its start-up (one planning, or pruning). None if there is no run at all.
        ``claim``: the run is the caller's to signal, and no other fault's.
        """
        deadline = time.monotonic() + (wait if self.rng.random() >= anyone else 0.0)
        while not self._stop.is_set():
            with self._choosing:  # two faults never pick one run
                runs = [r for r in self.cron.running(older_than=STARTED) if not r.signalled]
                writing = [r for r in runs if r.pid in writers(self.bed)]
                pick = (self.rng.choice(writing), True) if writing else None
                if pick is None and time.monotonic() > deadline:
                    pick = (self.rng.choice(runs), False) if runs else None
                    if pick is None:
                        return None
                if pick is not None:
                    if claim:
                        pick[0].signalled = "chosen"  # named by the fault that strikes it
                    return pick
            time.sleep(0.3)
        return None

    def _signal_dump(self, sig: signal.Signals, name: str) -> dict[str, Any]:
        target = self._target()
        if target is None:
            return {"struck": False}
        run, writing = target
        run.signalled = name
        run.proc.send_signal(sig)
        return {"struck": True, "pid": run.pid, "writing": writing}

    def _terminate(self) -> dict[str, Any]:
        writing = self._writing()  # while a dump writes: its connections are open
        kill_every_connection(self.bed.direct)
        return {"struck": writing}

    def _writing(self) -> bool:
        """Wait for a dump that writes an epoch (up to a few seconds); whether one came."""
        target = self._target(anyone=0.0, claim=False)
        return target is not None and target[1]

    def _freeze(self) -> dict[str, Any]:
        """Freeze the route of a writing dump's connections (a dump between retries has none: wait for it)."""
        deadline = time.monotonic() + 15.0
        while not self._stop.is_set():
            frozen = self.bed.proxy.freeze() if self._writing() else 0
            if frozen or time.monotonic() > deadline:
                return {"struck": frozen > 0, "connections": frozen}
            time.sleep(0.3)
        return {"struck": False}

    def _restart(self) -> dict[str, Any]:
        writing = self._writing()
        restart_server(self.bed.pgdata)
        return {"struck": writing}

    def _prune(self) -> dict[str, Any]:
        """The crontab's prune, or an operator's harsher one by hand (``--partials``: resumable work too)."""
        args = deploy.substitute(deploy.prune_command(), config=str(self.bed.config))
        if self.rng.random() < 0.5:
            at = args.index("--partials-older-than")
            args = [*args[:at], "--partials", *args[at + 2 :]]
        done = subprocess.run(
            [python(), "-m", "pgprefetch", *args], env=self.bed.env, capture_output=True, text=True, check=False
        )
        self.prunes.append(done)
        return {"struck": True, "rc": done.returncode, "partials": "--partials" in args, "err": done.stderr[-300:]}

    def _s3_window(self, status: int) -> dict[str, Any]:
        """S3 requests refused for 2-5 s (a share of them): ``status`` 503 (SlowDown), or 0 (the connection dropped).

        The window stays open (up to 15 s) until it has refused something: the processes may all be starting.
        """
        seconds = self.rng.uniform(2.0, 5.0)
        before = self.bed.s3_faults.refused[status]
        self.bed.s3_faults.status = status
        started = time.monotonic()
        try:
            self._stop.wait(seconds)
            while self.bed.s3_faults.refused[status] == before and time.monotonic() - started < 15:
                if self._stop.wait(0.2):
                    break
        finally:
            self.bed.s3_faults.status = None
        seconds = time.monotonic() - started
        refused = self.bed.s3_faults.refused[status] - before
        return {"struck": refused > 0, "seconds": round(seconds, 2), "refused": refused}

    def _expire_lease(self) -> dict[str, Any]:
        """SIGSTOP a dump that holds a lease until the lease expires, then SIGCONT: it must publish nothing."""
        target = self._target(wait=30.0, anyone=0.0)
        if target is None or not target[1]:
            return {"struck": False}
        holder = target[0]
        holder.signalled = "SIGSTOP past its lease"
        holder.proc.send_signal(signal.SIGSTOP)
        self._stop.wait(LEASE_SECONDS + 3)
        holder.proc.send_signal(signal.SIGCONT)
        return {"struck": True, "pid": holder.pid}


def writers(bed: Bed) -> set[int]:
    """The pids of the dumps writing an epoch now: holders of an epoch's lock (local) or lease (S3)."""
    from pgprefetch.store.lease import lease_holder
    from pgprefetch.store.open import open_store

    if bed.kind == "local":
        locks = Path(bed.store) / ".pgprefetch" / "locks"
        inodes = {p.stat().st_ino for p in locks.glob("epoch-*.lock")} if locks.is_dir() else set()
        held = set()
        for line in Path("/proc/locks").read_text().splitlines():  # "1: FLOCK ADVISORY WRITE pid maj:min:inode ..."
            fields = line.split()
            if len(fields) > 5 and fields[1] == "FLOCK" and int(fields[5].rsplit(":", 1)[1]) in inodes:
                held.add(int(fields[4]))
        return held
    store: Any = open_store(bed.store)
    holders = (lease_holder(store.client, m["path"]).rsplit(" ", 1)[-1] for m in store._list(".pgprefetch/locks"))
    return {int(pid) for pid in holders if pid.isdigit()}
