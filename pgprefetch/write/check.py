"""``pgprefetch check``: everything a dump would decide, run against the database, with nothing written.

Users iterate on a config before the first real dump. The check plans epoch 0 on a snapshot exactly as
the dump does (:func:`pgprefetch.write.query.plan_epoch`: the queries described, the keys read, shuffled and
checked for repeats, the categories fixed, against the store's vocabulary when the store exists, which
is read, not written), then fetches a sample of batches spread over the epoch and
decodes them with every type, cast, NULL and range check of the dump (scan mode: from a keys pass and the
checked batches' rows, not the whole table). Problems are collected, one line each, rather than stopping at
the first, so one run shows what to fix; a problem alike in several batches is one line over them.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.config.values import show_size
from pgprefetch.decode.layout import UnknownCategoryError
from pgprefetch.errors import SourceError, StoreError
from pgprefetch.pg.session import Snapshot
from pgprefetch.store.open import open_store
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.budget import FLOOR, SLACK, Account, expected_peak
from pgprefetch.write.manifest import field_entries
from pgprefetch.write.order.spill import bytes_per_key
from pgprefetch.write.plan import EpochPlan, Vocabulary, name_unknown_category
from pgprefetch.write.scan.sampled import sampled_source
from pgprefetch.write.scan.table import TableTooLarge
from pgprefetch.write.sources import ReadCache, open_source

SAMPLE_BATCHES = 8


@dataclass
class CheckReport:
    """What ``check`` found: the epoch's size and shapes, and one line per problem.

    A figure the check did not get to (an error stopped it first) is None, and not printed: "keys: 0"
    would say the keys query returned nothing.
    """

    n_keys: int | None = None
    duplicates_dropped: int = 0
    n_samples: int | None = None
    n_batches: int | None = None
    batches_checked: int = 0
    fields: dict[str, dict[str, Any]] = field(default_factory=dict)
    epoch_bytes: int | None = None
    errors: list[str] = field(default_factory=list)
    batch_errors: list[tuple[int, str]] = field(default_factory=list)  # (batch, problem): each checked batch's
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what would make the dump slow (a missing index)
    expected_seconds: float | None = None  # query mode: the dump's duration, from the checked batches' time
    expected_rate: float | None = None  # samples/s on the config's connections
    connections: int = 0
    rows_read: int | None = None  # scan mode: the table rows the server read for the check
    sources: list[dict[str, Any]] = field(default_factory=list)  # a mixed epoch's: each source's figures
    memory: int = 0  # ``[source] memory``: the dump's budget
    expected_peak: int | None = None  # the dump's expected peak RSS, bytes (:func:`.budget.expected_peak`)
    key_width: int = 1  # the key's int64 slots

    def lines(self, verbose: bool = False) -> list[str]:
        """The report as printed; ``verbose``: each checked batch's problems on lines of their own too."""
        dropped = f" ({self.duplicates_dropped:,} repeated, dropped)" if self.duplicates_dropped else ""
        out = [f"keys: {self.n_keys:,}{dropped}"] if self.n_keys is not None else []
        if self.n_samples is not None and self.n_batches is not None:
            size = f", about {show_size(self.epoch_bytes)} of arrays, uncompressed" if self.epoch_bytes else ""
            batches = f"batch{'es' if self.n_batches != 1 else ''}"
            out.append(f"epoch: {self.n_samples:,} samples in {self.n_batches:,} {batches}{size}")
        for s in self.sources:
            out.append(source_line(s))
        for name, f in self.fields.items():
            extra = "".join(f", {k} {v}" for k, v in f.items() if k not in ("dtype", "shape"))
            out.append(f"field {name}: {f['dtype']} {tuple(f['shape'])} per sample{extra}")
        if self.batches_checked:
            out.append(f"checked {self.batches_checked} batch(es) with every type, cast and NULL check of the dump")
        if self.rows_read is not None:
            out.append(
                f"read: the key columns of every row and the checked batches' rows ({self.rows_read:,} table rows "
                "in all); a dump reads the whole table"
            )
        if self.expected_seconds is not None and self.expected_rate is not None:
            out.append(
                f"expected: about {_duration(self.expected_seconds)} at {self.expected_rate:,.0f} samples/s on "
                f"{self.connections} connection(s) (from the time of the checked batches' statements)"
            )
        if self.expected_peak is not None:
            working = self.expected_peak - FLOOR - SLACK
            out.append(
                f"memory: a dump's expected peak about {_mib(self.expected_peak)}: {_mib(FLOOR)} for the interpreter, "
                f"{_mib(working)} of [source] memory ({_mib(self.memory)}), {_mib(SLACK)} of slack"
            )
        out += [f"note: {n}" for n in self.notes]
        out += [f"warning: {w}" for w in self.warnings]
        out += [f"error: {e}" for e in self.errors]
        if verbose:
            out += [f"error in batch {b}: {e}" for b, e in self.batch_errors]
        return out

    def summarize_batches(self) -> None:
        """One error line per kind of problem over the checked batches (alike but for numbers), not per batch."""
        groups: dict[str, list[tuple[int, str]]] = {}
        for batch, problem in self.batch_errors:
            groups.setdefault(re.sub(r"\d+", "#", problem), []).append((batch, problem))
        for found in groups.values():
            batch, problem = found[0]
            if len(found) == 1:
                self.errors.append(f"batch {batch}: {problem}")
                continue
            numbers = ", ".join(str(b) for b, _ in found)
            self.errors.append(
                f"{len(found)} of {self.batches_checked} checked batches ({numbers}), e.g. batch {batch}: {problem}"
                " (--verbose: each batch's)"
            )

    def to_json(self) -> dict[str, Any]:
        """The object ``check --json`` prints."""
        return {**self.__dict__, "ok": not self.errors}


