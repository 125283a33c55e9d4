"""What the ``cast = "safe"`` checks cost: decoding real batches with and without them, against the dump.

A handful of batches spread over epoch 0 are fetched once, through pgprefetch's own planning and batch
statement (as ``pgprefetch check`` does), then decoded in memory by two layouts of the same config: the
config as is (every field ``cast = "safe"``, the default) and a copy whose fields say ``cast = "unsafe"``
(no checks). Each round decodes all the batches with one layout, then with the other, the order
alternating; the cost is the median over rounds of the paired difference, per batch. It is set against
the seconds per batch of the whole dump measured in the same bench run, so the machine's noise and speed
cancel out of the ratio.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pgprefetch.config.load import parse_config
from pgprefetch.config.model import Config
from pgprefetch.decode import collate
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.pg.session import BatchReader, Snapshot
from pgprefetch.write.query import layout_from, plan_epoch

from .datasets import Dataset
from .dumprun import DumpRun

BATCHES = 8
BUDGET_S = 3.0
MIN_ROUNDS = 30
TARGET = 0.03  # the issue: the checks cost at most 3% of the dump


@dataclass(frozen=True)
class CastRun:
    """Seconds per batch of each decode round, safe and unsafe, paired; and the dump they are set against."""

    dataset: str
    batch_size: int
    batches: int
    safe_s: list[float]
    unsafe_s: list[float]
    dump: DumpRun

    @property
    def rounds(self) -> int:
        """How many rounds of (safe, unsafe) were timed."""
        return len(self.safe_s)

    @property
    def cost_s(self) -> float:
        """Median over rounds of safe minus unsafe, seconds per batch."""
        return statistics.median(s - u for s, u in zip(self.safe_s, self.unsafe_s, strict=True))

    @property
    def spread_s(self) -> tuple[float, float]:
        """The quartiles of the paired differences: how far the rounds disagree."""
        q1, _, q3 = statistics.quantiles((s - u for s, u in zip(self.safe_s, self.unsafe_s, strict=True)), n=4)
        return q1, q3

    @property
    def dump_batch_s(self) -> float:
        """Seconds per batch of the whole dump (its own reported seconds, no process start-up)."""
        return self.dump.dump_seconds * self.batch_size / self.dump.samples

    @property
    def share(self) -> float:
        """The checks' cost as a fraction of the dump's time per batch."""
        return self.cost_s / self.dump_batch_s

    def line(self) -> str:
        """``cast checks: +X µs per batch = Y% of the dump (dataset)``."""
        q1, q3 = self.spread_s
        return (
            f"cast checks: {self.cost_s * 1e6:+,.1f} µs per batch = {self.share:.2%} of the dump ({self.dataset}; "
            f"decode {statistics.median(self.unsafe_s) * 1e6:,.0f} µs unchecked, "
            f"{statistics.median(self.safe_s) * 1e6:,.0f} µs checked, quartiles of the difference "
            f"{q1 * 1e6:+,.1f}..{q3 * 1e6:+,.1f} µs; dump {self.dump_batch_s * 1e3:,.2f} ms per batch)"
        )


def config(ds: Dataset, dsn: str, *, unsafe: bool = False, connections: int = 1) -> Config:
    """The bench's config for ``ds`` on ``dsn``, every field ``cast = "unsafe"`` if asked."""
    cfg = parse_config(tomllib.loads(ds.config(Path("unused"))))
    cfg = dataclasses.replace(cfg, source=dataclasses.replace(cfg.source, dsn=dsn, connections=connections))
    if unsafe:
        cfg = dataclasses.replace(cfg, fields=tuple(dataclasses.replace(f, cast="unsafe") for f in cfg.fields))
    return cfg


