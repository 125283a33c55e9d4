"""The local folders a dump stages partial epochs in, as both backends see them: which epochs, how big.

Every epoch is written into a local folder first (:meth:`pgprefetch.store.base.Store.partial_path`), by the
local backend inside the store, by the object store's in a staging folder of the dump host. ``prune`` and
``ls`` look at those folders while dumps write, publish and remove them, so what is measured may be gone
by the time it is read.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from pgprefetch.store.base import epochs_in
from pgprefetch.store.folders import Place


def staged_epochs(place: Place) -> list[int]:
    """The partial epochs in a folder of them: their ``epoch-N`` folders, and journals or upload logs alone.

    A dump killed after its epoch was published, before it removed the epoch's journal (and, for an object
    store, its upload log), leaves them without the folder; they are a partial epoch's leftovers, which
    ``prune`` removes. A link in the folder's place is not the store's folder: no partial epochs there.
    """
    folder = place.find()
    if folder is None:
        return []
    with folder:
        names = folder.names()
    return sorted(set(epochs_in(n.removesuffix(".journal").removesuffix(".uploads") for n in names)))


def folder_bytes(root: Path) -> int:
    """Bytes allocated on disk under ``root`` (a published local epoch, or an epoch staged for upload).

    The folder may be renamed or removed while it is measured (a dump publishing the partial epoch that
    ``prune`` or ``ls`` is looking at): what is gone counts nothing, and that is no error.
    """
    total = 0
    for folder, _, files in os.walk(root):  # os.walk skips a folder that is gone by the time it is listed
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(folder, name)).st_blocks * 512
    return total
