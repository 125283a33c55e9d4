"""The soak's timeline as a PNG: did the dumps keep ahead of the reads, through the faults?

Top: epochs over time. The newest published epoch (a step line) and each rank's reading position (an epoch
and the fraction of it read); each fault is a vertical line of its kind's colour. Middle: the dumps' lead,
the epochs published beyond the one each rank reads: at 0 the rank waits (or is about to). Bottom: every
cron run of the dump as a bar from its start to its end, in lanes where runs overlap, coloured by what it
did (wrote an epoch, found nothing to do, found the epoch busy, was killed, failed).
"""

from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # headless: no display, only files
import matplotlib.pyplot as plt

from .cron import Cron
from .schedule import kinds
from .timeline import Timeline
from .training import Training
from .watch import Watcher

if TYPE_CHECKING:
    from .report import Report

OUTCOMES = {"wrote": "#2a9d4b", "skipped": "#c8c8c8", "busy": "#8aa6c1", "killed": "#d62728", "failed": "#000000"}


def draw_timeline(
    path: Path, report: Report, timeline: Timeline, cron: Cron, training: Training, watcher: Watcher, dpi: int = 100
) -> None:
    """Draw the soak into ``path`` (PNG)."""
    fig, (top, middle, bottom) = plt.subplots(
        3, 1, figsize=(11, 6.2), sharex=True, gridspec_kw={"height_ratios": [3, 1, 1.4]}, layout="constrained"
    )
    times = [s.t for s in watcher.samples]
    newest = [s.newest if s.newest is not None else -1 for s in watcher.samples]
    top.step(times, newest, where="post", color="#2a9d4b", linewidth=1.6, label="newest published epoch")
    for r in training.ranks:
        steps = [json.loads(line) for line in r.record.read_text().splitlines() if '"step"' in line]
        t = [timeline.since_start(s["t"]) for s in steps]
        position = [s["step"] / report.batches_per_epoch for s in steps]
        dots = top.plot(t, position, ".", markersize=1.5, label=f"rank {r.rank} reading (epoch)")
        lead = [newest[max(0, bisect.bisect_right(times, x) - 1)] - int(p) for x, p in zip(t, position, strict=True)]
        middle.plot(t, lead, ".", markersize=1.5, color=dots[0].get_color())
    colours = plt.get_cmap("tab10")
    for i, kind in enumerate(kinds(report.store)):
        events = [e for e in timeline.of(kind) if e.detail.get("struck")]
        for j, e in enumerate(events):
            top.axvline(e.t, color=colours(i), linewidth=0.9, alpha=0.8, label=kind if j == 0 else None)
            for ax in (middle, bottom):
                ax.axvline(e.t, color=colours(i), linewidth=0.9, alpha=0.5)
    middle.set_ylabel("lead")
    middle.set_ylim(-0.5, 3.5)
    middle.set_yticks([0, 1, 2, 3])
    middle.grid(alpha=0.3)
    top.set_ylabel("epoch")
    top.set_title(
        f"soak of a {report.store} store: {report.seconds:.0f} s, {sum(report.dump_runs.values())} dump runs, "
        f"{sum(s for s, _ in report.faults.values())} faults, every batch read checked"
    )
    top.legend(loc="upper left", fontsize=7, ncol=2, markerscale=6, frameon=False)
    top.grid(alpha=0.3)

    lanes: list[float] = []  # each lane's end
    for run in cron.runs:
        end = run.end if run.end is not None else timeline.now()
        lane = next((i for i, last in enumerate(lanes) if last <= run.start), len(lanes))
        if lane == len(lanes):
            lanes.append(end)
        lanes[lane] = end
        bottom.barh(lane, end - run.start, left=run.start, height=0.8, color=OUTCOMES[run.outcome()], linewidth=0)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in OUTCOMES.values()]
    bottom.legend(handles, list(OUTCOMES), loc="upper left", fontsize=7, ncol=5, frameon=False)
    bottom.set_ylabel("dump runs")
    bottom.set_yticks([])
    bottom.set_ylim(-0.6, max(len(lanes), 1) + 1.2)
    bottom.set_xlabel("seconds")
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
