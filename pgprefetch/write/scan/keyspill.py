"""The epoch's order of a scan's samples when their keys outgrow ``[source] memory``: the same order, on disk.

Held in memory the keys cost 8 bytes a column a row, and their sort, cut and shuffle several times that
(:func:`bytes_per_row`), so keys beyond the budget are ordered by the query mode's external sort
(:mod:`pgprefetch.write.order.spill`), not a second one:

- **A check's keys pass** (:func:`keys_pass`): rows stream into the sort's runs as keys; windows into runs
  hashed by their *series* key alone, so that every bucket holds whole series, cut into windows as a table
  in memory is.
- **A dump's windows** (:func:`cut_passes_and_order`): the table's rows were split by series into the data
  passes' files as they were read; each pass is loaded, sorted and cut once (:mod:`.cutpasses`), and its
  windows' keys stream into the sort, each window's start row in the passes' rows file carried beside its
  key (a payload slot, neither hashed nor compared), so the epoch's order gives each batch its rows.

While the keys fit, none of this happens: they come back as a sorted
:class:`~pgprefetch.write.scan.table.Table`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.errors import SourceError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.session import Snapshot
from pgprefetch.write import memory
from pgprefetch.write.memory import heap
from pgprefetch.write.memory.policy import Policy
from pgprefetch.write.order import shuffle
from pgprefetch.write.order.keyfile import OrderedKeys
from pgprefetch.write.order.spill import KeyCollector, KeyRuns
from pgprefetch.write.plan import order_keys, order_spilled
from pgprefetch.write.scan.copyread import copy_ranges, key_chunk
from pgprefetch.write.scan.copystream import Columns, CopyDecoder
from pgprefetch.write.scan.cutpasses import cut_passes
from pgprefetch.write.scan.partition import Partition
from pgprefetch.write.scan.rowsfile import RowsFile
from pgprefetch.write.scan.shape import ScanShape, keys_only
from pgprefetch.write.scan.table import (
    Table,
    cut,
    longest_series,
    no_windows,
    page_ranges,
    sort_keys,
)
from pgprefetch.write.spill.folder import SpillFolder

log = logging.getLogger("pgprefetch")


def bytes_per_row(width: int) -> int:
    """What a row's ``width`` key and order slots cost in the in-memory keys pass, at its peak.

    The keys, their sorted copy, the cut samples' keys and the shuffle's index, hash and ordered copy.
    """
    return 32 * width + 48


@dataclass
class SpilledKeys:
    """A keys pass ordered on disk: the epoch's order, and for a dump of windows the rows that fill it."""

    order: dict[str, Any]  # :func:`~pgprefetch.write.plan.order_keys`'s fields, ``keys`` on disk or in memory
    partition: Partition | None  # the table's rows, split into the data passes (None: a check, no passes)
    samples: int  # the samples the keys pass cut
    rows_read: int
    rows: RowsFile | None = None  # the data passes' sorted rows (None: a check)
    starts: np.ndarray | None = None  # each sample's start row in them, in the epoch's order, if held

    def start_rows(self, start: int, end: int) -> np.ndarray:
        """The start rows (in :attr:`rows`) of the epoch's samples ``start`` to ``end``."""
        keys: np.ndarray | OrderedKeys = self.order["keys"]
        if isinstance(keys, OrderedKeys):  # carried through the sort on disk
            return keys.payload(start, end).reshape(-1)  # (one payload slot)
        assert self.starts is not None, "a dump's windows carry their start rows through the order"
        return self.starts[start:end]

    @property
    def held(self) -> int:
        """The bytes of the epoch's order held in memory (none when it is on disk)."""
        keys = self.order["keys"]
        return 0 if isinstance(keys, OrderedKeys) else keys.nbytes + (0 if self.starts is None else self.starts.nbytes)

    def close(self) -> None:
        """Close the ordered key file, if the order is on disk (the folder is removed by whoever chose it)."""
        if isinstance(self.order["keys"], OrderedKeys):
            self.order["keys"].close()


async def keys_pass(
    cfg: Config,
    snap: Snapshot,
    shape: ScanShape,
    epoch: int,
    spill: SpillFolder,
    on_rows: Callable[[int], None] | None = None,
) -> Table | SpilledKeys:
    """Read the key and order columns of ``shape`` (a check): sorted in memory if they fit, else ordered on disk.

    ``spill`` (made only if the keys spill) takes the sorts' files; the caller removes it.
    """
    account = Policy.for_scan(cfg.source.memory_bytes)
    # Half the data's share: the keys held (or a run of them), as a dump's keys pass would hold them.
    budget, seed = account.keys_bytes(beside_rows=True), cfg.batches.seed
    n_key, width = shape.n_key, len(shape.key_names)
    limit = budget // bytes_per_row(width)
    rows = KeyCollector(spill.sub("rows"), width, budget, seed=seed, epoch=epoch, limit=limit, hashed=n_key)
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
        order, cut_count, buckets, _ = await asyncio.to_thread(_order, cfg, shape, got, spill, epoch, limit)
    finally:
        got.close()
    heap.release()
    log.info(
        "epoch %d: the keys of %s rows outgrew [source] memory: %s samples ordered on disk (%d runs, %d buckets"
        " of series)",
        epoch, f"{n_rows:,}", f"{cut_count:,}", len(got.runs), buckets,
    )  # fmt: skip
    return SpilledKeys(order, None, cut_count, n_rows)  # a check: no data passes to fill


