"""Rows beyond ``[source] memory``, read once and put in the epoch's order a stretch at a time.

The epoch's order is by a 64-bit hash of each sample's key (:mod:`pgprefetch.write.order.shuffle`), so the
rows are split by ranges of that hash as the table is read (:class:`~pgprefetch.write.scan.partition.EpochRanges`):
the rows of one range are one stretch of the epoch, and the ranges in turn are the whole of it. Each stretch
is loaded and put in order by :func:`~pgprefetch.write.order.shuffle.order_part` (which orders a part holding
every key of a hash range exactly as it orders the whole, repeats and ``fraction`` included), and its samples
are gathered, cast and appended to the samples' file (:class:`SampleFiles`): the epoch, in order, on local
disk. The writer then reads batch ``b`` as one range of that file, and its keys from the ordered key file.
Windows cannot be read this way: a window needs every row of its series, and a series' windows are spread
over the whole epoch (:mod:`.passes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.decode.layout import BatchLayout
from pgprefetch.errors import SourceError
from pgprefetch.pg.session import Snapshot
from pgprefetch.write import memory
from pgprefetch.write.batches import BatchSource, local_unit_batches
from pgprefetch.write.memory import heap
from pgprefetch.write.memory.policy import Policy
from pgprefetch.write.order.keyfile import OrderedKeys
from pgprefetch.write.order.shuffle import Repeats, order_part
from pgprefetch.write.order.splits import split_keep
from pgprefetch.write.plan import EpochPlan, ordered_fields
from pgprefetch.write.scan.partition import EpochRanges, Partition, bucket_count
from pgprefetch.write.scan.shape import ScanShape
from pgprefetch.write.scan.strategy.job import ScanJob, SplitRead
from pgprefetch.write.scan.table import Table, array_lengths, assemble, cut, gather
from pgprefetch.write.scan.whole import scan_plan
from pgprefetch.write.spill.columns import ColumnFile
from pgprefetch.write.spill.folder import SpillFolder

log = logging.getLogger("pgprefetch")


class SampleFiles:
    """An epoch's samples in order on local disk: a column a batch array, appended a stretch's gather at a time.

    Read back a unit of batches at a time with ``pread`` (the pages go through the page cache, never into the
    dump's RSS).
    """

    def __init__(self, folder: SpillFolder, arrays: list[tuple[str, np.dtype, tuple[int, ...]]]) -> None:
        self.file = ColumnFile(folder.create("samples"), {name: (dtype, shape) for name, dtype, shape in arrays})

    @property
    def n(self) -> int:
        """The samples written."""
        return self.file.rows

    def append(self, out: dict[str, np.ndarray], n: int) -> None:
        """Add the first ``n`` samples of ``out`` (one row a sample per array) after those already written."""
        self.file.append({name: out[name][:n] for name in self.file.schema})

    def read(self, first: int, n: int, out: dict[str, np.ndarray]) -> None:
        """Fill the first ``n`` rows of each array of ``out`` with samples ``first .. first + n``."""
        self.file.read(first, first + n, out=out)

    def close(self) -> None:
        """Close the file (it goes with the spill folder)."""
        self.file.close()


@contextlib.asynccontextmanager
async def stretch_source(
    cfg: Config, snap: Snapshot, shape: ScanShape, ranges: EpochRanges, epoch: int, spill: SpillFolder, rows_read: int
) -> AsyncIterator[BatchSource]:
    """The batch source of rows beyond memory: each stretch ordered and written out, then the batches read back.

    ``ranges`` holds every row, split by ranges of ``epoch``'s order. The ordered keys' and the samples' files
    stay open while the batches are written, and are closed after.
    """
    assert ranges.epoch == epoch, "the rows were split by this epoch's order"
    key_columns = shape.key_columns
    width = len(shape.key_names)
    drop_last = cfg.batches.drop_last
    folder = spill.sub("stretches")  # the ordered keys' file and the samples' file
    keys = OrderedKeys(folder, "keys", width, cfg.batches.size if drop_last else 1)
    files: SampleFiles | None = None
    found: list[Repeats] = []
    account = Policy.for_scan(cfg.source.memory_bytes)
    layout: BatchLayout | None = None
    cutting = memory.current().reserve("stretches", account.cutting_bytes())  # freed once every one is written
    try:
        for p in range(ranges.passes):
            table = await asyncio.to_thread(_load, shape, ranges, p)
            if not table.keys.shape[1]:
                continue
            if layout is None:
                layout = BatchLayout.build(
                    cfg.fields, shape.columns, shape.by_field, array_lengths(table), cfg.samples.rows, key_columns
                )
                files = SampleFiles(folder, layout.arrays())
            assert files is not None
            await asyncio.to_thread(_stretch, cfg, layout, table, shape, epoch, keys, files, found, account)
            del table
            heap.release()
        if layout is None or files is None:
            raise SourceError(f"{shape.relation} has no rows: there is nothing to dump")
        fields = ordered_fields(cfg, key_columns, ranges.rows, keys, Repeats.merged(found, width))
    except BaseException:
        keys.close()
        if files is not None:
            files.close()
        raise
    finally:
        ranges.remove()
        cutting.free()
    log.info(
        "epoch %d: %s rows outgrew [source] memory: read once, in %d stretches of the epoch's order",
        epoch, f"{ranges.rows:,}", ranges.passes,
    )  # fmt: skip
    plan = scan_plan(shape, epoch, fields)
    try:
        yield _source(cfg, plan, layout, files, snap, rows_read)
    finally:
        keys.close()
        files.close()


def _load(shape: ScanShape, ranges: EpochRanges, p: int) -> Table:
    """Stretch ``p``'s rows as they came: :func:`~.order_part` puts them in order, a sort by key first is not needed."""
    return assemble(shape, ranges.load(p), empty_ok=True, by_key=False)


def _stretch(
    cfg: Config,
    layout: BatchLayout,
    table: Table,
    shape: ScanShape,
    epoch: int,
    keys: OrderedKeys,
    files: SampleFiles,
    found: list[Repeats],
    account: Policy,
) -> None:
    """Order one stretch's samples, append their keys to ``keys`` and their gathered samples to ``files``."""
    sample_keys, starts = cut(table, shape, cfg.scan_samples)
    seed, fraction = cfg.batches.seed, cfg.samples.fraction
    order, repeats = order_part(
        sample_keys, seed=seed, epoch=epoch, fraction=fraction, keep=split_keep(cfg, shape.key_columns)
    )
    if repeats.count:
        found.append(repeats)
    keys.append(sample_keys, order)
    chunk = account.gather_samples(layout.sample_bytes)
    for lo in range(0, order.size, chunk):
        at = order[lo : lo + chunk]
        out = layout.allocate(at.size)  # fresh zeros: a padded array's tail is zero (collate.fill relies on it)
        gather(table, layout, starts[at], np.ascontiguousarray(sample_keys[:, at]), out)
        files.append(out, at.size)
        del out


def _source(
    cfg: Config, plan: EpochPlan, layout: BatchLayout, files: SampleFiles, snap: Snapshot, rows_read: int
) -> BatchSource:
    """Batches read back from the samples' files: a unit's batches are one range of each file."""
    size = cfg.batches.size

    async def fetch(batch: int, count: int) -> object:
        return None

    def produce(batch: int, count: int, _: object, buffers: dict[str, np.ndarray]) -> None:
        first = batch * size
        files.read(first, max(0, min(count * size, plan.used - first)), buffers)

    unit = min(local_unit_batches(size, layout.sample_bytes, cfg.source.memory_bytes), plan.n_batches)
    return BatchSource(plan, layout, snap.id, snap.server_version, rows_read, fetch, produce, 2, 2, unit)


class InStretches(SplitRead[BatchSource]):
    """Rows beyond memory: the table split by ranges of the epoch's order as it is read, then a stretch at a time."""

    name = "rows in stretches of the epoch's order"

    def partition(self, job: ScanJob) -> EpochRanges:
        """Ranges of the epoch's order for the estimated rows, each a stretch's share of the budget."""
        policy = Policy.for_scan(job.cfg.source.memory_bytes)
        row_bytes = max(1.0, job.guess.row_bytes)
        room = policy.stretch_bytes(row_bytes)
        buckets = bucket_count(job.guess.rows, row_bytes, room)
        hold = policy.partition_hold_bytes()
        seed = job.cfg.batches.seed
        return EpochRanges(job.spill.sub("ranges"), buckets, job.shape.n_key, room, hold, seed=seed, epoch=job.epoch)

    @contextlib.asynccontextmanager
    async def open_from(self, job: ScanJob, partition: Partition, rows_read: int) -> AsyncIterator[BatchSource]:
        """The batch source of rows all in ``partition`` (ranges of the epoch's order)."""
        assert isinstance(partition, EpochRanges), "rows are split by ranges of the epoch's order"
        await asyncio.to_thread(partition.settle)
        async with stretch_source(job.cfg, job.snap, job.shape, partition, job.epoch, job.spill, rows_read) as source:
            yield source
