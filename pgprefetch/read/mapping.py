"""A store's file mapped privately into memory, and how another process can name the same mapping.

The reader's batches are views of these mappings. The mapping is private (``MAP_PRIVATE``): a page written
through it is copied for this process and never reaches the file, so no reader can change a published epoch
for anyone else. It is made with libc's ``mmap`` rather than Python's ``mmap`` module, which keeps a duplicate
of the file descriptor open for as long as the mapping lives (until Python 3.13's ``trackfd``): batches kept
from many shard files would hold as many descriptors, and a process's limit is often 1,024. The mapping holds
no descriptor, and is unmapped when the last array over it is gone. It is writable underneath (torch's tensors
of it are, as they always were); the NumPy reader hands out read-only views of it, so an in-place edit there
is an error, not a silent change of the next batch read from the same page.

:class:`FileRef` is what a framework's worker sends instead of a batch's bytes (see
:mod:`pgprefetch.torch.workers`): the file's path and identity, so the receiver maps the same file itself.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import mmap
import os
from stat import S_ISREG
from typing import Any

import numpy as np

from pgprefetch.errors import StoreError

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


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


class PrivateMapping:
    """A private mapping of a file's first ``size`` bytes, unmapped when this object is collected.

    Arrays made from it (``np.asarray(mapping)``, through ``__array_interface__``) hold it as their base, so
    it lives exactly as long as some view of it does.
    """

    def __init__(self, fd: int, size: int) -> None:
        prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE
        address = _libc.mmap(None, size, prot, flags, fd, 0)
        if address is None or address == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"cannot map the file: {os.strerror(err)}")
        self.address, self.size = address, size
        self.__array_interface__: dict[str, Any] = {
            "data": (address, False),
            "shape": (size,),
            "typestr": "|u1",
            "version": 3,
        }

    def __del__(self) -> None:
        address = getattr(self, "address", None)
        if address is not None and _libc is not None:
            _libc.munmap(address, self.size)


def map_private(fd: int, size: int) -> np.ndarray:
    """The first ``size`` bytes of the open file ``fd`` as a private (copy-on-write) uint8 array.

    The array keeps the mapping alive; it is unmapped when the last view of it is gone. The descriptor may
    be closed at once: the mapping does not need it.
    """
    return np.asarray(PrivateMapping(fd, size))


def map_path(path: str) -> tuple[np.ndarray, os.stat_result]:
    """The whole file at ``path``, mapped as :func:`map_private` does, and its ``stat``.

    For a DataLoader worker's batch: the caller checks that it is the very file (device and inode) the worker
    opened below the store, with no link followed; a link as the file itself, or anything but a regular
    file (a FIFO swapped in, opened without blocking so that it cannot hang the worker), is refused here in
    one line.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):
            raise StoreError(
                f"{path}: not a regular file where the store keeps one (a damaged or hostile store)"
            ) from None
        raise
    try:
        stat = os.fstat(fd)
        if not S_ISREG(stat.st_mode):
            raise StoreError(f"{path}: not a regular file where the store keeps one (a damaged or hostile store)")
        return map_private(fd, stat.st_size), stat
    finally:
        os.close(fd)  # a mapping outlives its descriptor
