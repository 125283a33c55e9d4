"""The soak's report: what ran, what struck, what it cost the training run; as JSON, as text, as a picture.

``report.json`` holds every figure, ``report.txt`` the summary ``make soak`` prints, and ``timeline.png``
(:mod:`tests.soak.picture`) the run at a glance: whether the dumps kept ahead of the reads through the
faults.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .bed import Bed
from .cron import MOST_ALIVE, Cron
from .picture import draw_timeline
from .schedule import Faults, kinds
from .timeline import Timeline
from .training import Training
from .watch import Watcher

STALL = 0.5  # a wait for a batch longer than this is a stall: the step waited for a dump


@dataclass
class Report:
    """Every figure of one soak."""

    store: str
    seed: int
    seconds: float
    batches_per_epoch: int  # a rank's batches of one epoch
    epochs_published: int
    epochs_read: dict[int, int]  # whole epochs each rank read, checked against clean dumps
    steps: dict[int, int]
    dump_runs: dict[str, int]  # by outcome: wrote, skipped, busy, killed, failed
    dump_runs_by_file: dict[str, int]  # the deployment file whose command line each run ran
    cron_ticks_skipped: int  # ticks that started no run: cron.MOST_ALIVE runs were still going
    resumed_batches: int  # batches kept from a partial epoch a killed run left
    faults: dict[str, tuple[int, int]]  # kind: (struck, scheduled)
    retries: dict[str, int]  # by cause: the dumps' (PostgreSQL) and the S3 proxy's refusals
    training_wait: dict[int, dict[str, float]]  # per rank: seconds waiting, stalls, longest
    training_restarts: int
    memory: dict[int, dict[str, Any]]
    prunes: int
    end: dict[str, Any]
    problems: list[str]  # what did not hold (the soak fails when there is any)
    phases: dict[str, float] = field(default_factory=dict)  # seconds: set up, soak, clean cron run, checks

    @classmethod
    def collect(
        cls,
        bed: Bed,
        timeline: Timeline,
        cron: Cron,
        training: Training,
        watcher: Watcher,
        faults: Faults,
        schedule: list[tuple[float, str]],
        reads: dict[str, Any],
        memory: dict[int, dict[str, Any]],
        end: dict[str, Any],
        seed: int,
        per_epoch: int,
        problems: list[str],
    ) -> Report:
        planned = Counter(name for _, name in schedule)
        struck = Counter(e.kind for e in timeline.of(*planned) if e.detail.get("struck"))
        retries: Counter[str] = Counter()
        resumed = 0
        for run in cron.runs:
            for s in run.summaries:
                retries.update(s.get("retry_causes", {}))
                resumed += s.get("resumed_batches", 0)
        for status, n in bed.s3_faults.refused.items():
            retries[{503: "s3 503 SlowDown", 500: "s3 500 InternalError"}.get(status, "s3 dropped")] += n
        waits = {}
        for r in training.ranks:
            steps = [json.loads(line) for line in r.record.read_text().splitlines() if '"step"' in line]
            w = [s["wait"] for s in steps]
            waits[r.rank] = {
                "seconds": round(sum(w), 2),
                "stalls": sum(x > STALL for x in w),
                "longest": round(max(w, default=0.0), 2),
                "share": round(sum(w) / max(1e-9, timeline.now()), 3),
            }
        return cls(
            store=bed.kind,
            seed=seed,
            seconds=round(timeline.now(), 1),
            batches_per_epoch=per_epoch,
            epochs_published=len(watcher.verified),
            epochs_read=reads["epochs_read"],
            steps=reads["steps"],
            dump_runs=dict(Counter(run.outcome() for run in cron.runs)),
            dump_runs_by_file=dict(Counter(run.source for run in cron.runs)),
            cron_ticks_skipped=cron.skipped_ticks,
            resumed_batches=resumed,
            faults={k: (struck[k], planned[k]) for k in kinds(bed.kind) if k in planned},
            retries=dict(retries),
            training_wait=waits,
            training_restarts=sum(len(r.lives) - 1 for r in training.ranks),
            memory=memory,
            prunes=len(faults.prunes),
            end=end,
            problems=problems,
        )

    def summary(self) -> str:
        """What ``make soak`` prints: a few lines a person reads."""
        faults = ", ".join(f"{k} {s}/{p}" for k, (s, p) in self.faults.items())
        retries = ", ".join(f"{k} {n}" for k, n in sorted(self.retries.items())) or "none"
        runs = ", ".join(f"{k} {n}" for k, n in sorted(self.dump_runs.items()))
        wait = "; ".join(
            f"rank {r}: {w['seconds']:.1f} s ({w['share']:.0%}), {w['stalls']} stalls over {STALL} s, "
            f"longest {w['longest']} s"
            for r, w in self.training_wait.items()
        )
        memory = "; ".join(
            f"rank {r}: {m['early_kib'] / 1024:.0f} -> {m['late_kib'] / 1024:.0f} MiB over epochs "
            f"{m['epochs'][0]}-{m['epochs'][1]}"
            for r, m in self.memory.items()
        )
        return "\n".join(
            [
                f"soak of a {self.store} store, {self.seconds:.0f} s, seed {self.seed} "
                f"({', '.join(f'{k} {v:g} s' for k, v in self.phases.items())})",
                f"epochs: {self.epochs_published} published, read {self.epochs_read} whole per rank "
                f"({self.steps} steps), every batch equal to a clean dump's; each verified as it appeared",
                f"dump runs: {sum(self.dump_runs.values())} ({runs}), {self.cron_ticks_skipped} ticks skipped with "
                f"{MOST_ALIVE} runs going; {self.resumed_batches} batches resumed",
                f"faults struck/scheduled: {faults}",
                f"retries by cause: {retries}",
                f"training waited for batches: {wait}; restarted {self.training_restarts} rank(s)",
                f"reader memory (heap, main + workers): {memory}",
                f"end: the consumer's ranks at {self.end['consumer_epochs']}, store holds {self.end['epochs']}"
                + ("" if self.problems else ", no process, lock, lease, temporary file or partial epoch left"),
                *(f"PROBLEM: {p}" for p in self.problems),
            ]
        )


def write_report(
    report: Report, folder: Path, timeline: Timeline, cron: Cron, training: Training, watcher: Watcher
) -> Path:
    """Write report.json, report.txt and timeline.png into ``folder``; return the picture's path."""
    events = [{"t": round(e.t, 2), "kind": e.kind, **e.detail} for e in timeline.events]
    runs = [
        {"source": r.source, "pid": r.pid, "start": round(r.start, 2), "end": r.end and round(r.end, 2), "rc": r.rc,
         "outcome": r.outcome(), "signalled": r.signalled, "summaries": r.summaries}
        for r in cron.runs
    ]  # fmt: skip
    (folder / "report.json").write_text(
        json.dumps({"report": asdict(report), "events": events, "dump_runs": runs}, indent=1, default=str)
    )
    (folder / "report.txt").write_text(report.summary() + "\n")
    picture = folder / "timeline.png"
    draw_timeline(picture, report, timeline, cron, training, watcher)
    return picture
