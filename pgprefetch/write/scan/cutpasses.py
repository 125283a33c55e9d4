"""The data passes of windows beyond memory, each loaded once: sorted, cut, and its rows kept for the batches.

A table of windows larger than ``[source] memory`` is split by series into the data passes' files as it is
read (:mod:`.partition`). Each pass is loaded once (:func:`cut_passes`): its rows joined and sorted by
(key, order), cut into windows, and the sorted rows appended to the rows file (:mod:`.rowsfile`). Each
window's key goes on to be ordered (:mod:`.keyspill`) with its start row in the rows file carried beside it,
so the epoch's order hands the batches their windows' start rows directly, and no pass is read twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.errors import SourceError
from pgprefetch.keys import KeyColumns
from pgprefetch.write import memory
from pgprefetch.write.memory import heap
from pgprefetch.write.memory.policy import ESTIMATE_MARGIN, PASS_COPIES, least_budget, smallest_budget
from pgprefetch.write.scan.partition import Partition, pass_table
from pgprefetch.write.scan.rowsfile import RowsFile
from pgprefetch.write.scan.shape import ScanShape
from pgprefetch.write.scan.table import Table, cut, longest_series


def cut_passes(cfg: Config, shape: ScanShape, partition: Partition, rows: RowsFile) -> Iterator[tuple[np.ndarray, int]]:
    """Each data pass loaded, sorted and cut, its rows appended to ``rows``: its windows, its longest series.

    A pass's windows come as ``(width + 1, m)`` int64: each window's key, then its start row in ``rows``. The
    longest series' rows are for the error of an epoch without a window. A pass's file goes once it is
    loaded. Raises :class:`SourceError` for a series larger than a pass may be.
    """
    loaded = memory.current().reserve("pass")  # a pass's rows at a time, PASS_COPIES of them at the peak
    for p in range(partition.passes):
        loaded.resize(PASS_COPIES * partition.room)
        table = pass_table(shape, partition, p)
        check_pass_fits(cfg, shape, table, partition)
        keys, starts = cut(table, shape, cfg.scan_samples)
        windows = np.empty((keys.shape[0] + 1, keys.shape[1]), np.int64)
        windows[:-1] = keys
        windows[-1] = starts
        windows[-1] += rows.rows
        del keys, starts
        if table.keys.shape[1]:  # (a bucket no series hashed to has no columns either)
            rows.append(table)
        longest = longest_series(table.keys)
        del table
        heap.release()
        yield windows, longest
    loaded.free()


def check_pass_fits(
    cfg: Config,
    shape: ScanShape,
    table: Table,
    partition: Partition,
    *,
    budget: int | None = None,
    least: Callable[[int], int] | None = None,
    where: str = "[samples]",
) -> None:
    """Refuse a pass that is one series larger than a pass may be: no budget split could make it fit.

    A pass of several series larger than its share (an unlucky hash) is read as it is; one series is the
    least a pass can hold, since its windows cannot be split from its rows. The refusal names ``budget``
    (default: ``[source] memory``) and the least ``--memory`` that reads the table: in passes large enough
    for the series, or whole in memory where that takes less (:func:`least_reading`); ``least`` of that
    where a mixed epoch's source has a share of the ``--memory`` named.
    """
    rows = table.keys.shape[1]
    if cfg.scan_samples.window is None or table.nbytes <= 2 * partition.room or longest_series(table.keys) < rows:
        return
    need = least_reading(cfg, table.nbytes, partition.rows, partition.row_bytes, len(shape.key_names))
    need = least(need) if least is not None else need
    named = cfg.source.memory_bytes if budget is None else budget
    raise SourceError(
        f"{where} table: series ({KeyColumns(shape.key_names[:-1]).show(table.keys[:-1, 0])}) has {rows:,} rows "
        f"({table.nbytes / 2**20:,.1f} MiB decoded), more than a data pass holds under [source] memory "
        f"{named / 2**20:,.0f} MiB; the least budget that reads it is --memory {need >> 20}MiB"
    )


def least_reading(cfg: Config, series_bytes: int, rows: int, row_bytes: int, width: int) -> int:
    """The least budget that reads a table of ``rows`` rows whose largest series has ``series_bytes``.

    In passes, a pass must hold the series; whole, the table and its epoch must fit (with the margin an
    estimate is given: the rows' size in the partition is not quite their size in a read).
    """
    passes = smallest_budget(series_bytes)
    stride = cfg.scan_samples.stride if cfg.scan_samples.window is not None else 1
    n = int(rows * ESTIMATE_MARGIN)
    whole = least_budget(lambda policy: policy.fits_in_memory(n, row_bytes, -(-n // stride), width))
    return min(passes, whole)
