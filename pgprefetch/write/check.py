"""``pgprefetch check``: everything a dump would decide, run against the database, with nothing written.

Users iterate on a config before the first real dump. The check plans epoch 0 on a snapshot exactly as
the dump does (:func:`pgprefetch.write.query.plan_epoch`: the queries described, the keys read, shuffled and
checked for repeats, the categories fixed, against the store's vocabulary when the store exists, which
is read, not written), then fetches a sample of batches spread over the epoch and
decodes them with every type, cast, NULL and range check of the dump (scan mode: from a keys pass and the
checked batches' rows, not the whole table). Problems are collected, one line each, rather than stopping at
the first, so one run shows what to fix; a problem alike in several batches is one line over them.

Under the dump's own ``--memory`` it also predicts that dump: the way it will read, its peak and its time
(:mod:`pgprefetch.write.forecast`), from the same account and the same work, timed: a user sets a container's
limit and a cron interval by them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.config.values import show_size
from pgprefetch.decode.layout import UnknownCategoryError
from pgprefetch.errors import SourceError, StoreError, TransformError
from pgprefetch.pg.session import Snapshot
from pgprefetch.store.open import config_store
from pgprefetch.write.batches import BatchSource
from pgprefetch.write.forecast import (
    IN_MEMORY,
    Forecast,
    TableRead,
    Timed,
    query_forecast,
    scan_forecast,
    unchecked_scan_forecast,
)
from pgprefetch.write.manifest import field_entries
from pgprefetch.write.memory.policy import FLOOR, SLACK, STARTS_ROW_BYTES
from pgprefetch.write.plan import EpochPlan, Vocabulary, name_unknown_category, per_store_notice
from pgprefetch.write.scan.sampled import Sampled, sampled_from_plan, sampled_source, series_share
from pgprefetch.write.scan.shape import sample_text
from pgprefetch.write.scan.strategy.startsheld import refusal as starts_refusal
from pgprefetch.write.scan.table import TableTooLarge
from pgprefetch.write.sources import ReadCache, open_source
from pgprefetch.write.spill.folder import SpillFolder
from pgprefetch.write.tasks import first_error
from pgprefetch.write.transform.stage import transformed

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
    expected_seconds: float | None = None  # the dump's duration (:mod:`.forecast`), from what the check timed
    expected_range: tuple[float, float] | None = None  # its low and high ends
    expected_rate: float | None = None  # samples/s on the config's connections
    connections: int = 0
    rows_read: int | None = None  # scan mode: the table rows the server read for the check
    sources: list[dict[str, Any]] = field(default_factory=list)  # a mixed epoch's: each source's figures
    packing: dict[str, Any] | None = None  # a packed epoch's: sequences, padding, pieces
    memory: int = 0  # ``[source] memory``: the dump's budget
    expected_peak: int | None = None  # the dump's expected peak RSS, bytes (:mod:`.forecast`)
    peak_bound: int | None = None  # what it stays within whatever the table: floor + budget + slack
    way: str | None = None  # how the dump will read: keys in memory or on disk, the table in memory, passes...
    key_width: int = 1  # the key's int64 slots

    def lines(self, verbose: bool = False) -> list[str]:
        """The report as printed; ``verbose``: each checked batch's problems on lines of their own too."""
        out = [*self._epoch_lines(), *self._read_lines(), *self._expected_lines()]
        out += [f"note: {n}" for n in self.notes]
        out += [f"warning: {w}" for w in self.warnings]
        out += [f"error: {e}" for e in self.errors]
        if verbose:
            out += [f"error in batch {b}: {e}" for b, e in self.batch_errors]
        return out

    def _epoch_lines(self) -> list[str]:
        """The keys, the epoch, its sources and its fields."""
        dropped = f" ({self.duplicates_dropped:,} repeated, dropped)" if self.duplicates_dropped else ""
        out = [f"keys: {self.n_keys:,}{dropped}"] if self.n_keys is not None else []
        if self.n_samples is not None and self.n_batches is not None:
            size = f", about {show_size(self.epoch_bytes)} of arrays, uncompressed" if self.epoch_bytes else ""
            batches = f"batch{'es' if self.n_batches != 1 else ''}"
            out.append(f"epoch: {self.n_samples:,} samples in {self.n_batches:,} {batches}{size}")
        out += [source_line(s) for s in self.sources]
        if self.packing is not None:
            out.append(packing_line(self.packing))
        for name, f in self.fields.items():
            extra = "".join(f", {k} {v}" for k, v in f.items() if k not in ("dtype", "shape"))
            out.append(f"field {name}: {f['dtype']} {tuple(f['shape'])} per sample{extra}")
        return out

    def _read_lines(self) -> list[str]:
        """What the check read: the batches it checked, and a scan's rows."""
        out = []
        if self.batches_checked:
            out.append(f"checked {self.batches_checked} batch(es) with every type, cast and NULL check of the dump")
        if self.rows_read is not None:
            out.append(
                f"read: the key columns of every row and the checked batches' rows ({self.rows_read:,} table rows "
                "in all); a dump reads the whole table"
            )
        return out

    def _expected_lines(self) -> list[str]:
        """What a dump is expected to take: its time and its peak memory."""
        out = []
        if self.expected_seconds is not None and self.expected_rate is not None and self.expected_range:
            low, high = self.expected_range
            out.append(
                f"expected: about {_duration(self.expected_seconds)} ({_duration(low)} to {_duration(high)}) at "
                f"{self.expected_rate:,.0f} samples/s on {self.connections} connection(s) (the check's plan and "
                f"{self.batches_checked} batch(es), timed with the dump's batches in flight, times the epoch's)"
            )
        if self.expected_peak is not None and self.peak_bound is not None:
            working = self.expected_peak - FLOOR
            out.append(
                f"memory: a dump's expected peak about {_mib(self.expected_peak)} ({self.way}): {_mib(FLOOR)} for "
                f"the interpreter, {_mib(working)} of --memory {_mib(self.memory)}; at most {_mib(self.peak_bound)} "
                f"with {_mib(SLACK)} of slack"
            )
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
    began = time.perf_counter()  # the dump's clock starts before its snapshot too
    report = CheckReport(connections=cfg.source.connections, memory=cfg.source.memory_bytes)
    budget, size = cfg.source.memory_bytes, cfg.batches.size
    if (cfg.mode == "query" or cfg.packing) and cfg.mix is None:  # the checked batches in flight, as the dump has them
        connections = min(cfg.source.connections, batches)
        cfg = dataclasses.replace(cfg, source=dataclasses.replace(cfg.source, connections=connections))
    forecast: Forecast | None = None
    async with Snapshot.open(cfg.source) as snap:
        try:
            trying = time.perf_counter()
            sampled = await _sampled(cfg, snap, epoch, batches)
            given_up = time.perf_counter() - trying if sampled is None else 0.0  # keys beyond it: not the dump's
            if sampled is not None:  # scan mode: the keys of every row, the data of the checked batches only
                table = _table_read(cfg, sampled, sampled.planned_at - began)
                if sampled.source is None:
                    forecast = _keys_only(cfg, sampled.plan, table, report)
                else:
                    async with with_transforms(cfg, snap, sampled.source, epoch) as source:
                        timed = await _sample(cfg, snap, source, sampled.chosen, report)
                    report.epoch_bytes = sampled.epoch_bytes(size) or report.epoch_bytes  # (windows as starts)
                    _fewer(cfg, report, sampled.plan, sampled.chosen, batches)
                    report.rows_read = sampled.source.rows_read
                    forecast = scan_forecast(budget, sampled.source, size, table, timed)
                    if cfg.store.windows == "starts" and forecast.way != IN_MEMORY and table.rows is not None:
                        width = sampled.plan.key_columns.width  # the dump's refusal, said by the check too
                        report.errors.append(starts_refusal(cfg, "the table", table.rows, table.row_bytes, width))
            else:  # query mode, or a scan whose keys outgrow [source] memory (ordered on disk)
                spill = SpillFolder.temporary(cfg.source.scratch)  # keys beyond --memory: removed after
                opened = open_source(
                    cfg, epoch, snap, ReadCache(), spill=spill, write=False, vocabulary=_vocabulary(cfg)
                )
                with spill:
                    async with opened as got:
                        planned = time.perf_counter() - began - given_up
                        if isinstance(got, EpochPlan):  # a table beyond --memory: its keys read (on disk beyond it)
                            forecast = await _check_beyond(cfg, snap, got, batches, planned, report)
                        else:
                            timed = await _sample(cfg, snap, got, spread(got.plan.n_batches, batches), report)
                            forecast = _source_forecast(cfg, got, planned, timed)
        except (SourceError, StoreError) as e:
            if isinstance(e, SourceError) and e.transient:
                raise
            report.errors.append(str(e))
    _predict(report, forecast)
    report.notes += _per_store_notes(cfg, report)
    return report