async def fetch(
    ds: Dataset, dsn: str, batches: int
) -> tuple[BatchLayout, BatchLayout, list[tuple[tuple[bytes | None, ...], np.ndarray]]]:
    """The safe and unsafe layouts, and up to ``batches`` batches (wire bytes, keys) spread over epoch 0."""
    safe_cfg, unsafe_cfg = config(ds, dsn), config(ds, dsn, unsafe=True)
    size = safe_cfg.batches.size
    async with Snapshot.open(safe_cfg.source) as snap:
        plan = await plan_epoch(safe_cfg, snap, 0)
        full = max(plan.used // size, 1)  # full batches only, where there are any: each costs the same
        chosen = sorted({int(b) for b in np.linspace(0, full - 1, min(batches, full))})
        async with BatchReader.open(safe_cfg.source, snap.id, plan.sql, plan.params) as reader:
            fetched = [(await reader.fetch(b, plan.batch_keys(b, size)), plan.batch_keys(b, size)) for b in chosen]
    first = fetched[0][0]
    return layout_from(safe_cfg, plan, first), layout_from(unsafe_cfg, plan, first), fetched


def decode_all(
    layout: BatchLayout, fetched: list[tuple[tuple[bytes | None, ...], np.ndarray]], out: dict[str, np.ndarray]
) -> float:
    """Decode every fetched batch into ``out``; seconds per batch."""
    started = time.perf_counter()
    for blobs, keys in fetched:
        collate.decode(layout, blobs, keys, out)
    return (time.perf_counter() - started) / len(fetched)


def measure(ds: Dataset, dsn: str, dump: DumpRun, *, batches: int = BATCHES, budget_s: float = BUDGET_S) -> CastRun:
    """Time the safe and unsafe decodes of a few real batches of ``ds``, in alternating rounds."""
    safe, unsafe, fetched = asyncio.run(fetch(ds, dsn, batches))
    out_safe, out_unsafe = safe.allocate(ds.batch_size), unsafe.allocate(ds.batch_size)
    decode_all(safe, fetched, out_safe)  # warm-up, and both must decode the same values
    decode_all(unsafe, fetched, out_unsafe)
    for name, a in out_safe.items():
        if not np.array_equal(a, out_unsafe[name], equal_nan=a.dtype.kind == "f"):
            raise AssertionError(f"{ds.name}: field {name} differs between the safe and unsafe decodes")
    safe_s: list[float] = []
    unsafe_s: list[float] = []
    started = time.perf_counter()
    while len(safe_s) < MIN_ROUNDS or time.perf_counter() - started < budget_s:
        if len(safe_s) % 2:
            unsafe_s.append(decode_all(unsafe, fetched, out_unsafe))
            safe_s.append(decode_all(safe, fetched, out_safe))
        else:
            safe_s.append(decode_all(safe, fetched, out_safe))
            unsafe_s.append(decode_all(unsafe, fetched, out_unsafe))
    return CastRun(ds.name, ds.batch_size, len(fetched), safe_s, unsafe_s, dump)


def render_casts(runs: list[CastRun], *, quick: bool) -> str:
    """The report's section: one line per dataset, then the target."""
    if not runs:
        return ""
    rounds = ", ".join(f"{r.dataset} {r.rounds}" for r in runs)
    out = [
        f'Cost of the `cast = "safe"` checks: {runs[0].batches} real batches per dataset, fetched once, decoded in '
        'memory by the config as is and by the same config with every field `cast = "unsafe"`, in alternating '
        f"rounds ({rounds}); the median paired difference per batch, as a share of the dump's own seconds per "
        "batch in this run (its JSON `seconds`, a stricter base than wall time).",
        "",
    ]
    out += [f"- {r.line()}" for r in runs]
    out += ["", "Targets (not meaningful at `--quick` sizes):" if quick else "Targets:", ""]
    for r in runs:
        verdict = "PASS" if r.share <= TARGET else "FAIL"
        out.append(f"- {r.dataset}: cast checks {r.share:.2%} of the dump <= {TARGET:.0%}: {verdict}")
    return "\n".join(out)
