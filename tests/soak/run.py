"""One soak of one store: cron dumping ahead, two training ranks reading, faults on a schedule; then the checks.

The order at the end matters: the faults stop, the ranks are stopped (SIGTERM: each saves its position)
while cron's runs end by themselves (a rank's DataLoader takes seconds to end its workers), then one clean
cron run, and only then is the store checked: what a cron host looks like once training has ended and the
next minute's run has gone by.
"""

from __future__ import annotations

import random
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..harness.s3 import environment
from . import deploy
from .bed import BATCH, ROWS, Bed, soak_bed
from .check import check_end_state, check_memory, check_reads, memory, stuck_ranks
from .cron import Cron, DumpRun
from .report import Report, write_report
from .schedule import Faults, draw, kinds
from .timeline import Timeline
from .training import Training, saved_steps
from .watch import CONSUMER, Watcher


def option(args: list[str], flag: str) -> int:
    return int(args[args.index(flag) + 1])


def run_soak(kind: str, seconds: float, out: Path, seed: int, *, min_epochs: int = 3, short: bool = False) -> Report:
    """Soak a ``kind`` store (local or s3) for ``seconds``, in ``out``; assert what must hold; report.

    ``min_epochs``: each rank must have read at least this many whole epochs, or the soak proved little.
    ``short``: a short round (``make test``), with fewer kinds of fault on S3 (:func:`schedule.kinds`).
    """
    shutil.rmtree(out, ignore_errors=True)
    rng = random.Random(seed)
    began = time.monotonic()
    with soak_bed(kind, out) as bed, environment(bed.check_env()):
        timeline = Timeline()
        timeline.add("set up", seconds=round(time.monotonic() - began, 1))
        cron, training, watcher = Cron(bed, timeline, rng), Training(bed, timeline), Watcher(bed, timeline)
        faults = Faults(bed, timeline, cron, training, rng)
        schedule = draw(kinds(kind, short), seconds, rng)
        try:
            cron.start()
            watcher.start()
            training.start()
            faults.start(schedule)
            died = _soak(timeline, training, seconds)
        finally:
            faults.stop()
            with ThreadPoolExecutor(1) as winding:  # cron's runs end by themselves while the ranks stop
                crons_ended = winding.submit(cron.stop)
                stopped = training.stop()
                crons_ended.result()
        timeline.add("wound down")
        clean = cron.run_once()  # one run on each host
        watcher.stop()
        timeline.add("clean cron run")
        problems = [died] if died else []
        return _check_and_report(
            bed, timeline, cron, training, watcher, faults, schedule, stopped, clean, seed, problems, min_epochs, short
        )


ENVIRONMENT = ("pg terminate", "pg freeze", "pg restart", "s3 throttled", "s3 refused")  # faults around a dump


def struck_by(run: DumpRun, timeline: Timeline) -> list[str]:
    """The faults of the dump's surroundings (database, object store) that came while ``run`` ran."""
    end = run.end if run.end is not None else timeline.now()
    return [e.kind for e in timeline.of(*ENVIRONMENT) if e.detail.get("at", e.t) <= end and e.t >= run.start]


def _soak(timeline: Timeline, training: Training, seconds: float) -> str | None:
    """Let it run; a rank that ends by itself (it timed out waiting, or crashed) ends the soak at once."""
    while timeline.now() < seconds:
        ended = training.ended_by_itself()
        if ended is not None:
            return ended
        time.sleep(0.25)
    return None