def _predict(report: CheckReport, forecast: Forecast | None) -> None:
    """The dump's way, peak and time into the report; none where the check stopped before the epoch was planned."""
    if forecast is None or report.n_keys is None:
        return
    report.way, report.expected_peak = forecast.way, forecast.peak
    report.peak_bound = FLOOR + report.memory + SLACK
    if forecast.seconds is not None and forecast.low is not None and forecast.high is not None and report.n_samples:
        report.expected_seconds, report.expected_range = forecast.seconds, (forecast.low, forecast.high)
        report.expected_rate = report.n_samples / max(forecast.seconds, 1e-6)


async def _check_beyond(
    cfg: Config, snap: Snapshot, plan: EpochPlan, batches: int, planned: float, report: CheckReport
) -> Forecast:
    """A table beyond ``--memory``: the checked batches' series read on their own, or its keys only.

    ``planned``: what its keys took, ordered as the dump orders them (on disk beyond the budget).
    """
    windows = cfg.scan_samples.window is not None
    source, chosen, row_bytes = await sampled_from_plan(cfg, snap, plan, lambda n: spread(n, batches))
    table = TableRead(None, plan.n_keys, windows, row_bytes, 8.0 * plan.key_columns.width, planned, planned)
    if cfg.store.windows == "starts":  # the dump's refusal (the rows: at least a window's stride a sample)
        rows = plan.n_keys * cfg.scan_samples.stride
        report.errors.append(starts_refusal(cfg, "the table", rows, row_bytes, plan.key_columns.width))
    if source is None:
        return _keys_only(cfg, plan, table, report)
    async with with_transforms(cfg, snap, source, plan.epoch) as transformed_source:
        timed = await _sample(cfg, snap, transformed_source, chosen, report)
    _fewer(cfg, report, plan, chosen, batches)
    report.notes.append("the table does not fit --memory: its keys ordered as a dump orders them")
    return scan_forecast(cfg.source.memory_bytes, source, cfg.batches.size, table, timed)


