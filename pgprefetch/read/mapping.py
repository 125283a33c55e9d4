"""A store's file mapped privately into memory, and how another process can name the same mapping.

The reader's batches are views of these mappings. The mapping is private (``MAP_PRIVATE``): a page written
through it is copied for this process and never reaches the file, so no reader can change a published
epoch for anyone else. It is writable underneath (torch's tensors of it are, as they always were); the
NumPy reader hands out read-only views of it, so an in-place edit there is an error, not a silent change
of the next batch read from the same page.

:class:`FileRef` is what a framework's worker sends instead of a batch's bytes (see
:mod:`pgprefetch.torch.workers`): the file's path and identity, so the receiver maps the same file itself.
"""

from __future__ import annotations

import itertools
import mmap
import os

import numpy as np


class FileRef:
    """Where a mapping of a file came from: the path, its (device, inode), and which mapping it is.

    The serial is new for every mapping a process makes, so a receiver maps the file afresh when the sender
    did (a new pass in new workers, say): the reader's rule that a new pass starts from the file.
    """

    __slots__ = ("ident", "path", "serial")
    _serials = itertools.count(1)  # next() is atomic: two threads mapping at once get distinct serials

    def __init__(self, path: str, ident: tuple[int, int]) -> None:
        self.path, self.ident, self.serial = path, ident, (os.getpid(), next(FileRef._serials))

    @classmethod
    def of(cls, path: str, stat: os.stat_result) -> FileRef:
        """The reference of a file just mapped, from its ``stat``."""
        return cls(path, (stat.st_dev, stat.st_ino))


def map_private(fd: int, size: int) -> np.ndarray:
    """The first ``size`` bytes of the open file ``fd`` as a private (copy-on-write) uint8 mapping.

    The array keeps the mapping alive; it is unmapped when the last view of it is gone.
    """
    mapped = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return np.frombuffer(mapped, dtype=np.uint8)


def map_path(path: str) -> tuple[np.ndarray, os.stat_result]:
    """The whole file at ``path``, mapped as :func:`map_private` does, and its ``stat``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        stat = os.fstat(fd)
        return map_private(fd, stat.st_size), stat
    finally:
        os.close(fd)  # a mapping outlives its descriptor