def _check_and_report(
    bed: Bed,
    timeline: Timeline,
    cron: Cron,
    training: Training,
    watcher: Watcher,
    faults: Faults,
    schedule: list[tuple[float, str]],
    stopped: dict[int, int | None],
    clean: list[DumpRun],
    seed: int,
    problems: list[str],
    min_epochs: int,
    short: bool,
) -> Report:
    """Check everything, write the report and the picture, then fail with every problem found, if any."""
    args = deploy.dump_commands()["crontab"]
    ahead, keep = option(args, "--ahead"), option(args, "--keep")
    records = {r.rank: r.record for r in training.ranks}
    per_epoch = ROWS // BATCH // training.world
    problems += _stop_problems(training, stopped)
    for run in clean:
        if run.rc != 0:
            problems.append(f"the clean cron run failed ({run.rc}): {run.summaries} {run.stderr[-1000:]}")
    reads, found = check_reads(records, per_epoch, bed, training.world)
    problems += found
    (began,), (stop,) = timeline.of("training started"), timeline.of("training stopped")
    problems += stuck_ranks(records, began.detail["wall"], stop.detail["wall"], per_epoch)
    if min(reads["epochs_read"].values()) < min_epochs:
        problems.append(f"the ranks read fewer than {min_epochs} whole epochs, which proves little: {reads}")
    mem = memory(records)
    problems += check_memory(mem, min_epochs=6)
    end, found = check_end_state(bed, ahead, keep, CONSUMER)
    problems += found
    problems += [f"epoch {e} was visible as complete, but: {p}" for e, p in watcher.half_published().items()]
    problems += _dump_problems(cron, timeline)
    problems += [f"a prune by hand failed ({p.returncode}): {p.stderr.strip()}" for p in faults.prunes if p.returncode]
    report = Report.collect(
        bed, timeline, cron, training, watcher, faults, schedule, reads, mem, end, seed, per_epoch, problems
    )
    missed = [kind for kind, (n, _) in report.faults.items() if not n]
    # Every kind must strike in a soak; a short round of half a minute may end before a fault that waits for a
    # dump to strike finds one (cf. the chaos suite's "most faults must strike"): most must.
    if missed and (not short or len(missed) > 0.3 * len(report.faults)):
        problems += [f"{kind} was scheduled but never struck" for kind in missed]
    timeline.add("checked")
    report.phases = phases(timeline)
    report.problems = problems
    write_report(report, bed.root, timeline, cron, training, watcher)
    assert not problems, "\n".join(problems)
    return report


def phases(timeline: Timeline) -> dict[str, float]:
    """Seconds each phase took: setting up, the soak itself, winding down, the clean run, the checks."""
    at = {e.kind: e.t for e in timeline.of("training started", "wound down", "clean cron run", "checked")}
    (setup,) = timeline.of("set up")
    return {
        "set up": setup.detail["seconds"],
        "soak": round(at["wound down"], 1),
        "clean cron run": round(at["clean cron run"] - at["wound down"], 1),
        "checks": round(at["checked"] - at["clean cron run"], 1),
    }


def _stop_problems(training: Training, stopped: dict[int, int | None]) -> list[str]:
    """A rank stopped by SIGTERM saves its position and exits 0, its last save counting every step it recorded.

    One still starting (importing torch, its handler not yet set) dies of the signal: it had read nothing.
    """
    problems = []
    for r in training.ranks:
        code = stopped[r.rank]
        steps = sum(1 for line in r.record.read_text().splitlines() if '"step"' in line)
        saved = saved_steps(training.state_dir / f"rank-{r.rank}.json")
        if code == 0 and saved != steps:
            problems.append(f"rank {r.rank} exited 0 on SIGTERM, but its last save counts {saved} of {steps} steps")
        elif code not in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
            problems.append(f"rank {r.rank} stopped by SIGTERM exited with {code}: {r.log.read_text()[-1500:]}")
    return problems


def _dump_problems(cron: Cron, timeline: Timeline) -> list[str]:
    """Dump runs that failed with no fault to blame, or whose failure was not one line and exit 1."""
    problems = []
    for r in cron.runs:
        if r.signalled or r.rc == 0:
            continue
        errors = [s["error"] for s in r.summaries if "error" in s]
        if not struck_by(r, timeline):
            problems.append(f"dump pid {r.pid} failed ({r.rc}) with no fault to blame: {errors or r.stderr[-500:]}")
        elif r.rc != 1 or len(errors) != 1 or "\n" in errors[0]:  # a fault may fail a run, in one line (exit 1)
            problems.append(f"dump pid {r.pid} failed ({r.rc}) without its one-line error: {r.stderr[-500:]}")
    return problems
