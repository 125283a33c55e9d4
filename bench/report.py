"""The markdown report: the results table, the targets, and the machine it ran on."""

from __future__ import annotations

import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .casts import CastRun, render_casts
from .contenders import Run
from .dumprun import DumpRun
from .machine import code_revision, cpu_model, times

if TYPE_CHECKING:
    from .opening import OpeningResults
    from .s3 import S3Results
    from .small import SmallResults

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
    ceiling: Run | None  # COPY of the per-sample query joined to the batch's keys: one row per tuple
    statement: Run | None = None  # COPY of the dump's own batch statement (per-sample aggregated arrays)
    keys_checked: bool = False  # both ceilings' batches were checked against the dump's keys array


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
    getitem_1t_s: list[float] = field(default_factory=list)  # ds[i]+copy with torch.set_num_threads(1)
    loader_s: dict[str, list[float]] = field(default_factory=dict)  # DataLoader variants: "0", "2", "2 persistent"

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
    def getitem_1t_gbs(self) -> float:
        """GB/s of the median ``ds[i]`` + copy pass on one torch thread (0 when not measured)."""
        return self._gbs(self.getitem_1t_s) if self.getitem_1t_s else 0.0

    @property
    def to_device_gbs(self) -> float:
        """GB/s of the median ``to_device("cpu")`` + copy pass."""
        return self._gbs(self.to_device_s)

    def loader_gbs(self, variant: str) -> float:
        """GB/s of the median pass of a DataLoader variant (0 when not measured)."""
        return self._gbs(self.loader_s[variant]) if self.loader_s.get(variant) else 0.0

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
    opening: OpeningResults | None = None  # opening and listing an epoch of 10^5 batches against 100
    small: SmallResults | None = None  # the same epoch dumped in batches of 10 against batches of 1,000
    s3: S3Results | None = None  # dumping to and reading from moto's S3 server against plain obstore calls
    started: str = ""  # when the run started (UTC)
    revision: str = ""  # pgprefetch's version and commit when the run started (see code_revision())


def _n(x: float) -> str:
    return f"{x:,.0f}"


