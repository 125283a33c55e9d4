"""The markdown report: the results table, the targets, and the machine it ran on."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from dataclasses import dataclass, field

from .casts import CastRun, render_casts
from .contenders import Run
from .dumprun import DumpRun

TARGET_CEILING = 0.8
TARGET_BLOG = {"windows": 5.0, "rows": 20.0}
TARGET_RSS = 1.25
TARGET_READER = 0.8
LOCAL = "unix socket"
READER_BEGIN = "<!-- reader bench: begin -->"
READER_END = "<!-- reader bench: end -->"


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
class ReaderRow:
    """One epoch of the reader bench: seconds per pass of each variant, first-batch latencies."""

    label: str
    batch_size: int
    sample_shape: tuple[int, ...]
    batch_bytes: int
    n_batches: int
    raw_s: list[float]
    getitem_s: list[float]
    to_device_s: list[float]
    first_batch_s: list[float]

    @property
    def epoch_bytes(self) -> int:
        """Bytes of field ``x`` read per pass."""
        return self.batch_bytes * self.n_batches

    def _gbs(self, seconds: list[float]) -> float:
        return self.epoch_bytes / statistics.median(seconds) / 1e9

    @property
    def raw_gbs(self) -> float:
        """GB/s of the median raw pass."""
        return self._gbs(self.raw_s)

    @property
    def getitem_gbs(self) -> float:
        """GB/s of the median ``ds[i]`` + copy pass."""
        return self._gbs(self.getitem_s)

    @property
    def to_device_gbs(self) -> float:
        """GB/s of the median ``to_device("cpu")`` + copy pass."""
        return self._gbs(self.to_device_s)

    @property
    def first_batch_ms(self) -> float:
        """Median milliseconds from ``EpochDataset(...)`` to the first batch read."""
        return statistics.median(self.first_batch_s) * 1e3


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
    reader: list[ReaderRow] = field(default_factory=list)
    reader_s: float = 0.0
    casts: list[CastRun] = field(default_factory=list)


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
    if r.casts:
        out += [render_casts(r.casts, quick=r.quick), ""]
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
    if r.reader:
        out += [render_reader(r.reader, quick=r.quick, seconds=r.reader_s), ""]
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


def render_reader(rows: list[ReaderRow], *, quick: bool, seconds: float) -> str:
    """The reader bench's section, between markers so that ``--reader-only`` can replace it in RESULTS.md."""
    import torch

    out = [
        READER_BEGIN,
        "## Reader: `EpochDataset` against raw reads of the same bytes",
        "",
    ]
    if quick:
        out += ["**`--quick` smoke run: epochs too small to be representative.**", ""]
    passes = len(rows[0].raw_s) if rows else 0
    repeats = len(rows[0].first_batch_s) if rows else 0
    out += [
        "GB/s (10^9 bytes) of one whole epoch of field `x`, written by `EpochWriter` without PostgreSQL "
        "(uncompressed, ~64 MiB shard files), page cache warm, each variant copying every batch into a page-aligned "
        "buffer allocated once (the destination's alignment alone can halve `preadv`'s speed). *raw*: each "
        "shard file opened once, `os.preadv` of each batch's byte range (the ranges "
        "the reader serves, from the shard index). *ds[i]+copy*: `out[name][:n].copy_(t)` for each tensor of "
        '`ds[i]`. *to_device(cpu)*: the same copy of each batch `ds.to_device("cpu")` yields (mapped views; '
        "copied rather than summed on one element, so every byte is read, as in raw). A reader pass includes "
        f"opening the `EpochDataset` and dropping it. One untimed raw pass first, then {passes} rounds of the "
        "three variants in a rotating order; the median pass. *first batch*: median of "
        f"{repeats}, from the `EpochDataset(...)` call to `ds[0]`'s tensors copied out. A ratio over 1x is "
        "possible: torch copies a 4 MiB batch on its intra-op threads, the kernel's `preadv` copy runs on one.",
        "",
        "| batch | batch shape | epoch GB | raw GB/s | ds[i]+copy GB/s | ratio | to_device(cpu) GB/s | ratio "
        "| first-batch latency ms |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        shape = " x ".join(map(str, (row.batch_size, *row.sample_shape)))
        out.append(
            f"| {row.label} ({_size(row.batch_bytes)}) | {shape} float32 | {row.epoch_bytes / 1e9:.2f} "
            f"| {row.raw_gbs:.2f} | {row.getitem_gbs:.2f} | {_x(row.getitem_gbs / row.raw_gbs)} "
            f"| {row.to_device_gbs:.2f} | {_x(row.to_device_gbs / row.raw_gbs)} | {row.first_batch_ms:.1f} |"
        )
    out += ["", "Targets (not meaningful at `--quick` sizes):" if quick else "Targets:", ""]
    for row in rows:
        for what, gbs in (("ds[i]+copy", row.getitem_gbs), ("to_device(cpu)", row.to_device_gbs)):
            ratio = gbs / row.raw_gbs
            out.append(
                f"- {row.label} batches ({_size(row.batch_bytes)}): {what}/raw {_x(ratio)} >= {TARGET_READER}x: "
                f"{_verdict(ratio >= TARGET_READER)}"
            )
    out += [
        "",
        f"Reader bench: torch {torch.__version__} ({torch.get_num_threads()} threads), {os.cpu_count()} x "
        f"{_cpu_model()}, Python {platform.python_version()}, pgprefetch {_revision()}; {seconds:.0f} s "
        "including writing the epochs.",
        READER_END,
    ]
    return "\n".join(out)


def splice_reader(text: str, section: str) -> str:
    """``text`` (a RESULTS.md) with its reader section replaced by ``section`` (or added before Machine)."""
    begin, end = text.find(READER_BEGIN), text.find(READER_END)
    if begin >= 0 and end > begin:
        return text[:begin] + section + text[end + len(READER_END) :]
    machine = text.find("\nMachine:\n")
    if machine >= 0:
        return text[: machine + 1] + section + "\n\n" + text[machine + 1 :]
    return text.rstrip("\n") + "\n\n" + section + "\n"


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"
