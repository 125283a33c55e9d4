"""Scan mode beyond ``[source] memory``: one read of the table split on local disk, and the spool of windows.

A table that fits the budget is read once and kept (:mod:`pgprefetch.write.scan.table`). One that does not is
COPYed once over page ranges, like a single-pass read, and every decoded chunk goes whole to files on local
disk, split so that each part fits a share of the budget (:mod:`pgprefetch.write.scan.partition`):

- **Rows** are split by ranges of the epoch's order hash: each part is a stretch of the epoch, put in order
  and written out in turn (:mod:`pgprefetch.write.scan.stretches`).
- **Windows** are split by a hash of their series key, so a series (and each window of it) lies in one data
  pass. Each pass is loaded once, sorted by (key, order) and cut: its sorted rows are appended to the rows
  file (:mod:`pgprefetch.write.scan.rowsfile`) and its windows' keys and start rows kept beside it
  (:mod:`pgprefetch.write.scan.cutpasses`), while the windows' keys are ordered (on disk when they outgrow
  the budget as well: :mod:`pgprefetch.write.scan.keyspill`). Each used window's start row is then spooled
  (:class:`Spool`, 8 bytes a window). The writer asks for batches in order; the spool hands their start rows
  out a group at a time, and a group of batches is gathered from the rows file read forward, as from a table
  in memory (:mod:`pgprefetch.write.scan.sweep`). Spooling is sequential I/O (an external distribution sort).

The server reads the table once, whatever its indexes; the client writes the decoded table twice on local
disk, removed when the epoch is published. Several epochs are read again from the start: only a table that
fits is kept across ``--epochs``.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np

from pgprefetch.write.files.shardfiles import io_errors
from pgprefetch.write.scan.shape import ScanShape


def fresh_folder(folder: Path) -> None:
    """Make ``folder`` afresh, for this user only, in the epoch's spool folder (``folder.parent``), made private.

    The spool lies in the store's ``.pgprefetch``, which someone else may have written: a link planted for the
    spool folder or ``folder`` is removed and replaced, never followed, and a killed dump's leftovers go.
    """
    spool = folder.parent
    with io_errors(spool):
        if spool.is_symlink():
            spool.unlink()
        spool.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.rmtree(folder, ignore_errors=True)  # leaves a link in place: unlinked next
        if folder.is_symlink():
            folder.unlink()
        folder.mkdir(mode=0o700)


def keys_only(shape: ScanShape) -> ScanShape:
    """The shape of the keys pass: no field columns."""
    return dataclasses.replace(shape, columns=(), by_field={})


class Spool:
    """Per-sample records (``arrays``) in the epoch's order, added pass by pass, handed back a group at a time.

    An external distribution sort: each group of batches has a file per array, appended to, then loaded and put
    in place when the writer reaches it.
    """

    def __init__(
        self,
        folder: Path,
        arrays: list[tuple[str, np.dtype, tuple[int, ...]]],
        batch_size: int,
        n_batches: int,
        budget: int,
    ) -> None:
        self.folder = folder
        fresh_folder(folder)
        self.arrays = arrays
        self.size = batch_size
        sample_bytes = sum(dtype.itemsize * int(np.prod(shape)) for _, dtype, shape in self.arrays)
        self.group_batches = max(1, min(n_batches, budget // max(1, sample_bytes * batch_size)))
        self.group_samples = self.group_batches * batch_size
        self._loaded: tuple[int, dict[str, np.ndarray]] | None = None

    def add(self, positions: np.ndarray, out: dict[str, np.ndarray]) -> None:
        """Append samples (``out``, one row per sample) bound for epoch positions ``positions``."""
        groups = positions // self.group_samples
        order = np.argsort(groups, kind="stable")
        groups = groups[order]
        cuts = np.flatnonzero(np.diff(groups)) + 1
        for chunk in np.split(order, cuts):
            if not chunk.size:
                continue
            g = int(positions[chunk[0]] // self.group_samples)
            with open(self.folder / f"{g}.pos", "ab") as f:
                f.write(positions[chunk].astype(np.int64).tobytes())
            for name, _, _ in self.arrays:
                with open(self.folder / f"{g}.{name}", "ab") as f:
                    f.write(np.ascontiguousarray(out[name][chunk]).tobytes())

    def batch(self, batch: int, out: dict[str, np.ndarray]) -> None:
        """Fill ``out`` with batch ``batch`` (loading its group when the writer reaches it)."""
        g = batch // self.group_batches
        if self._loaded is None or self._loaded[0] != g:
            self._loaded = (g, self._load(g))
        first = (batch - g * self.group_batches) * self.size
        for name, array in self._loaded[1].items():
            n = min(self.size, array.shape[0] - first)
            out[name][:n] = array[first : first + n]

    def _load(self, g: int) -> dict[str, np.ndarray]:
        path = self.folder / f"{g}.pos"
        positions = np.fromfile(path, dtype=np.int64) - g * self.group_samples if path.exists() else np.empty(0, int)
        loaded = {}
        for name, dtype, shape in self.arrays:
            group = np.zeros((self.group_samples, *shape), dtype=dtype)
            if positions.size:
                data = np.fromfile(self.folder / f"{g}.{name}", dtype=dtype).reshape(-1, *shape)
                group[positions] = data
            loaded[name] = group
        return loaded

    def remove(self) -> None:
        """Delete the spool files."""
        shutil.rmtree(self.folder, ignore_errors=True)