async def check_config(cfg: Config, epoch: int = 0, batches: int = SAMPLE_BATCHES) -> CheckReport:
    """Plan ``epoch`` and decode up to ``batches`` of its batches, spread over it; write nothing.

    In scan mode the epoch is planned from a keys pass and only the checked batches' rows are read
    (:mod:`pgprefetch.write.scan.sampled`): a check costs a fraction of the dump, whatever the table's size.

    Raises:
        SourceError: the database cannot be reached (the check cannot run at all).
        ConfigError: the queries or the table do not fit the config: the dump's own error (it would stop
            there too, before any batch), raised as it is so that ``check`` says and exits what ``dump`` does.
    """
    report = CheckReport(connections=cfg.source.connections, memory=cfg.source.memory_bytes)
    if cfg.mode == "query" and cfg.mix is None:  # a few batches, fetched one at a time: one connection
        cfg = dataclasses.replace(cfg, source=dataclasses.replace(cfg.source, connections=1))
    async with Snapshot.open(cfg.source) as snap:
        try:
            sampled = await _sampled(cfg, snap, epoch, batches)
            if sampled is not None:  # scan mode: the keys of every row, the data of the checked batches only
                source, chosen = sampled
                await _sample(cfg, snap, source, chosen, report)
                report.rows_read = source.rows_read
            else:  # query mode, or a scan whose keys outgrow [source] memory (ordered on disk)
                async with open_source(cfg, epoch, snap, ReadCache(), spool=None, vocabulary=_vocabulary(cfg)) as got:
                    if isinstance(got, EpochPlan):  # a table larger than [source] memory: its keys were read
                        report.n_keys, report.n_samples, report.n_batches = got.n_keys, got.used, got.n_batches
                        report.notes.append(
                            "the keys do not fit [source] memory: checked them only (a dump reads the table in passes)"
                        )
                    else:
                        await _sample(cfg, snap, got, spread(got.plan.n_batches, batches), report)
        except (SourceError, StoreError) as e:
            if isinstance(e, SourceError) and e.transient:
                raise
            report.errors.append(str(e))
    report.expected_peak = _expected_peak(cfg, report)
    return report


def _expected_peak(cfg: Config, report: CheckReport) -> int | None:
    """The dump's expected peak: query mode's keys held in memory, where they fit; the whole budget otherwise.

    None where the check stopped before the epoch was planned.
    """
    if report.n_keys is None:
        return None
    budget = cfg.source.memory_bytes
    if cfg.mode != "query" or cfg.mix is not None:  # a scan holds the table while it fits, passes beyond it
        return expected_peak(budget)
    working = report.n_keys * bytes_per_key(report.key_width) + Account.for_scan(budget).writer
    return expected_peak(budget, working)