async def cut_passes_and_order(
    cfg: Config, shape: ScanShape, epoch: int, spill: SpillFolder, partition: Partition, n_rows: int
) -> SpilledKeys:
    """Windows beyond memory, once the table's rows are split into ``partition``: each pass cut, the windows ordered.

    A pass holds whole series, so its rows, sorted, give its windows: the rows' keys are never sorted as a
    whole, in memory or on disk. The windows are ordered as :func:`_order` orders them, in memory while they
    fit, each with its start row in the passes' sorted rows carried along.
    """
    budget = Policy.for_scan(cfg.source.memory_bytes).keys_bytes(beside_rows=True)
    limit = budget // bytes_per_row(len(shape.key_names) + 1)
    await asyncio.to_thread(partition.settle)
    heap.release()
    rows = RowsFile(spill.sub("sorted"), shape.columns)
    each = cut_passes(cfg, shape, partition, rows)
    try:
        order, cut_count, _, starts = await asyncio.to_thread(
            _order_windows, cfg, shape, each, spill, epoch, budget, limit, 1
        )
    except BaseException:
        rows.close()
        raise
    heap.release()
    log.info(
        "epoch %d: %s rows outgrew [source] memory: %s windows cut from %d data passes",
        epoch, f"{n_rows:,}", f"{cut_count:,}", partition.passes,
    )  # fmt: skip
    return SpilledKeys(order, partition, cut_count, n_rows, rows, None if starts is None else starts[0])


_Ordered = tuple[dict[str, Any], int, int, np.ndarray | None]


def _order(cfg: Config, shape: ScanShape, runs: KeyRuns, spill: SpillFolder, epoch: int, limit: int) -> _Ordered:
    """The epoch's order of the samples of ``runs`` (rows, or rows to cut into windows); see :func:`_order_windows`.

    The buckets are those of series cut into windows (0 for rows).
    """
    key_columns = KeyColumns(shape.key_names)
    if cfg.scan_samples.window is None:  # the rows are the samples
        return order_spilled(cfg, runs, key_columns, epoch), runs.n, 0, None
    seed = cfg.batches.seed

    def by_series() -> Iterator[tuple[np.ndarray, int]]:
        for keys, hashes in runs.buckets(limit):  # whole series, by their hash
            if keys.shape[1]:
                bucket = Table(keys=keys[:, shuffle.epoch_order(keys, seed=seed, epoch=epoch, h=hashes)])
                yield cut(bucket, shape, cfg.scan_samples)[0], longest_series(bucket.keys)
        runs.discard()

    return _order_windows(cfg, shape, by_series(), spill, epoch, runs.budget, limit)


def _order_windows(
    cfg: Config,
    shape: ScanShape,
    windows: Iterable[tuple[np.ndarray, int]],
    spill: SpillFolder,
    epoch: int,
    budget: int,
    limit: int,
    payload: int = 0,
) -> _Ordered:
    """The epoch's order of ``windows``: each group of whole series' window keys, and its longest series' rows.

    The groups come from the keys pass's runs, bucketed by series hash, or from the data passes
    (:func:`~pgprefetch.write.scan.cutpasses.cut_passes`), which hold whole series too. A window's last
    ``payload`` slots are carried, not ordered by (its start row). Returns :func:`~pgprefetch.write.plan.order_keys`'s
    fields but ``index`` (``keys`` in memory, or on disk with the payload beside them), the windows cut, the
    groups, and the payload in the epoch's order when it is held (ordered in memory).
    """
    key_columns = KeyColumns(shape.key_names)
    width = len(shape.key_names)
    buckets, longest = 0, 0
    samples = KeyCollector(
        spill.sub("samples"), width, budget, seed=cfg.batches.seed, epoch=epoch, limit=limit, payload=payload
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
            raise no_windows(cfg.scan_samples, longest, shape)
        order_fields = order_keys(cfg, got[:width], key_columns, epoch, in_place=True)
        index = order_fields.pop("index")
        carried = got[width:]
        if index.size == got.shape[1]:
            for slot in carried:  # as the keys: in place, a slot at a time
                slot[:] = slot[index]
        else:
            carried = carried[:, index]
        return order_fields, got.shape[1], buckets, carried if payload else None
    try:
        return order_spilled(cfg, got, key_columns, epoch), got.n, buckets, None
    finally:
        got.close()


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
    policy = Policy.for_scan(cfg.source.memory_bytes)
    drain = policy.copy_drain_bytes(len(ranges), into_partition=partition is not None)
    width = len(shape.key_names)
    keep = tuple(f"k{i}" for i in range(width)) if keep is None else keep
    route = partition.add if partition is not None else None
    decoders = [CopyDecoder(shape, on_rows, drain, route=route, keep=keep) for _ in ranges]
    offset = shape.order_offset if shape.order_wire is not None else 0

    def hand(parts: list[Columns]) -> None:
        for chunk in key_chunk(parts, width, offset):
            take(chunk)

    with memory.current().reserve("copy", drain * len(ranges)):
        await copy_ranges(cfg.source, snap.id, shape, ranges, decoders, take=hand)
    return sum(d.rows for d in decoders)
