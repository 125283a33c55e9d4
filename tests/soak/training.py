"""The training run, as the soak plays it: the Kubernetes Job's command line, one process per rank.

Each rank is ``examples/stream_train.py`` as deploy/kubernetes/train-job.yaml runs it, with its rank in
``JOB_COMPLETION_INDEX`` as an Indexed Job gives it, the soak's store and checkpoint folder in place of the
install's, and two additions: ``--record`` (what it read, for the checks) and ``--step-seconds`` (the pace
of a training step). A rank is its own process group with its DataLoader workers, so killing it kills them
all, as a pod's death does; it is started again at once and resumes from its last saved position, as
``restartPolicy: OnFailure`` does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import deploy
from .bed import REPO, Bed, python
from .timeline import Timeline

STEP_SECONDS = 0.15  # a training step: an epoch of 16 batches a rank takes about 2.5 s


@dataclass
class Rank:
    """One rank's process, and every process it has been (restarts included)."""

    rank: int
    proc: subprocess.Popen[bytes]
    record: Path
    log: Path
    lives: list[tuple[int, float, int | None]] = field(default_factory=list)  # (pid, started, exit status)


class Training:
    """The training ranks: started, killed and restarted, stopped with SIGTERM at the end."""

    def __init__(self, bed: Bed, timeline: Timeline, step_seconds: float = STEP_SECONDS) -> None:
        self.bed = bed
        self.timeline = timeline
        self.state_dir = bed.root / "checkpoints"
        args = deploy.substitute(deploy.train_command(), store=bed.store, state_dir=str(self.state_dir))
        self.world = int(args[args.index("--world-size") + 1])
        self.save_every = int(args[args.index("--save-every") + 1])
        self.args = [*args, "--step-seconds", str(step_seconds)]
        self.ranks: list[Rank] = []
        self._lock = threading.Lock()  # held while the ranks are killed and started again

    def start(self) -> None:
        started = time.time()
        (self.bed.root / "logs").mkdir(exist_ok=True)
        for rank in range(self.world):
            record = self.bed.root / f"rank-{rank}.jsonl"
            log = self.bed.root / "logs" / f"rank-{rank}.log"
            self.ranks.append(Rank(rank, self._spawn(rank, record, log), record, log))
            self.ranks[-1].lives.append((self.ranks[-1].proc.pid, self.timeline.now(), None))
        self.timeline.add("training started", world=self.world, wall=started)

    def _spawn(self, rank: int, record: Path, log: Path) -> subprocess.Popen[bytes]:
        with open(log, "ab") as out:
            return subprocess.Popen(
                [python(), str(REPO / self.args[0]), *self.args[1:], "--record", str(record)],
                env={**self.bed.env, "JOB_COMPLETION_INDEX": str(rank)},
                cwd=self.bed.root,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a process group: the rank and its DataLoader workers
            )

    def kill_and_restart(self) -> dict[str, Any]:
        """kill -9 of every rank with its workers (a job's pods dying), then each started again at once."""
        with self._lock:
            return self._kill_and_restart()

    def _kill_and_restart(self) -> dict[str, Any]:
        steps = {}
        for r in self.ranks:
            with_workers = os.getpgid(r.proc.pid)
            os.killpg(with_workers, signal.SIGKILL)
            r.proc.wait(30)
            _wait_group_gone(with_workers)
            r.lives[-1] = (*r.lives[-1][:2], r.proc.returncode)
            steps[r.rank] = saved_steps(self.bed.root / "checkpoints" / f"rank-{r.rank}.json")
        for r in self.ranks:
            r.proc = self._spawn(r.rank, r.record, r.log)
            r.lives.append((r.proc.pid, self.timeline.now(), None))
        return {"struck": True, "resumed_from_step": steps}

    def ended_by_itself(self) -> str | None:
        """What a rank that exited without being told to said last (it timed out waiting, or crashed)."""
        with self._lock:
            for r in self.ranks:
                code = r.proc.poll()
                if code is not None:
                    return f"rank {r.rank} exited with {code}: {r.log.read_text()[-3000:]}"
        return None

    def stop(self, timeout: float = 90.0) -> dict[int, int | None]:
        """SIGTERM to each rank (it saves its position and exits 0); their exit statuses."""
        stopping = time.time()
        for r in self.ranks:
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        out = {}
        for r in self.ranks:
            try:
                out[r.rank] = r.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(os.getpgid(r.proc.pid), signal.SIGKILL)
                out[r.rank] = None
            _wait_group_gone(r.proc.pid)
            r.lives[-1] = (*r.lives[-1][:2], out[r.rank])
        self.timeline.add("training stopped", exit_status=out, wall=stopping)
        return out


def saved_steps(state: Path) -> int | None:
    """The steps a rank's saved position counts (None: nothing saved yet)."""
    try:
        return int(json.loads(state.read_text())["steps"])
    except (OSError, ValueError, KeyError):
        return None


def group_members(group: int) -> list[int]:
    """The live processes of process group ``group`` (zombies left out: dead, waiting to be reaped)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _wait_group_gone(group: int, timeout: float = 30.0) -> None:
    """Wait until no process of ``group`` is left (the DataLoader workers of a killed rank)."""
    deadline = time.monotonic() + timeout
    while group_members(group):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes {group_members(group)} of rank group {group} outlived it by {timeout:g} s")
        time.sleep(0.05)