def _keys_only(cfg: Config, plan: EpochPlan, table: TableRead, report: CheckReport) -> Forecast:
    """A scan whose one checked batch's series outgrow the check's share of ``--memory``: the epoch from its keys.

    The dump holds such series a pass at a time, or the table whole where it fits (a row's size from the
    rows read before the read was given up); no batch is decoded or timed.
    """
    report.n_keys, report.duplicates_dropped = plan.n_keys, plan.duplicates_dropped
    report.n_samples, report.n_batches, report.key_width = plan.used, plan.n_batches, plan.key_columns.width
    share = _mib(series_share(cfg.source.memory_bytes))
    report.notes.append(f"one batch's series do not fit half of --memory's data share ({share}): checked the keys only")
    return unchecked_scan_forecast(cfg.source.memory_bytes, plan.key_columns.width, table)


def _fewer(cfg: Config, report: CheckReport, plan: EpochPlan, chosen: list[int], batches: int) -> None:
    """Say so where fewer batches were checked than asked: the asked ones' series outgrew the check's share."""
    asked = len(spread(plan.n_batches, batches))
    if len(chosen) < asked:
        share = _mib(series_share(cfg.source.memory_bytes))
        report.notes.append(
            f"checked {len(chosen)} of {asked} batches: the series of all {asked} do not fit half of --memory's data "
            f"share ({share})"
        )


def _source_forecast(cfg: Config, source: BatchSource, planned: float, timed: Timed | None) -> Forecast:
    """Query mode's forecast; a mixed epoch's and a scan's read whole here count the whole budget.

    A mixed epoch shares the budget among its sources; a scan whose keys pass gave up but whose table then
    fitted was read whole, as the dump reads it. Both are timed as query mode is, from the plan and the batches.
    """
    budget = cfg.source.memory_bytes
    timing = query_forecast(budget, source, cfg.batches.size, planned, timed)
    if cfg.mix is None and cfg.mode == "query":
        return timing
    way = "mixed sources" if cfg.mix is not None else "table in memory"
    return dataclasses.replace(timing, way=way, working=budget)


def _table_read(cfg: Config, sampled: Sampled, planned: float) -> TableRead:
    """What the check's keys pass found of a scan's table, for :func:`~pgprefetch.write.forecast.scan_forecast`."""
    windows = cfg.scan_samples.window is not None
    placing = STARTS_ROW_BYTES if cfg.store.windows == "starts" else 0  # the dump's fit adds the windows' places
    figures = (sampled.row_bytes + placing, sampled.key_bytes, sampled.keys_seconds, planned)
    return TableRead(sampled.rows, sampled.samples, windows, *figures)


