"""Cron, as the soak plays it: the deployment files' dump command started every second or two.

Runs overlap when a dump takes longer than the gap, as under cron (or a CronJob with ``concurrencyPolicy:
Allow``); systemd's timer and ``Forbid`` never overlap, so this is the harder case. The three deployment
files hold the same command; each start takes the next file's, so all three are run as written. An S3
store is dumped from two hosts in turn (two staging folders), as a CronJob's pods land on several
machines: one takes over the lease of a dump stalled on the other. Every run's start, end, exit status and
``--json`` summaries are kept for the checks and the report.
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from . import deploy
from .bed import Bed, python
from .timeline import Timeline


@dataclass
class DumpRun:
    """One run of the dump command."""

    source: str  # the deployment file whose command line it ran
    host: int  # the cron host it ran on (an S3 store's staging is per host)
    proc: subprocess.Popen[str]
    start: float
    end: float | None = None
    rc: int | None = None
    signalled: str | None = None  # the fault that struck the process itself (kill -9, SIGTERM, SIGSTOP)
    summaries: list[dict[str, Any]] = field(default_factory=list)  # one per epoch (--json), or an error object
    stderr: str = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.rc is None

    def written(self) -> list[int]:
        """The epochs this run wrote (and published)."""
        return [s["epoch"] for s in self.summaries if s.get("status") == "written"]

    def outcome(self) -> str:
        """In a word, for the timeline: wrote, skipped, busy, killed, failed (or running)."""
        if self.rc is None:
            return "running"
        if self.signalled and self.rc != 0:
            return "killed"
        if self.rc != 0:
            return "failed"
        if self.written():
            return "wrote"
        return "busy" if any(s.get("status") == "busy" for s in self.summaries) else "skipped"


MOST_ALIVE = 4  # runs alive at once, beyond which a tick starts none (see Cron)


class Cron:
    """Starts a dump every ``gap`` seconds (drawn from the range) until stopped.

    A tick that finds ``MOST_ALIVE`` runs still going starts none, and counts it (``skipped_ticks``). Cron
    itself has no such limit, but it starts a run a minute, not every second or two: on a soak's compressed
    clock, runs started regardless pile up faster than 2 cores end them, each slower for the others, until
    every run takes minutes (a first soak did just that, and its dumps lost their leases for want of CPU).
    """

    def __init__(self, bed: Bed, timeline: Timeline, rng: random.Random, gap: tuple[float, float] = (1.0, 2.0)) -> None:
        self.bed = bed
        self.skipped_ticks = 0
        self.timeline = timeline
        self.rng = rng
        self.gap = gap
        self.commands = [
            (source, deploy.substitute(args, config=str(bed.config))) for source, args in deploy.dump_commands().items()
        ]
        self.runs: list[DumpRun] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-cron", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if len(self.running()) < MOST_ALIVE:
                self.launch()
            else:
                self.skipped_ticks += 1
            self._stop.wait(self.rng.uniform(*self.gap))

    def launch(self, host: int | None = None) -> DumpRun:
        """Start one run of the next deployment file's command, on the next host (or ``host``)."""
        source, args = self.commands[len(self.runs) % len(self.commands)]
        host = len(self.runs) % self.bed.hosts if host is None else host
        proc = subprocess.Popen(
            [python(), "-m", "pgprefetch", *args],
            env=self.bed.host_env(host),
            cwd=self.bed.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        run = DumpRun(source, host, proc, self.timeline.now())
        with self._lock:
            self.runs.append(run)
        threading.Thread(target=self._reap, args=(run,), name=f"soak-reap-{proc.pid}", daemon=True).start()
        return run

    def _reap(self, run: DumpRun) -> None:
        out, err = run.proc.communicate()
        run.end = self.timeline.now()
        for line in out.splitlines():
            try:
                run.summaries.append(json.loads(line))
            except ValueError:
                run.summaries.append({"error": f"not JSON: {line}"})
        run.stderr = err[-4000:]
        run.rc = run.proc.returncode
        for epoch in run.written():
            self.timeline.add("written", epoch=epoch, pid=run.pid)

    def running(self, older_than: float = 0.0) -> list[DumpRun]:
        """Runs still going that started at least ``older_than`` seconds ago (past their start-up)."""
        now = self.timeline.now()
        with self._lock:
            return [r for r in self.runs if r.running() and now - r.start >= older_than]

    def stop(self, timeout: float = 120.0) -> None:
        """Start no more runs, and wait for those going to end by themselves."""
        self._stop.set()
        self._thread.join()
        deadline = time.monotonic() + timeout
        for run in list(self.runs):
            run.proc.wait(max(0.1, deadline - time.monotonic()))
        while any(r.rc is None for r in self.runs) and time.monotonic() < deadline:
            time.sleep(0.05)  # the reapers record the end

    def run_once(self) -> list[DumpRun]:
        """One run on each host, one after the other, waited for: the clean cron run at the end."""
        runs = []
        for host in range(self.bed.hosts):
            run = self.launch(host)
            run.proc.wait(300)
            while run.rc is None:
                time.sleep(0.05)
            runs.append(run)
        return runs
