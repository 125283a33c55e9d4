"""The one folder a dump's temporary files live in, and the files in it, opened relative to its descriptor.

DataFusion's ``DiskManager`` habit: one owner decides where temporary files go, and every algorithm that
spills asks it for a file by purpose, never for a path. The folder is ``--scratch`` (a folder of the
store's location and epoch in it, so dumps of several stores can share one) or one folder beside the
partial epoch (:meth:`~pgprefetch.store.base.Store.spill_path`, removed with it). It is made only when
something spills, private (0700), afresh (a killed dump's leftovers go, a planted link is replaced and never
followed), and removed when the dump ends. Files are created ``O_EXCL | O_NOFOLLOW``, 0600, relative to
the folder's descriptor (:mod:`pgprefetch.store.folders`), so nothing a stranger planted is written through.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pgprefetch.errors import StoreError
from pgprefetch.store.folders import Folder, Place, as_place
from pgprefetch.write.files.io import io_errors, pread_into, pwrite_all, pwritev_all


class SpillFolder:
    """A dump's spill folder (``place``), made on first use; :meth:`sub` names a folder of one algorithm's files."""

    def __init__(self, place: Path | Place, *, parent: SpillFolder | None = None) -> None:
        self.place = as_place(place)
        self._parent = parent
        self._folder: Folder | None = None
        self._subs: list[SpillFolder] = []  # closed with this one
        self._removed = False  # once removed, never made again (a thread still routing rows is refused)
        self._lock = threading.Lock()

    @classmethod
    def in_scratch(cls, scratch: Path, location: str, epoch: int) -> SpillFolder:
        """The folder of ``epoch`` of the store at ``location`` (hashed) in the user's scratch folder."""
        store = hashlib.sha256(location.encode()).hexdigest()[:12]
        return cls(Place.named(scratch / f"pgprefetch-{store}-epoch-{epoch:05d}.spill"))

    @classmethod
    def temporary(cls, scratch: Path | None = None) -> SpillFolder:
        """A folder of this process's own in ``scratch``, or in the system's temporary folder (a check)."""
        root = scratch if scratch is not None else Path(tempfile.gettempdir())
        return cls(Place.named(root / f"pgprefetch-{os.getpid()}-{uuid.uuid4().hex[:8]}.spill"))

    @property
    def path(self) -> Path:
        """The folder's path, for messages."""
        return self.place.path

    def sub(self, name: str) -> SpillFolder:
        """The folder ``name`` in this one, for one algorithm's files (made afresh on first use)."""
        sub = SpillFolder(self.place / name, parent=self)
        with self._lock:
            self._subs.append(sub)
        return sub

    def folder(self) -> Folder:
        """This folder, open, made afresh (private) the first time it is asked for."""
        with self._lock:
            if self._removed or (self._parent is not None and self._parent._removed):
                raise StoreError(f"{self.place}: the dump's spill folder was removed (the dump is ending)")
            if self._folder is None:
                with io_errors(self.place):
                    if self._parent is not None:
                        self._folder = self._parent.folder().fresh(self.place.name, 0o700)
                    else:
                        self._folder = self.place.fresh(mode=0o700)
            return self._folder

    def create(self, name: str) -> SpillFile:
        """A new file ``name`` here: ``O_EXCL``, 0600, by the folder's descriptor, never through a link."""
        return SpillFile(self, name)

    def close(self) -> None:
        """Close this folder's descriptor and its sub-folders' (they stay on disk)."""
        with self._lock:
            subs, self._subs = self._subs, []
            if self._folder is not None:
                self._folder.close()
                self._folder = None
        for sub in subs:
            sub.close()

    def remove(self) -> None:
        """Close the folder and remove it with every file in it (also what a killed dump left under its name)."""
        self.close()
        self._removed = True
        if self._parent is not None and self._parent._folder is not None:
            self._parent._folder.remove(self.place.name)
        else:
            self.place.remove()

    def __enter__(self) -> SpillFolder:
        return self

    def __exit__(self, *_: object) -> None:
        self.remove()


class SpillFile:
    """One spill file: created at first use, read and written at offsets; closed between uses if asked (:meth:`park`).

    A file of many (a partition's buckets) is parked after each block so that their descriptors stay few.
    """

    def __init__(self, folder: SpillFolder, name: str) -> None:
        self.folder, self.name = folder, name
        self._fd = -1
        self._made = False
        self._lock = threading.Lock()  # the writer's threads read one file at once: it is opened once

    @property
    def fd(self) -> int:
        """The open descriptor (the file created by the first use, reopened after :meth:`park`)."""
        with self._lock:
            if self._fd < 0:
                flags = os.O_RDWR | (0 if self._made else os.O_CREAT | os.O_EXCL)
                with io_errors(self.folder.place):
                    self._fd = self.folder.folder().open(self.name, flags, 0o600)
                self._made = True
            return self._fd

    def read_into(self, out: np.ndarray, offset: int) -> None:
        """Fill the contiguous ``out`` from ``offset``."""
        with io_errors(self.folder.place / self.name, "read"):
            pread_into(self.fd, out, offset)

    def write(self, data: np.ndarray, offset: int) -> None:
        """Write the contiguous ``data`` at ``offset``."""
        with io_errors(self.folder.place):
            pwrite_all(self.fd, data, offset)

    def writev(self, pieces: Sequence[memoryview], offset: int) -> int:
        """Write ``pieces`` back to back from ``offset``; their bytes."""
        with io_errors(self.folder.place):
            return pwritev_all(self.fd, pieces, offset)

    def park(self) -> None:
        """Close the descriptor until the next use."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    close = park

    def remove(self) -> None:
        """Close and delete the file (its disk given back as soon as its rows are read)."""
        self.park()
        if self._made:
            self.folder.folder().unlink(self.name)
            self._made = False