async def _sampled(cfg: Config, snap: Snapshot, epoch: int, batches: int) -> Sampled | None:
    """Scan mode's check source (:func:`~pgprefetch.write.scan.sampled.sampled_source`), if its keys fit memory."""
    if cfg.mode != "scan" or cfg.mix is not None or cfg.packing is not None:  # (a packed table: read by key)
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
    store = config_store(cfg)  # a split's: its epochs, and the vocabulary of the store it is in
    return Vocabulary(store if (store.parent or store).exists() else None)


def _per_store_notes(cfg: Config, report: CheckReport) -> list[str]:
    """What the dump will say when it fixes the store's ``"auto"`` codes (a field the store has no codes of yet).

    Said before the first dump, where a user can still share another store's codes instead.
    """
    if cfg.splits is not None:
        return []  # a split's codes are every split's: the store's one vocabulary (docs/splits.md)
    planned = [f.name for f in cfg.fields if f.categories == "auto" and "categories" in report.fields.get(f.name, {})]
    store = _vocabulary(cfg).store if planned else None
    recorded = store.vocabulary() if store is not None else {}
    location = store.location if store is not None else str(cfg.store.path)
    return [
        per_store_notice(name, location, len(report.fields[name]["categories"]), planned=True)
        for name in planned
        if not recorded.get(name)
    ]


def with_transforms(
    cfg: Config, snap: Snapshot, source: BatchSource, epoch: int
) -> AbstractAsyncContextManager[BatchSource]:
    """``source`` with its transforms' outputs, computed and never cached (a check writes nothing)."""
    return transformed(cfg, snap, source, epoch, None, first=False) if cfg.transforms else nullcontext(source)


def spread(n_batches: int, count: int) -> list[int]:
    """``count`` batches (at most all) spread evenly over an epoch of ``n_batches``, first and last included."""
    return sorted({int(b) for b in np.linspace(0, n_batches - 1, min(count, n_batches))})


async def _sample(
    cfg: Config, snap: Snapshot, source: BatchSource, chosen: list[int], report: CheckReport
) -> Timed | None:
    """Produce the batches ``chosen`` with every check of the dump, collecting the errors; time them.

    As the dump has them: ``source.concurrency`` fetched at once, produced on ``source.threads`` threads,
    so that what they took, times the epoch's batches, is the dump's time on this server and machine. None
    where a batch failed (its time is not a batch's).
    """
    plan, size = source.plan, cfg.batches.size
    report.n_keys, report.duplicates_dropped = plan.n_keys, plan.duplicates_dropped
    report.key_width = plan.key_columns.width
    report.n_samples, report.n_batches = plan.used, plan.n_batches
    report.warnings += source.warnings
    if source.records and "mix" in source.records:
        report.sources = source.records["mix"]["sources"]
    if source.records and "packing" in source.records:
        report.packing = source.records["packing"]
    in_flight = asyncio.Semaphore(max(1, source.concurrency))
    free: asyncio.Queue[dict[str, np.ndarray]] = asyncio.Queue()
    for _ in range(max(1, source.threads)):
        free.put_nowait(source.allocate(size, 1))
    fetches: list[float] = []
    produces: list[float] = []
    unknown: list[tuple[int, UnknownCategoryError]] = []
    skipped: list[str] = []

    def produce(batch: int, fetched: object, buffers: dict[str, np.ndarray]) -> None:
        # Timed on its thread: the hand-off to it is a unit's in the dump, where a unit may be many batches.
        started = time.perf_counter()
        source.produce(batch, 1, fetched, buffers)
        produces.append(time.perf_counter() - started)

    async def check_batch(batch: int) -> None:
        try:
            async with in_flight:
                started = time.perf_counter()
                fetched = await source.fetch(batch, 1)
                fetches.append(time.perf_counter() - started)
            buffers = await free.get()
            try:
                await asyncio.to_thread(produce, batch, fetched, buffers)
            finally:
                free.put_nowait(buffers)
        except UnknownCategoryError as e:  # named after the others: the snapshot's connection is one
            unknown.append((batch, e))
        except SourceError as e:
            if e.transient:
                raise
            report.batch_errors.append((batch, str(e)))
        except TransformError as e:  # the dump would stop there: the sample and the transform named
            if e.transform is not None and cfg.transform(e.transform).on_error == "skip":
                skipped.append(f"batch {batch}: {str(e).split(' (on_error', 1)[0]}")  # the dump leaves them out
            else:
                report.batch_errors.append((batch, str(e)))
        report.batches_checked += 1

    await first_error(_warm(source) for _ in range(min(source.concurrency, len(chosen))))
    started = time.perf_counter()
    await first_error(check_batch(batch) for batch in chosen)
    wall = time.perf_counter() - started
    lookup = sample_text(cfg, snap) if cfg.mode == "scan" and cfg.mix is None else None  # (else query mode's)
    for batch, e in unknown:
        report.batch_errors.append((batch, str(await name_unknown_category(cfg, snap, e, lookup))))
    report.batch_errors.sort(key=lambda found: found[0])
    if skipped:
        report.notes.append(
            f'{len(skipped)} checked batch(es) hold samples a transform with on_error = "skip" fails on, which '
            f"the dump leaves out; e.g. {sorted(skipped)[0]}"
        )
    report.summarize_batches()
    report.epoch_bytes = source.epoch_bytes(size)
    _fields(source, report)
    if report.batch_errors or not produces:
        return None
    concurrency = min(source.concurrency, len(chosen))
    fetched = cfg.mode == "query" or cfg.mix or cfg.packing  # (the batches' fetches are timed in waves)
    waves = await _fetch_waves(source, chosen, concurrency, wall) if fetched else ()
    return Timed(wall, tuple(fetches), tuple(produces), concurrency, source.threads, waves)


