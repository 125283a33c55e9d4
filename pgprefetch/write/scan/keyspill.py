"""Scan mode's keys pass beyond ``[source] memory``: the samples' order on disk, the same order, the same bytes.

A table larger than the budget is read in passes (:mod:`pgprefetch.write.scan.passes`) after a keys pass,
which COPYs the table once: its key and order columns go to the keys, each chunk whole to the data
passes' files (:mod:`pgprefetch.write.scan.partition`). Held in memory the keys cost 8 bytes a column a row, and their
sort, cut and shuffle several times that (73 bytes a row for rows, about 100 a table row for windows), so
a table whose keys outgrow the budget as well has them ordered on disk by the query mode's external sort
(:mod:`pgprefetch.write.order.spill`), not a second one:

1. **Rows** (for ``check``'s plan: a dump of rows beyond memory needs no keys pass, :mod:`.stretches`).
   Every row is a sample: the keys stream from the COPYs into the sort's runs and are ordered on disk as
   the query mode's keys are.
2. **Windows.** Without data passes (a check), the rows stream into runs hashed by their *series* key
   alone, ties broken by (key, order): every bucket then holds whole series, sorted, and is cut into
   windows as a table in memory is (:func:`~pgprefetch.write.scan.table.cut`). A dump splits the rows into
   its data passes by series instead, and each pass is loaded, sorted and cut once
   (:mod:`~pgprefetch.write.scan.cutpasses`). The windows' keys stream into a second sort's runs, hashed
   whole: the epoch's order, as for rows.
3. **Passes.** A series' pass is its bucket in the partition (a hash of its key). Once the samples are
   ordered, each used sample's place in the epoch and key are appended to its pass's file (:func:`_route`);
   each is then found among the windows its pass cut (:func:`~pgprefetch.write.scan.ranks.locate`).

While the keys fit (:func:`bytes_per_row` each), none of this happens: they come back as a sorted
:class:`~pgprefetch.write.scan.table.Table`, the path every scan took before. Disk: about ``8 * (width +
1)`` bytes a row for the first sort (windows), then the query mode's ``8 * (2 * width + 1)`` a sample
and ``8 * (width + 1)`` a used sample for the pass files, in the epoch's keys folder.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.errors import PgprefetchError, SourceError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.session import BatchReader, Snapshot
from pgprefetch.write import heap
from pgprefetch.write.budget import Account
from pgprefetch.write.files.shardfiles import io_errors
from pgprefetch.write.order import shuffle
from pgprefetch.write.order.keyfile import OrderedKeys
from pgprefetch.write.order.spill import MIN_KEYS, KeyCollector, KeyRuns
from pgprefetch.write.plan import order_keys, order_spilled
from pgprefetch.write.scan.copystream import Columns, CopyDecoder
from pgprefetch.write.scan.cutpasses import PassWindows, cut_passes
from pgprefetch.write.scan.partition import Partition
from pgprefetch.write.scan.passes import keys_only
from pgprefetch.write.scan.rowsfile import RowsFile
from pgprefetch.write.scan.shape import ScanShape, copy_select, vocabularies
from pgprefetch.write.scan.table import (
    Table,
    copy_drain_bytes,
    cut,
    longest_series,
    no_windows,
    page_ranges,
    sort_keys,
)

log = logging.getLogger("pgprefetch")


def bytes_per_row(width: int) -> int:
    """What a row's ``width`` key and order slots cost in the in-memory keys pass, at its peak.

    The keys, their sorted copy, the cut samples' keys and the shuffle's index, hash and ordered copy.
    """
    return 32 * width + 48


class _Stopped(PgprefetchError):
    """A COPY of the keys pass stopped because another one failed."""


@dataclass
class SpilledKeys:
    """A keys pass ordered on disk: the epoch's order, and the data passes that fill it."""

    order: dict[str, Any]  # :func:`~pgprefetch.write.plan.order_keys`'s fields, ``keys`` on disk or in memory
    partition: Partition | None  # the table's rows, split into the data passes (None: a check, no passes)
    folder: Path  # the passes' files: <pass>.keys, (place in the epoch, key slots) int64 per used sample
    samples: int  # the samples the keys pass cut
    rows_read: int
    windows: PassWindows | None = None  # each data pass's windows and sorted rows (None: a check)

    @property
    def passes(self) -> int:
        """The data passes (:class:`~pgprefetch.write.scan.partition.Partition`'s)."""
        return self.partition.passes if self.partition is not None else 0

    def wanted(self, p: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Pass ``p``'s used samples: their places in the epoch and their keys ``(width, m)``."""
        path = self.folder / f"{p}.keys"
        if not path.exists():
            return np.empty(0, np.int64), np.empty((width, 0), np.int64)
        records = np.fromfile(path, dtype=np.int64).reshape(-1, width + 1)
        return records[:, 0].copy(), np.ascontiguousarray(records[:, 1:].T)

    def close(self) -> None:
        """Close the ordered key file, if the order is on disk (the folder is removed by whoever chose it)."""
        if isinstance(self.order["keys"], OrderedKeys):
            self.order["keys"].close()


async def keys_pass(
    cfg: Config,
    snap: Snapshot,
    shape: ScanShape,
    epoch: int,
    folder: Path,
    partition: Partition | None,
    on_rows: Callable[[int], None] | None = None,
) -> Table | SpilledKeys:
    """Read the key and order columns of ``shape``: sorted in memory if they fit, else ordered on disk.

    Windows with ``partition`` (a dump): every column is read, and each chunk's rows go to their pass's files
    (the data passes read those, not the table again); see :func:`_windows_pass`. Without it (a check) only
    the keys are read, for the epoch's plan. (Rows beyond memory take neither way: they are split into
    stretches of the epoch's order as they are read, :mod:`pgprefetch.write.scan.stretches`.) ``folder`` (made
    only if the keys spill) takes the sorts' and passes' files; the caller removes it.
    """
    if partition is not None:
        assert cfg.scan_samples.window is not None, "rows beyond memory are read in stretches, not passes"
        return await _windows_pass(cfg, snap, shape, epoch, folder, partition, on_rows)
    account = Account.for_scan(cfg.source.memory_bytes)
    # Half the data's share: the keys held (or a run of them), as a dump's keys pass would hold them.
    budget, seed = account.data // 2, cfg.batches.seed
    n_key, width = shape.n_key, len(shape.key_names)
    limit = budget // bytes_per_row(width)
    rows = KeyCollector(folder / "rows", width, budget, seed=seed, epoch=epoch, limit=limit, hashed=n_key)
    try:
        n_rows = await stream(cfg, snap, keys_only(shape), rows.add, on_rows)
        got = rows.result()
    except BaseException:
        rows.close()
        raise
    if isinstance(got, np.ndarray):
        if not got.shape[1]:
            raise SourceError(f"{shape.relation} has no rows: there is nothing to dump")
        keys, _ = await asyncio.to_thread(sort_keys, got)
        return Table(keys=keys, rows_read=n_rows, nbytes=keys.nbytes)
    heap.release()
    try:
        order, cut_count, buckets = await asyncio.to_thread(_order, cfg, shape, got, folder, epoch, limit)
    finally:
        got.close()
    heap.release()
    log.info(
        "epoch %d: the keys of %s rows outgrew [source] memory: %s samples ordered on disk (%d runs, %d buckets"
        " of series)",
        epoch, f"{n_rows:,}", f"{cut_count:,}", len(got.runs), buckets,
    )  # fmt: skip
    return SpilledKeys(order, None, folder / "passes", cut_count, n_rows)  # a check: no data passes to fill


async def _windows_pass(
    cfg: Config,
    snap: Snapshot,
    shape: ScanShape,
    epoch: int,
    folder: Path,
    partition: Partition,
    on_rows: Callable[[int], None] | None,
) -> SpilledKeys:
    """The keys pass of windows beyond memory: the rows go to the partition only, then each pass's keys are cut.

    A pass holds whole series, so its key and order columns alone, sorted, give its windows: the rows' keys
    are never sorted as a whole, in memory or on disk (by series hash, with its ties, that took most of the
    keys pass). The windows are ordered as :func:`_order` orders them, in memory while they fit.
    """
    budget = Account.for_scan(cfg.source.memory_bytes).data // 2
    limit = budget // bytes_per_row(len(shape.key_names))
    n_rows = await stream(cfg, snap, shape, lambda chunk: None, on_rows, partition, keep=())
    await asyncio.to_thread(partition.settle)
    heap.release()
    rows = RowsFile(partition.folder.parent / "sorted", shape.columns)
    windows = PassWindows(partition.folder.parent / "cut", len(shape.key_names), rows)
    each = cut_passes(cfg, shape, partition, windows)
    order, cut_count, _ = await asyncio.to_thread(_order_windows, cfg, shape, each, folder, epoch, budget, limit)
    heap.release()
    spilled = SpilledKeys(order, partition, folder / "passes", cut_count, n_rows, windows)
    log.info(
        "epoch %d: %s rows outgrew [source] memory: %s windows cut from %d data passes",
        epoch, f"{n_rows:,}", f"{cut_count:,}", partition.passes,
    )  # fmt: skip
    try:
        await asyncio.to_thread(_route, spilled, partition, shape.n_key, budget)
    except BaseException:
        spilled.close()
        raise
    return spilled


def _order(
    cfg: Config, shape: ScanShape, runs: KeyRuns, folder: Path, epoch: int, limit: int
) -> tuple[dict[str, Any], int, int]:
    """The epoch's order of the samples of ``runs`` (rows, or rows to cut into windows); their count; buckets cut.

    The buckets are those of series cut into windows (0 for rows).
    """
    key_columns = KeyColumns(shape.key_names)
    if cfg.scan_samples.window is None:  # the rows are the samples
        return order_spilled(cfg, runs, key_columns, epoch), runs.n, 0
    seed = cfg.batches.seed

    def by_series() -> Iterator[tuple[np.ndarray, int]]:
        for keys, hashes in runs.buckets(limit):  # whole series, by their hash
            if keys.shape[1]:
                bucket = Table(keys=keys[:, shuffle.epoch_order(keys, seed=seed, epoch=epoch, h=hashes)])
                yield cut(bucket, shape, cfg.scan_samples)[0], longest_series(bucket.keys)
        runs.discard()

    return _order_windows(cfg, shape, by_series(), folder, epoch, runs.budget, limit)


def _order_windows(
    cfg: Config,
    shape: ScanShape,
    windows: Iterable[tuple[np.ndarray, int]],
    folder: Path,
    epoch: int,
    budget: int,
    limit: int,
) -> tuple[dict[str, Any], int, int]:
    """The epoch's order of ``windows``: each group of whole series' window keys, and its longest series' rows.

    The groups come from the keys pass's runs, bucketed by series hash, or from the data passes
    (:func:`~pgprefetch.write.scan.cutpasses.cut_passes`), which hold whole series too.
    """
    key_columns = KeyColumns(shape.key_names)
    buckets, longest = 0, 0
    samples = KeyCollector(
        folder / "samples", len(shape.key_names), budget, seed=cfg.batches.seed, epoch=epoch, limit=limit
    )
    try:
        for cut_keys, rows in windows:
            buckets += 1
            longest = max(longest, rows)
            if cut_keys.shape[1]:
                samples.add(np.ascontiguousarray(cut_keys))
            del cut_keys
        got = samples.result()
    except BaseException:
        samples.close()
        raise
    if isinstance(got, np.ndarray):  # the windows fit: ordered in memory, as a table's are
        if not got.shape[1]:
            raise no_windows(cfg.scan_samples, longest)
        order_fields = order_keys(cfg, got, key_columns, epoch, in_place=True)
        order_fields.pop("index")
        return order_fields, got.shape[1], buckets
    try:
        return order_spilled(cfg, got, key_columns, epoch), got.n, buckets
    finally:
        got.close()


def _route(spilled: SpilledKeys, partition: Partition, n_key: int, budget: int) -> None:
    """Append each used sample's place in the epoch and key to its pass's file, in the epoch's order."""
    keys, used = spilled.order["keys"], spilled.order["used"]
    folder = spilled.folder
    shutil.rmtree(folder, ignore_errors=True)  # a killed dump's leftovers: the files are appended to
    with io_errors(folder):
        folder.mkdir(parents=True, mode=0o700)  # the sample keys: for this user only
    width = keys.shape[0]
    step = max(MIN_KEYS, budget // (24 * (width + 1)))  # the keys, their records and the sort: within the budget
    for lo in range(0, used, step):
        hi = min(used, lo + step)
        part = keys.columns(lo, hi) if isinstance(keys, OrderedKeys) else keys[:, lo:hi]
        passes = partition.pass_of(np.ascontiguousarray(part[:n_key]))
        records = np.empty((hi - lo, part.shape[0] + 1), np.int64)
        records[:, 0] = np.arange(lo, hi, dtype=np.int64)
        records[:, 1:] = part.T
        small = passes.astype(np.uint16) if int(passes.max()) < 1 << 16 else passes
        order = np.argsort(small, kind="stable")  # (a radix sort on 16 bits)
        cuts = np.flatnonzero(np.diff(passes[order])) + 1
        with io_errors(folder):
            for chunk in np.split(order, cuts):
                with open(folder / f"{int(passes[chunk[0]])}.keys", "ab") as f:
                    f.write(records[chunk].tobytes())


async def stream(
    cfg: Config,
    snap: Snapshot,
    shape: ScanShape,
    take: Callable[[np.ndarray], None],
    on_rows: Callable[[int], None] | None,
    partition: Partition | None = None,
    keep: tuple[str, ...] | None = None,
) -> int:
    """COPY ``shape`` over page ranges, handing ``take`` its key and order columns as int64 chunks; the rows read.

    ``take`` runs on a thread, one call at a time. ``partition`` takes each decoded chunk whole.
    """
    ranges = await page_ranges(snap, shape, cfg.source.connections)
    drain = copy_drain_bytes(cfg, len(ranges))
    width = len(shape.key_names)
    keep = tuple(f"k{i}" for i in range(width)) if keep is None else keep
    route = partition.add if partition is not None else None
    decoders = [CopyDecoder(shape, on_rows, drain, route=route, keep=keep) for _ in ranges]
    lock = threading.Lock()
    offset = shape.order_offset if shape.order_wire is not None else 0

    def hand(parts: list[Columns]) -> None:
        for p in parts:
            m = p["k0"].size
            if not m:
                continue
            chunk = np.empty((width, m), dtype=np.int64)
            for i in range(width):
                chunk[i] = p[f"k{i}"]
            if offset:
                chunk[-1] += offset
            with lock:
                take(chunk)

    failed: list[BaseException] = []

    def sink(decoder: CopyDecoder) -> Callable[[bytes], Any]:
        async def fed(data: bytes) -> None:
            if failed:
                raise _Stopped("another COPY of the keys pass failed")
            if decoder.feed(data):
                await asyncio.to_thread(decoder.drain)
                parts, decoder.parts = decoder.parts, []
                await asyncio.to_thread(hand, parts)

        return fed

    async def copy(workers: BatchReader, decoder: CopyDecoder, where: str) -> None:
        try:
            await workers.copy(f"reading {shape.relation}", copy_select(shape, where), sink(decoder))
        except _Stopped:
            pass
        except BaseException as e:
            failed.append(e)
            raise

    # Not first_error: a COPY cancelled while its rows stream can make asyncpg log a traceback (a result with
    # no waiter), so after a failure (a full disk) the others stop at their next chunk, from their own sink.
    async with BatchReader.open(cfg.source, snap.id, None, vocabularies=vocabularies(shape)) as workers:
        await asyncio.gather(
            *(copy(workers, d, where) for d, where in zip(decoders, ranges, strict=True)), return_exceptions=True
        )
    if failed:
        raise failed[0]
    for d in decoders:
        await asyncio.to_thread(hand, await asyncio.to_thread(d.finish))
    return sum(d.rows for d in decoders)