async def _sampled(cfg: Config, snap: Snapshot, epoch: int, batches: int) -> tuple[BatchSource, list[int]] | None:
    """Scan mode's check source (:func:`~pgprefetch.write.scan.sampled.sampled_source`), if its keys fit memory."""
    if cfg.mode != "scan" or cfg.mix is not None:
        return None
    try:
        return await sampled_source(cfg, snap, epoch, _vocabulary(cfg), lambda n: spread(n, batches))
    except TableTooLarge:
        return None


def _vocabulary(cfg: Config) -> Vocabulary:
    """The config's store, read for its category vocabularies (never written): the lists a dump would plan.

    A config without ``categories = "auto"`` does not look at the store at all, unless it mixes sources:
    the store's records say where each source stands (:mod:`pgprefetch.write.mix.positions`).
    """
    if not any(f.categories == "auto" for f in cfg.fields) and cfg.mix is None:
        return Vocabulary()
    store = open_store(cfg.store.path)
    return Vocabulary(store if store.exists() else None)


def spread(n_batches: int, count: int) -> list[int]:
    """``count`` batches (at most all) spread evenly over an epoch of ``n_batches``, first and last included."""
    return sorted({int(b) for b in np.linspace(0, n_batches - 1, min(count, n_batches))})


async def _sample(cfg: Config, snap: Snapshot, source: BatchSource, chosen: list[int], report: CheckReport) -> None:
    """Produce the batches ``chosen`` with every check of the dump, collecting the errors."""
    plan, size = source.plan, cfg.batches.size
    report.n_keys, report.duplicates_dropped = plan.n_keys, plan.duplicates_dropped
    report.key_width = plan.key_columns.width
    report.n_samples, report.n_batches = plan.used, plan.n_batches
    report.warnings += source.warnings
    buffers = source.allocate(size)
    if source.records and "mix" in source.records:
        report.sources = source.records["mix"]["sources"]
    fetch_seconds = []
    for batch in chosen:
        try:
            started = time.perf_counter()
            fetched = await source.fetch(batch, 1)
            fetch_seconds.append(time.perf_counter() - started)
            source.produce(batch, 1, fetched, buffers)
        except UnknownCategoryError as e:
            report.batch_errors.append((batch, str(await name_unknown_category(cfg, snap, e))))
        except SourceError as e:
            if e.transient:
                raise
            report.batch_errors.append((batch, str(e)))
        report.batches_checked += 1
    report.summarize_batches()
    if cfg.mode == "query" and fetch_seconds:  # the statement's time, spread over the dump's connections
        report.expected_rate = report.connections * size / max(statistics.median(fetch_seconds), 1e-6)
        report.expected_seconds = plan.used / report.expected_rate
    report.epoch_bytes = source.epoch_bytes(size)
    for name, entry in field_entries(source).items():
        shown = {"dtype": entry["dtype"], "shape": entry["shape"]}
        if "null" in entry:
            shown["null"] = entry["null"]["policy"]
        if "categories" in entry:
            shown["categories"] = entry["categories"]
        report.fields[name] = shown


def source_line(s: dict[str, Any]) -> str:
    """One line of a mixed epoch's source: its keys, share, samples this epoch, passes and where it starts."""
    if "keys" not in s:
        return f"source {s['name']}: weight {s['weight']}, not read (weight 0 here and in the epochs before)"
    start = s["start"]
    return (
        f"source {s['name']} ({s['mode']}): {s['keys']:,} keys, weight {s['weight']} ({s['share']:.1%}): "
        f"{s['samples']:,} samples this epoch ({s['passes']:.2f} passes), from pass {start['pass']} at "
        f"{start['index']:,}"
    )


def _mib(n: int) -> str:
    """A memory size as ``--memory`` and container limits take it: binary megabytes."""
    return f"{n / (1 << 20):,.0f} MiB"


def _duration(seconds: float) -> str:
    """``40 min``, ``2.5 h``, ``12 s``: how long, as a person says it."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