FETCH_WAVES = 3  # further waves of fetches the check times, at most ...
FETCH_WAVES_SECONDS = 0.25  # ... and only while the waves so far took less than this


async def _fetch_waves(source: BatchSource, chosen: list[int], concurrency: int, spent: float) -> tuple[float, ...]:
    """A batch's time in each of a few further waves of ``concurrency`` fetches (the batches after the checked).

    Fetched and dropped, not checked: their time only, where the checked wave was short (``spent``), so that
    one hiccup of a shared machine does not make the figure. A wave that fails is not counted.
    """

    async def fetch(batch: int) -> None:
        await source.fetch(batch, 1)

    waves = []
    for shift in range(1, FETCH_WAVES + 1):
        if spent >= FETCH_WAVES_SECONDS:
            break
        batches = [(b + shift) % source.plan.n_batches for b in chosen][:concurrency]
        started = time.perf_counter()
        try:
            await first_error(fetch(b) for b in batches)
        except SourceError as e:
            if e.transient:
                raise
            break
        except TransformError:  # (not a checked batch: its samples are not the check's to report)
            break
        took = time.perf_counter() - started
        spent += took
        waves.append(took / len(batches))
    return tuple(waves)


async def _warm(source: BatchSource) -> None:
    """Fetch the first batch once on a connection, untimed: as the dump's are, after their first statement.

    A fresh server process pays for its first statement (the catalog read, the first plans); the dump pays
    it once a connection, a check timed on cold connections would charge it to every batch. Its errors are
    the checked batches' to report (the first batch is one of them).
    """
    try:
        await source.fetch(0, 1)
    except SourceError as e:
        if e.transient:
            raise
    except TransformError:
        pass


def _fields(source: BatchSource, report: CheckReport) -> None:
    """Each field's dtype and shape per sample, and its NULL policy and categories where it has them."""
    for name, entry in field_entries(source).items():
        shown = {"dtype": entry["dtype"], "shape": entry["shape"]}
        if "null" in entry:
            shown["null"] = entry["null"]["policy"]
        if "categories" in entry:
            shown["categories"] = entry["categories"]
        if "categories_from" in entry:
            shown["categories from"] = entry["categories_from"]
        if "transform" in entry:
            shown["transform"] = entry["transform"]
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


def packing_line(p: dict[str, Any]) -> str:
    """A packed epoch's line: documents into sequences, their tokens, padding, and the documents cut."""
    return (
        f"packing: {p['documents']:,} documents ({p['tokens']:,} tokens) into {p['sequences']:,} sequences of "
        f"{p['length']:,} ({p['method']}): padding {p['padding']:,} tokens ({p['padding_share']:.3%}), "
        f"{p['pieces']:,} pieces, {p['documents_cut']:,} documents cut, at most {p['max_segments']} a sequence"
    )


def _mib(n: int) -> str:
    """A memory size as ``--memory`` and container limits take it: binary megabytes."""
    return f"{n / (1 << 20):,.0f} MiB"


def _duration(seconds: float) -> str:
    """``40 min``, ``2.5 h``, ``12 s``: how long, as a person says it."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
