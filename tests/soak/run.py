"""One soak of one store: cron dumping ahead, two training ranks reading, faults on a schedule; then the checks.

The order at the end matters: the faults stop, the ranks are stopped (SIGTERM: each saves its position),
cron's runs end by themselves, then one clean cron run, and only then is the store checked: what a cron
host looks like once training has ended and the next minute's run has gone by.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import deploy
from .bed import ROWS, Bed, soak_bed
from .check import check_end_state, check_memory, check_reads, memory
from .cron import Cron
from .report import Report, write_report
from .schedule import Faults, draw
from .timeline import Timeline
from .training import Training
from .watch import CONSUMER, Watcher


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """This process's environment with ``values`` set (the soak's own view of an S3 store), restored after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def option(args: list[str], flag: str) -> int:
    return int(args[args.index(flag) + 1])


def run_soak(kind: str, seconds: float, out: Path, seed: int, *, min_epochs: int = 3) -> Report:
    """Soak a ``kind`` store (local or s3) for ``seconds``, in ``out``; assert what must hold; report.

    ``min_epochs``: each rank must have read at least this many whole epochs, or the soak proved little.
    """
    shutil.rmtree(out, ignore_errors=True)
    rng = random.Random(seed)
    with soak_bed(kind, out) as bed, environment(bed.check_env()):
        timeline = Timeline()
        cron, training, watcher = Cron(bed, timeline, rng), Training(bed, timeline), Watcher(bed, timeline)
        faults = Faults(bed, timeline, cron, training, rng)
        schedule = draw(kind, seconds, rng)
        try:
            cron.start()
            watcher.start()
            training.start()
            faults.start(schedule)
            _soak(bed, timeline, training, seconds)
        finally:
            faults.stop()
            stopped = training.stop()
            cron.stop()
        clean = cron.run_once()
        watcher.stop()
        return _check_and_report(bed, timeline, cron, training, watcher, faults, schedule, stopped, clean, seed)


def _soak(bed: Bed, timeline: Timeline, training: Training, seconds: float) -> None:
    """Let it run; a rank that ends by itself (it timed out waiting, or crashed) ends the soak at once."""
    while timeline.now() < seconds:
        for r in training.ranks:
            code = r.proc.poll()
            assert code is None, f"rank {r.rank} exited with {code}: {r.log.read_text()[-3000:]}"
        time.sleep(0.25)


def _check_and_report(
    bed: Bed,
    timeline: Timeline,
    cron: Cron,
    training: Training,
    watcher: Watcher,
    faults: Faults,
    schedule: list[tuple[float, str]],
    stopped: dict[int, int | None],
    clean: Any,
    seed: int,
) -> Report:
    args = deploy.dump_commands()["crontab"]
    ahead, keep = option(args, "--ahead"), option(args, "--keep")
    records = {r.rank: r.record for r in training.ranks}
    per_epoch = ROWS // 64 // training.world
    assert all(code == 0 for code in stopped.values()), f"ranks stopped with {stopped}"
    assert clean.rc == 0, f"the clean cron run failed ({clean.rc}): {clean.stderr}"
    reads = check_reads(records, per_epoch, bed, training.world)
    mem = memory(records)
    end = check_end_state(bed, ahead, keep, CONSUMER)
    report = Report.collect(
        bed, timeline, cron, training, watcher, faults, schedule, reads, mem, end, seed, per_epoch
    )
    write_report(report, bed.root, timeline, cron, training, watcher)
    # The rest is asserted after the report is written, so a failing soak still leaves its picture.
    assert not watcher.half_published(), f"epochs visible as complete but not whole: {watcher.half_published()}"
    unfaulted = [r for r in cron.runs if not r.signalled and r.rc != 0]
    assert not unfaulted, "dump runs no fault struck failed: " + "; ".join(
        f"pid {r.pid} exit {r.rc}: {r.stderr.strip().splitlines()[-1:] or r.summaries}" for r in unfaulted
    )
    bad_prunes = [p for p in faults.prunes if p.returncode != 0]
    assert not bad_prunes, f"prunes by hand failed: {[p.stderr for p in bad_prunes]}"
    assert min(reads["epochs_read"].values()) >= 3, f"the ranks read too little to prove anything: {reads}"
    check_memory(mem, min_epochs=6)
    struck = {kind: n for kind, (_, n) in report.faults.items()}
    assert all(struck.values()), f"faults that never struck: {[k for k, n in struck.items() if not n]}"
    return report
