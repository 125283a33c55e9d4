"""The data passes of windows beyond memory, each loaded once: sorted, cut, and its rows kept for the batches.

A table of windows larger than ``[source] memory`` is split by series into the data passes' files as it is
read (:mod:`.partition`). Each pass is then loaded once (:func:`cut_passes`): its rows joined and sorted by
(key, order), cut into windows, the sorted rows appended to the rows file (:mod:`.rowsfile`), and each
window's key and start row there saved beside it (:class:`PassWindows`). The windows' keys go on to be
ordered (:mod:`.keyspill`); each used window's start row is then found by its key (:mod:`.multipass`) and the
batches are gathered from the rows file (:mod:`.sweep`).

Once: the keys pass used to read and sort each pass's key columns to cut its windows, and the data passes
then loaded, sorted and cut the same rows again to find them (a third of the time beyond memory).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.errors import SourceError
from pgprefetch.keys import KeyColumns
from pgprefetch.pg.columns import Column
from pgprefetch.write import heap
from pgprefetch.write.budget import smallest_budget
from pgprefetch.write.files.shardfiles import io_errors
from pgprefetch.write.scan.partition import Partition, pass_table
from pgprefetch.write.scan.passes import fresh_folder
from pgprefetch.write.scan.rowsfile import RowsFile
from pgprefetch.write.scan.shape import ScanShape
from pgprefetch.write.scan.table import Table, array_lengths, cut, longest_series


@dataclass
class PassWindows:
    """Each data pass's windows on local disk: their keys, in key order, and their start rows in :attr:`rows`."""

    folder: Path  # <pass>.cut: (start row, key slots) int64 per window
    width: int
    rows: RowsFile  # every pass's sorted rows, one after another
    lengths: dict[Column, int] = field(default_factory=dict)  # the array columns' element counts

    def __post_init__(self) -> None:
        fresh_folder(self.folder)

    def save(self, p: int, keys: np.ndarray, starts: np.ndarray) -> None:
        """Keep pass ``p``'s windows: ``keys`` ``(width, m)`` in key order and their start rows."""
        records = np.empty((starts.size, self.width + 1), np.int64)
        records[:, 0] = starts
        records[:, 1:] = keys.T
        with io_errors(self.folder), open(self.folder / f"{p}.cut", "wb") as f:
            f.write(records.data)

    def load(self, p: int) -> tuple[np.ndarray, np.ndarray]:
        """Pass ``p``'s windows as saved: their keys ``(width, m)`` and start rows; the file is removed."""
        path = self.folder / f"{p}.cut"
        if not path.exists():  # a pass without rows
            return np.empty((self.width, 0), np.int64), np.empty(0, np.int64)
        with io_errors(self.folder):
            records = np.fromfile(path, np.int64).reshape(-1, self.width + 1)
            path.unlink()
        return np.ascontiguousarray(records[:, 1:].T), records[:, 0].copy()


def cut_passes(
    cfg: Config, shape: ScanShape, partition: Partition, windows: PassWindows
) -> Iterator[tuple[np.ndarray, int]]:
    """Each data pass loaded, sorted and cut, its rows and windows kept: its windows' keys, its longest series.

    The longest series' rows are for the error of an epoch without a window. A pass's file goes once it is
    loaded. Raises :class:`SourceError` for a series larger than a pass may be.
    """
    for p in range(partition.passes):
        table = pass_table(shape, partition, p)
        _check_pass_fits(cfg, shape, table, partition.room)
        keys, starts = cut(table, shape, cfg.scan_samples)
        if table.keys.shape[1]:  # (a bucket no series hashed to has no columns either)
            if not windows.rows.rows:
                windows.lengths = array_lengths(table)
            windows.save(p, keys, windows.rows.rows + starts)
            windows.rows.append(table)
        longest = longest_series(table.keys)
        del table, starts
        heap.release()
        yield keys, longest


def _check_pass_fits(cfg: Config, shape: ScanShape, table: Table, room: int) -> None:
    """Refuse a pass that is one series larger than a pass may be: no budget split could make it fit.

    A pass of several series larger than its share (an unlucky hash) is read as it is; one series is the
    least a pass can hold, since its windows cannot be split from its rows.
    """
    rows = table.keys.shape[1]
    if cfg.scan_samples.window is None or table.nbytes <= 2 * room or longest_series(table.keys) < rows:
        return
    need = smallest_budget(table.nbytes)
    raise SourceError(
        f"[samples] table: series ({KeyColumns(shape.key_names[:-1]).show(table.keys[:-1, 0])}) has {rows:,} rows "
        f"({table.nbytes / 2**20:,.1f} MiB decoded), more than a data pass holds under [source] memory "
        f"{cfg.source.memory_bytes / 2**20:,.0f} MiB; the least budget that reads it is --memory {need >> 20}MiB"
    )
