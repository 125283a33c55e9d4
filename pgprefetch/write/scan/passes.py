"""Scan mode beyond ``[source] memory``: one read of the table split on local disk, and its spool folder.

A table that fits the budget is read once and kept (:mod:`pgprefetch.write.scan.table`). One that does not is
COPYed once over page ranges, like a single-pass read, and every decoded chunk goes whole to files on local
disk, split so that each part fits a share of the budget (:mod:`pgprefetch.write.scan.partition`):

- **Rows** are split by ranges of the epoch's order hash: each part is a stretch of the epoch, put in order
  and written out in turn (:mod:`pgprefetch.write.scan.stretches`).
- **Windows** are split by a hash of their series key, so a series (and each window of it) lies in one data
  pass. Each pass is loaded once, sorted by (key, order) and cut: its sorted rows are appended to the rows
  file (:mod:`pgprefetch.write.scan.rowsfile`) and its windows' keys and start rows kept beside it
  (:mod:`pgprefetch.write.scan.cutpasses`), while the windows' keys are ordered (on disk when they outgrow
  the budget as well: :mod:`pgprefetch.write.scan.keyspill`), each with its start row in the rows file
  carried along. The writer asks for batches in order, and a group of batches is gathered from the rows file
  read forward, as from a table in memory (:mod:`pgprefetch.write.scan.sweep`).

The server reads the table once, whatever its indexes; the client writes the decoded table twice on local
disk, removed when the epoch is published. Several epochs are read again from the start: only a table that
fits is kept across ``--epochs``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pgprefetch.store.folders import Place, as_place
from pgprefetch.write.files.shardfiles import io_errors
from pgprefetch.write.scan.shape import ScanShape


def fresh_folder(folder: Path | Place) -> Place:
    """Make ``folder`` afresh, for this user only, in the epoch's spool folder (made private if it is new).

    The spool lies in the store's ``.pgprefetch``, which someone else may have written: it is made through
    :mod:`pgprefetch.store.folders`, so a link planted for the spool folder or ``folder`` is removed and
    replaced, never followed, and a killed dump's leftovers go. Returns the folder as a place, which the
    files in it are opened through.
    """
    place = as_place(folder)
    with io_errors(place.parent):
        place.fresh(mode=0o700).close()
    return place


def keys_only(shape: ScanShape) -> ScanShape:
    """The shape of the keys pass: no field columns."""
    return dataclasses.replace(shape, columns=(), by_field={})