def rss_per_sample(small: DumpRun, large: DumpRun) -> float:
    """Peak RSS growth per extra sample between two dumps of different sizes, in bytes."""
    return (large.max_rss - small.max_rss) / (large.samples - small.samples)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def render(r: Results) -> str:
    """The whole report as markdown."""
    out = [
        "# pgprefetch bench",
        "",
        f"Run at pgprefetch {r.revision or code_revision()}, {r.started or 'unknown time'}.",
        "",
    ]
    if r.quick:
        out += ["**`--quick` smoke run: sizes too small to be representative.**", ""]
    out += [
        "Samples/s of four ways to read the same epoch, measured in the same run (compare the ratios, not the "
        "absolute figures, across machines).",
        "",
        "- *blog*: the blog post's loop, one query per sample with its values pasted into the SQL text, "
        "`asyncio.gather` over an asyncpg pool of 8, for a time budget: its rate is measured on the samples "
        "it read in that time (*blog sampled*), not on the whole epoch. The pool and the keys cursor's "
        "connection are opened before its clock starts. Each sample costs four round trips (asyncpg 0.32, "
        "counted with a message-counting proxy): Parse and Describe of the new SQL text (every text is unique, "
        "so asyncpg's statement cache never hits); Close of the statement that cache (100 per connection) "
        "evicted, from a connection's 101st sample on; Bind and Execute; and on release to the pool its reset, "
        "`SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL;`.",
        "- *row ceiling*: one binary `COPY (per-sample query joined to the batch's keys) TO STDOUT` per batch, "
        "one row per tuple, bytes discarded, 8 in flight.",
        "- *statement ceiling*: one binary `COPY (the dump's own batch statement) TO STDOUT` per batch (per-sample "
        "aggregated binary arrays, built by `pgprefetch.pg.statement.batch_statement` through pgprefetch's planning; "
        "its key arrays pasted in as `int8[]` literals, since COPY takes no bind parameters), bytes discarded, "
        "8 in flight. The dump's server work without its client work: what separates it from the dump is "
        "decoding, checking and writing, and the dump process's start-up, keys query and shuffle.",
        "- *dump*: `pgprefetch dump` as a whole process; wall time includes interpreter start-up, the keys "
        "query, the shuffle, decoding, writing and syncing the Zarr store (its own reported seconds in brackets).",
        "",
        "Both ceilings send the dump's batches: each run checks the keys they sent, batch by batch, against the "
        "`keys` array the dump wrote (*keys checked*).",
        "",
        "| dataset | samples | blog samples/s | row ceiling samples/s | statement ceiling samples/s "
        "| dump samples/s | dump/row ceiling | dump/statement ceiling | dump/blog | blog sampled | dump wall s "
        "| keys checked |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for row in r.rows:
        ceiling = _n(row.ceiling.rate) if row.ceiling else "—"
        statement = _n(row.statement.rate) if row.statement else "—"
        vs_ceiling = times(row.dump.rate / row.ceiling.rate) if row.ceiling else "—"
        vs_statement = times(row.dump.rate / row.statement.rate) if row.statement else "—"
        out.append(
            f"| {row.dataset} ({row.transport}) | {_n(row.samples)} | {_n(row.blog.rate)} | {ceiling} | {statement} "
            f"| {_n(row.dump.rate)} | {vs_ceiling} | {vs_statement} | {times(row.dump.rate / row.blog.rate)} "
            f"| {_n(row.blog.samples)} in {row.blog.seconds:.1f} s "
            f"| {row.dump.seconds:.1f} ({row.dump.dump_seconds:.1f}) | {'yes' if row.keys_checked else '—'} |"
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
        if len(r.rss) == 2:
            small, large = r.rss[0][2], r.rss[1][2]
            out += [
                f"Peak RSS growth per extra sample: {rss_per_sample(small, large):,.1f} bytes "
                f"({(large.max_rss - small.max_rss) / 2**20:,.1f} MiB for {_n(large.samples - small.samples)} more "
                "samples; the interpreter and its imports are the rest).",
                "",
            ]
    out += ["Targets (not meaningful at `--quick` sizes):" if r.quick else "Targets:", ""]
    for row in r.rows:
        vs_blog = row.dump.rate / row.blog.rate
        ratio = row.dump.rate / row.ceiling.rate if row.ceiling else None
        where = f"{row.dataset}, {row.transport}"
        if row.transport == LOCAL and ratio is not None:
            target = TARGET_BLOG[row.dataset]
            out.append(
                f"- {where}: dump/row ceiling {times(ratio)} >= {TARGET_CEILING}x: {_verdict(ratio >= TARGET_CEILING)}"
            )
            if row.statement:
                vs_statement = row.dump.rate / row.statement.rate
                out.append(
                    f"- {where}: dump/statement ceiling {times(vs_statement)} "
                    "(no target: the same server work, so the gap is the client's)"
                )
            out.append(f"- {where}: dump/blog {times(vs_blog)} >= {target:g}x: {_verdict(vs_blog >= target)}")
        else:
            also = f", dump/ceiling {times(ratio)}" if ratio is not None else ""
            out.append(f"- {where}: dump/blog {times(vs_blog)}{also} (no target)")
    if len(r.rss) == 2:
        ratio = r.rss[1][2].max_rss / r.rss[0][2].max_rss
        out.append(
            f"- peak RSS 4x/1x {ratio:.2f} <= {TARGET_RSS}: {_verdict(ratio <= TARGET_RSS)} "
            f"({rss_per_sample(r.rss[0][2], r.rss[1][2]):,.1f} bytes per extra sample)"
        )
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
        out += [render_reader(r.reader, quick=r.quick, seconds=r.reader_s, revision=r.revision), ""]
    if r.opening:
        from .opening import render as render_opening

        out += [render_opening(r.opening, revision=r.revision), ""]
    if r.small:
        from .small import render as render_small

        out += [render_small(r.small, revision=r.revision), ""]
    if r.s3:
        from .s3 import render as render_s3

        out += [render_s3(r.s3, revision=r.revision), ""]
    scales = ", ".join(f"{k} {v:g}" for k, v in r.scales.items())
    out += [
        "Machine:",
        "",
        f"- platform: {platform.platform()}",
        f"- CPUs: {os.cpu_count()} x {cpu_model()}",
        f"- PostgreSQL: {r.server_version}",
        f"- Python {platform.python_version()}; pgprefetch {r.revision or code_revision()}",
        f"- demo data scales: {scales}; setup (server, load, vacuum) {r.setup_s:.0f} s; bench total {r.total_s:.0f} s",
        "",
    ]
    return "\n".join(out)


def render_reader(rows: list[ReaderRow], *, quick: bool, seconds: float, revision: str = "") -> str:
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
        "copied rather than summed on one element, so every byte is read, as in raw). *1 thread*: ds[i]+copy "
        "with `torch.set_num_threads(1)`. *raw* is single-threaded (`preadv` copies on the calling thread) while "
        f"torch's `copy_` runs on its intra-op threads ({torch.get_num_threads()} here): a ratio over 1x for large "
        "batches is those threads, not a cheaper read; the 1-thread column compares at equal threads. A reader "
        "pass includes opening the `EpochDataset` and dropping it. One untimed raw pass first, then "
        f"{passes} rounds of the four variants in a rotating order; the median pass. *first batch*: median of "
        f"{repeats}, from the `EpochDataset(...)` call to `ds[0]`'s tensors copied out.",
        "",
        "| batch | batch shape | epoch GB | raw GB/s | ds[i]+copy GB/s | ratio | to_device(cpu) GB/s | ratio "
        "| ds[i]+copy 1 thread GB/s | ratio | first-batch latency ms |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        shape = " x ".join(map(str, (row.batch_size, *row.sample_shape)))
        out.append(
            f"| {row.label} ({_size(row.batch_bytes)}) | {shape} float32 | {row.epoch_bytes / 1e9:.2f} "
            f"| {row.raw_gbs:.2f} | {row.getitem_gbs:.2f} | {times(row.getitem_gbs / row.raw_gbs)} "
            f"| {row.to_device_gbs:.2f} | {times(row.to_device_gbs / row.raw_gbs)} "
            f"| {row.getitem_1t_gbs:.2f} | {times(row.getitem_1t_gbs / row.raw_gbs)} | {row.first_batch_ms:.1f} |"
        )
    out += ["", "Targets (not meaningful at `--quick` sizes):" if quick else "Targets:", ""]
    for row in rows:
        for what, gbs in (("ds[i]+copy", row.getitem_gbs), ("to_device(cpu)", row.to_device_gbs)):
            ratio = gbs / row.raw_gbs
            out.append(
                f"- {row.label} batches ({_size(row.batch_bytes)}): {what}/raw {times(ratio)} >= {TARGET_READER}x: "
                f"{_verdict(ratio >= TARGET_READER)}"
            )
        if row.getitem_1t_s:
            out.append(
                f"- {row.label} batches ({_size(row.batch_bytes)}): ds[i]+copy on 1 thread/raw "
                f"{times(row.getitem_1t_gbs / row.raw_gbs)} (no target; raw and reader at equal threads)"
            )
    if any(row.loader_s for row in rows):
        out += ["", *render_loader(rows)]
    out += [
        "",
        f"Reader bench: torch {torch.__version__} ({torch.get_num_threads()} threads), {os.cpu_count()} x "
        f"{cpu_model()}, Python {platform.python_version()}, pgprefetch {revision or code_revision()}; "
        f"{seconds:.0f} s "
        "including writing the epochs.",
        READER_END,
    ]
    return "\n".join(out)


def render_loader(rows: list[ReaderRow]) -> list[str]:
    """The DataLoader workers table: the same copy loop over ``DataLoader(ds, batch_size=None, num_workers=k)``."""
    out = [
        "**DataLoader workers.** The same copy of every batch, from `DataLoader(ds, batch_size=None, "
        "num_workers=k)`. *k = 2* creates the DataLoader inside the clock (two worker processes started per "
        "pass, as a training loop without `persistent_workers` pays every epoch); *k = 2 persistent* reuses "
        "one DataLoader with `persistent_workers=True`, after an untimed pass (the steady state). Workers send "
        "each batch as a reference to its bytes in the shard file, which the main process maps itself "
        "(`pgprefetch/workers.py`).",
        "",
        "| batch | in-process ds[i]+copy GB/s | k = 0 GB/s | k = 2 GB/s | k = 2 persistent GB/s "
        "| k = 2 / k = 0 | persistent / k = 0 | batches/s, k = 2 persistent |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        zero, two, steady = (row.loader_gbs(v) for v in ("0", "2", "2 persistent"))
        per_s = steady * 1e9 / row.batch_bytes
        out.append(
            f"| {row.label} ({_size(row.batch_bytes)}) | {row.getitem_gbs:.2f} | {zero:.2f} | {two:.2f} "
            f"| {steady:.2f} | {times(two / zero)} | {times(steady / zero)} | {per_s:,.0f} |"
        )
    out += ["", "Target: k = 2 >= 0.5x the rate of k = 0:", ""]
    for row in rows:
        zero, two, steady = (row.loader_gbs(v) for v in ("0", "2", "2 persistent"))
        out.append(
            f"- {row.label} batches ({_size(row.batch_bytes)}): per pass {times(two / zero)}, "
            f"{_verdict(two / zero >= 0.5)}; persistent {times(steady / zero)}, {_verdict(steady / zero >= 0.5)}"
        )
    return out


def splice_reader(text: str, section: str) -> str:
    """``text`` (a RESULTS.md) with its reader section replaced by ``section`` (or added before Machine)."""
    return splice(text, section, READER_BEGIN, READER_END)


def splice_into(results: Path, section: str, begin_marker: str, end_marker: str) -> None:
    """Put ``section`` into the RESULTS.md at ``results`` between its markers (a new file: a heading first)."""
    old = results.read_text(encoding="utf-8") if results.exists() else "# pgprefetch bench\n"
    results.write_text(splice(old, section, begin_marker, end_marker), encoding="utf-8")


def splice(text: str, section: str, begin_marker: str, end_marker: str) -> str:
    """``text`` with the section between the markers replaced by ``section`` (or added before Machine)."""
    begin, end = text.find(begin_marker), text.find(end_marker)
    if begin >= 0 and end > begin:
        return text[:begin] + section + text[end + len(end_marker) :]
    machine = text.find("\nMachine:\n")
    if machine >= 0:
        return text[: machine + 1] + section + "\n\n" + text[machine + 1 :]
    return text.rstrip("\n") + "\n\n" + section + "\n"


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:g} KiB"
