"""The markdown report: the results table, the targets, and the machine it ran on."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass, field

from .contenders import Run
from .dumprun import DumpRun

TARGET_CEILING = 0.8
TARGET_BLOG = {"windows": 5.0, "rows": 20.0}
TARGET_RSS = 1.25
LOCAL = "unix socket"


@dataclass
class Row:
    """One line of the table: a dataset over one transport."""

    dataset: str
    transport: str
    samples: int
    blog: Run
    dump: DumpRun
    ceiling: Run | None


@dataclass
class Results:
    """Everything one bench run measured."""

    quick: bool
    scales: dict[str, float]
    rows: list[Row] = field(default_factory=list)
    rss: list[tuple[str, float, DumpRun]] = field(default_factory=list)
    rtt_ms: dict[str, float] = field(default_factory=dict)
    delay_ms: float = 0.5
    server_version: str = ""
    setup_s: float = 0.0
    total_s: float = 0.0


def _n(x: float) -> str:
    return f"{x:,.0f}"


def _x(x: float) -> str:
    return f"{x:.2f}x" if x < 10 else f"{x:.1f}x"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _revision() -> str:
    """pgprefetch's version and the checkout's commit (``+dirty`` with uncommitted changes)."""
    from pgprefetch import __version__

    here = os.path.dirname(os.path.abspath(__file__))
    try:
        sha = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--", "../pgprefetch"], capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return __version__
    return f"{__version__}, commit {sha}{'+dirty' if dirty else ''}"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def render(r: Results) -> str:
    """The whole report as markdown."""
    out = ["# pgprefetch bench", ""]
    if r.quick:
        out += ["**`--quick` smoke run: sizes too small to be representative.**", ""]
    out += [
        "Samples/s of three ways to read the same epoch, measured in the same run (compare the ratios, not the "
        "absolute figures, across machines). *blog*: the blog post's loop, one query per sample, `asyncio.gather` "
        "over an asyncpg pool of 8, on a time-bounded prefix of the keys. *ceiling*: one binary "
        "`COPY (batch query) TO STDOUT` per batch, bytes discarded, 8 in flight, same batches as the dump. "
        "*dump*: `pgprefetch dump` as a whole process; wall time includes interpreter start-up, the keys query, "
        "the shuffle, decoding, writing and syncing the Zarr store (its own reported seconds in brackets).",
        "",
        "| dataset | samples | blog samples/s | ceiling samples/s | dump samples/s | dump/ceiling | dump/blog "
        "| blog sampled | dump wall s |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in r.rows:
        ceiling = _n(row.ceiling.rate) if row.ceiling else "—"
        vs_ceiling = _x(row.dump.rate / row.ceiling.rate) if row.ceiling else "—"
        out.append(
            f"| {row.dataset} ({row.transport}) | {_n(row.samples)} | {_n(row.blog.rate)} | {ceiling} "
            f"| {_n(row.dump.rate)} | {vs_ceiling} | {_x(row.dump.rate / row.blog.rate)} "
            f"| {_n(row.blog.samples)} in {row.blog.seconds:.1f} s "
            f"| {row.dump.seconds:.1f} ({row.dump.dump_seconds:.1f}) |"
        )
    out.append("")
    if r.rss:
        out += ["Peak RSS of the dump process, rows dataset, epoch size set by `[samples] fraction`:", ""]
        out += ["| epoch | fraction | samples | peak RSS MiB | dump wall s |", "|---|--:|--:|--:|--:|"]
        for label, fraction, run in r.rss:
            out.append(
                f"| {label} | {fraction:g} | {_n(run.samples)} | {run.max_rss / 2**20:,.1f} | {run.seconds:.1f} |"
            )
        out.append("")
    out += ["Targets (not meaningful at `--quick` sizes):" if r.quick else "Targets:", ""]
    for row in r.rows:
        vs_blog = row.dump.rate / row.blog.rate
        ratio = row.dump.rate / row.ceiling.rate if row.ceiling else None
        where = f"{row.dataset}, {row.transport}"
        if row.transport == LOCAL and ratio is not None:
            target = TARGET_BLOG[row.dataset]
            out.append(f"- {where}: dump/ceiling {_x(ratio)} >= {TARGET_CEILING}x: {_verdict(ratio >= TARGET_CEILING)}")
            out.append(f"- {where}: dump/blog {_x(vs_blog)} >= {target:g}x: {_verdict(vs_blog >= target)}")
        else:
            also = f", dump/ceiling {_x(ratio)}" if ratio is not None else ""
            out.append(f"- {where}: dump/blog {_x(vs_blog)}{also} (no target)")
    if len(r.rss) == 2:
        ratio = r.rss[1][2].max_rss / r.rss[0][2].max_rss
        out.append(f"- peak RSS 4x/1x {ratio:.2f} <= {TARGET_RSS}: {_verdict(ratio <= TARGET_RSS)}")
    out.append("")
    if r.rtt_ms:
        direct, proxied = r.rtt_ms["direct"], r.rtt_ms["proxy"]
        out += [
            f"Proxy: its own process, 127.0.0.1 TCP to the server's socket, every chunk delayed {r.delay_ms:g} ms "
            f"each way. Median `SELECT 1` round trip: {direct:.3f} ms direct, {proxied:.3f} ms through the proxy. "
            "The proxy copies every byte in Python on the same cores, so bulk transfers through it also pay CPU "
            "per chunk; that is why the COPY ceiling is not run through it by default (`--proxy-ceiling`): COPY "
            "arrives in many small chunks, the dump's one-row result in a few large ones.",
            "",
        ]
    scales = ", ".join(f"{k} {v:g}" for k, v in r.scales.items())
    out += [
        "Machine:",
        "",
        f"- platform: {platform.platform()}",
        f"- CPUs: {os.cpu_count()} x {_cpu_model()}",
        f"- PostgreSQL: {r.server_version}",
        f"- Python {platform.python_version()}; pgprefetch {_revision()}",
        f"- demo data scales: {scales}; setup (server, load, vacuum) {r.setup_s:.0f} s; bench total {r.total_s:.0f} s",
        "",
    ]
    return "\n".join(out)
