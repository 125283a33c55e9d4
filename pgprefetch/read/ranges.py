"""Sample ranges of one published epoch's arrays, as NumPy arrays: the reader's byte layer.

A stored batch is a chunk, and pgprefetch writes a shard file's chunks back to back, so samples ``a..b`` of
an array are one contiguous byte range per file they touch. That lets every reader above (NumPy, torch,
JAX, Grain) hand out batches of any size without caring how the dump cut them:

- a range inside one local file is a view of that file's private mapping (no copy, no syscall once
  mapped), read-only: :meth:`SampleRanges.mapped` tells a framework layer where it lies, so it can make its
  own zero-copy view of the same mapping;
- a range over several files is one copy, of exactly its bytes;
- :meth:`SampleRanges.read_into` fills caller buffers with one ``preadv`` (or ranged GET) per file touched;
- compressed arrays are decoded by zarr, chunk by chunk.
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Protocol

import google_crc32c
import numpy as np
import zarr

from pgprefetch.errors import StoreError
from pgprefetch.read.mapping import FileRef, map_private
from pgprefetch.store.base import Store, epoch_name
from pgprefetch.store.layout import MISSING, ArrayLayout, plain_name

_PAGE = 4096
_FILES_KEPT = 32  # shard files kept mapped (and open) per process, least recently used dropped
_BUFFERS_KEPT = 64  # read_into's target buffers whose byte views are kept (weakly)


@dataclass
class MappedFile:
    """One mapped shard file of an array.

    ``mapping`` is the whole file, private and writable underneath; ``samples`` (chunks back to back, as
    pgprefetch writes them) or ``chunks`` (any other order) are read-only typed views of it. ``views`` is
    where a framework layer keeps its own view of this mapping (a torch tensor, say), made once per file.
    """

    mapping: np.ndarray  # uint8, the whole file
    samples: np.ndarray | None  # (batches in file * batch_size, *sample_shape), or None when out of order
    chunks: list[np.ndarray]  # out of order only: each stored batch of the file, (batch_size, *sample_shape)
    offsets: np.ndarray  # byte offset of each slot's chunk in the file
    ref: FileRef
    fd: int
    views: dict[str, Any] = field(default_factory=dict)

    def close(self) -> None:
        """Close the file's descriptor (the mapping lives on while views of it do)."""
        os.close(self.fd)


class Ranges(Protocol):
    """What every reader reads an epoch through: sample ranges of its arrays, however they are stored.

    :class:`SampleRanges` reads arrays of samples; :class:`~pgprefetch.read.windows.WindowRanges` gathers windows
    stored as starts from their rows. The view over an epoch (:mod:`pgprefetch.read.view`) picks one.
    """

    layouts: dict[str, ArrayLayout]

    @property
    def bytes_fetched(self) -> int:
        """Object stores: bytes this process fetched."""
        ...

    def sample_shape(self, name: str) -> tuple[int, ...]:
        """The shape of one sample of array ``name``."""
        ...

    def dtype(self, name: str) -> np.dtype:
        """The dtype of array ``name``."""
        ...

    def mapped(self, name: str, a: int, b: int) -> tuple[MappedFile, int, int] | None:
        """The mapped file that holds samples ``a..b`` as one view, and where; None when they are not one."""
        ...

    def read(self, name: str, a: int, b: int) -> np.ndarray:
        """Samples ``a..b`` of ``name``, read-only."""
        ...

    def read_into(self, name: str, a: int, b: int, out: np.ndarray) -> None:
        """Fill ``out[: b - a]`` with samples ``a..b`` of ``name``."""
        ...

    def forget(self) -> None:
        """Map the files afresh from the next read on."""
        ...


class SampleRanges:
    """The arrays of one published epoch, read as sample ranges.

    Args:
        backend: the store.
        epoch: the published epoch.
        names: the arrays to read (fields, NULL masks, lengths, keys).
    """

    def __init__(self, backend: Store, epoch: int, names: tuple[str, ...]) -> None:
        self.backend = backend
        self.epoch = epoch
        root = backend.local_root
        self.remote = root is None
        where = f"{backend.location}/{epoch_name(epoch)}"
        names = tuple(plain_name(name, where) for name in names)
        if root is None:
            self.layouts = {name: backend.array_layout(epoch, name) for name in names}
        else:  # local: Paths, for mapping and preadv; every file opened from the store's folder, no link followed
            folder = root / epoch_name(epoch)
            self.layouts = {name: ArrayLayout.read(folder / name, root) for name in names}
        self._sized: set[tuple[str, int]] = set()  # object stores: the files whose size matched the metadata
        self.bytes_fetched = 0  # object stores: bytes this process fetched
        # Local uncompressed arrays: samples per file, for the fast paths.
        self._per_file_samples = {
            name: layout.per_file * layout.batch_shape[0]
            for name, layout in self.layouts.items()
            if layout.raw and not self.remote
        }
        self._files: OrderedDict[tuple[str, int], MappedFile] = OrderedDict()
        self._zarr: dict[str, zarr.Array[Any]] = {}  # compressed arrays, opened once per process
        self._buffers: dict[int, tuple[weakref.ref[np.ndarray], memoryview, int]] = {}  # see _remember
        self._pid = os.getpid()
        self._lock = threading.RLock()  # files are mapped, evicted and read under it (readers may be threads)

    def sample_shape(self, name: str) -> tuple[int, ...]:
        """The shape of one sample of array ``name``."""
        return self.layouts[name].batch_shape[1:]

    def dtype(self, name: str) -> np.dtype:
        """The dtype of array ``name``."""
        return self.layouts[name].dtype

    def mapped(self, name: str, a: int, b: int) -> tuple[MappedFile, int, int] | None:
        """The local file whose chunks lie back to back and hold all of samples ``a..b``, mapped, and where.

        Returns ``(file, lo, hi)``: the samples are ``file.samples[lo:hi]``. None when they are not one
        range of one such file (an object store, a compressed array, a range over two files).
        """
        per = self._per_file_samples.get(name)
        if per is None:
            return None
        number = a // per
        if (b - 1) // per != number:
            return None
        file = self._files.get((name, number))
        if file is None:
            file = self._file(name, number)
        if file.samples is None:
            return None
        first = number * per
        return file, a - first, b - first

    def read(self, name: str, a: int, b: int) -> np.ndarray:
        """Samples ``a..b`` of ``name``, read-only: a view of a mapped file when they lie in one local file.

        Else one copy (several files, an object store, a compressed array).
        """
        per = self._per_file_samples.get(name)
        if per is not None:  # the hot path: a view of a file already mapped
            number = a // per
            file = self._files.get((name, number))
            if file is not None and file.samples is not None and (b - 1) // per == number:
                return file.samples[a - number * per : b - number * per]
            layout = self.layouts[name]
            pieces = self._per_file(layout, a, b)
            if len(pieces) == 1:
                return self._view(name, a, b)
        out = np.empty((b - a, *self.sample_shape(name)), dtype=self.dtype(name))
        self.read_into(name, a, b, out)
        out.flags.writeable = False  # a batch is read-only however it was read
        return out

    def read_into(self, name: str, a: int, b: int, out: np.ndarray) -> None:
        """Fill ``out[: b - a]`` (C-contiguous) with samples ``a..b`` of ``name``: one copy.

        Local files: one ``preadv`` per file touched, into the buffer (no page mapping). Object stores: one
        ranged GET per file. Compressed arrays: zarr decodes the chunks touched.
        """
        per = self._per_file_samples.get(name)
        if per is not None:  # the hot path: one preadv from a file already open, into a buffer seen before
            number = a // per
            buffer = self._buffers.get(id(out))
            if buffer is not None and buffer[0]() is out and (b - 1) // per == number:
                view, sample_bytes = buffer[1], buffer[2]
                n = (b - a) * sample_bytes
                at = (a - number * per) * sample_bytes
                into = view if n == len(view) else view[:n]
                with self._lock:  # the file's descriptor stays open while it is read
                    file = self._files.get((name, number))
                    if file is not None and file.samples is not None:
                        if os.preadv(file.fd, [into], at) != n:  # short: 2 GiB a call, or a truncated file
                            _pread(file.fd, into, at, self.layouts[name], number)
                        return
        layout = self.layouts[name]
        size = layout.batch_shape[0]
        sample_bytes = layout.batch_bytes // size
        if per is not None and out.flags.c_contiguous:
            self._remember(out, sample_bytes)
        target = out[: b - a].reshape(-1).view(np.uint8)
        if not layout.raw:
            g0, g1 = a // size, (b - 1) // size
            chunks = np.asarray(self._zarr_array(name)[g0 : g1 + 1])
            flat = chunks.reshape(-1, *chunks.shape[2:])[a - g0 * size : b - g0 * size]
            target[:] = np.ascontiguousarray(flat).reshape(-1).view(np.uint8)
            return
        for lo, hi in self._per_file(layout, a, b):
            part = target[(lo - a) * sample_bytes : (hi - a) * sample_bytes]
            number = lo // size // layout.per_file
            first = number * layout.per_file * size  # the file's first sample
            if self.remote:
                self._fetch(layout, number, (lo - first) * sample_bytes, part)
                continue
            with self._lock:  # the file's descriptor stays open while it is read
                file = self._file(name, number)
                if file.samples is not None:  # chunks back to back: one preadv
                    _pread(file.fd, part, (lo - first) * sample_bytes, layout, number)
                    continue
                done = 0
                for slot, s0, s1 in _slots(lo - first, hi - first, size):
                    n = (s1 - s0) * sample_bytes
                    at = int(file.offsets[slot]) + (s0 - slot * size) * sample_bytes
                    _pread(file.fd, part[done : done + n], at, layout, number)
                    done += n

    def check_files(self, name: str) -> None:
        """Check every file of array ``name`` against its metadata now (local: mapped; object store: its size).

        A reader that sizes its buffers from the metadata calls it first, so that metadata forged to promise
        more than the files hold is a StoreError, not an allocation of what it promised.
        """
        layout = self.layouts[name]
        if not layout.raw:
            return  # (zarr decodes what is there)
        for number in range(-(-layout.n_batches // layout.per_file)):
            if self.remote:
                if (str(layout.path), number) not in self._sized:
                    self._check_size(layout, number)
            else:
                self._file(name, number)

    def _per_file(self, layout: ArrayLayout, a: int, b: int) -> list[tuple[int, int]]:
        """Samples ``a..b`` cut where files end: ``(lo, hi)`` per file touched."""
        per = layout.per_file * layout.batch_shape[0]  # samples per file
        return [(max(a, f * per), min(b, (f + 1) * per)) for f in range(a // per, (b - 1) // per + 1)]

    def _view(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Samples ``lo..hi`` (inside one local file) as a view of its mapping, or one copy over chunks."""
        layout = self.layouts[name]
        size = layout.batch_shape[0]
        number = lo // size // layout.per_file
        file = self._file(name, number)
        first = number * layout.per_file * size
        if file.samples is not None:
            return file.samples[lo - first : hi - first]
        slots = _slots(lo - first, hi - first, size)
        parts = [file.chunks[slot][s0 - slot * size : s1 - slot * size] for slot, s0, s1 in slots]
        if len(parts) == 1:
            return parts[0]
        out = np.concatenate(parts)
        out.flags.writeable = False
        return out

    def _file(self, name: str, number: int) -> MappedFile:
        """File ``number`` of ``name``, mapped once (private, copy-on-write)."""
        with self._lock:
            if self._pid != os.getpid():  # a forked worker maps and opens its own
                self.forget()
            key = (name, number)
            file = self._files.get(key)
            if file is None:
                file = self._files[key] = self._map(self.layouts[name], number)
                if len(self._files) > _FILES_KEPT:  # views handed out keep their mapping alive themselves
                    self._files.popitem(last=False)[1].close()
            else:
                self._files.move_to_end(key)
        return file

    def _remember(self, out: np.ndarray, sample_bytes: int) -> None:
        """Keep a byte view of ``out`` for read_into's hot path, without keeping ``out`` alive.

        The view is made over ``out``'s address (ctypes), and used only while a weak reference says ``out``
        is the same live array; entries of arrays gone are dropped when the table fills.
        """
        if len(self._buffers) >= _BUFFERS_KEPT:
            self._buffers = {k: v for k, v in self._buffers.items() if v[0]() is not None}
            if len(self._buffers) >= _BUFFERS_KEPT:
                return
        view = memoryview((ctypes.c_char * out.nbytes).from_address(out.ctypes.data)).cast("B")
        self._buffers[id(out)] = (weakref.ref(out), view, sample_bytes)

    def _map(self, layout: ArrayLayout, number: int) -> MappedFile:
        """File ``number`` of ``layout`` opened (no link followed below the store) and mapped, its chunks checked.

        The shard's index says where each batch lies and how long it is; a chunk that is not one batch of
        the shape (a batch size rewritten in the metadata), or lies outside the file, is a StoreError here,
        before any view of the file is made.
        """
        path, _ = layout.file(number * layout.per_file)
        try:
            fd = layout.open_file(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise StoreError(f"{path}: the shard file is missing (the epoch is damaged)") from None
        except OSError as e:
            raise StoreError(f"cannot read {path}: {e.strerror or e}") from None
        try:
            stat = os.fstat(fd)
            size = stat.st_size
            nbytes = layout.batch_bytes
            valid = min(layout.per_file, layout.n_batches - number * layout.per_file)
            if layout.sharded:
                if size < layout.index_bytes:
                    raise StoreError(f"{path}: {size} bytes, shorter than its shard index (the file is damaged)")
            elif (wrong := layout.wrong_size(size)) is not None:
                raise StoreError(f"{path}: {wrong} (a damaged or altered store)")
            mapping = _mapped(fd, size, path)
            if layout.sharded:
                tail = mapping[size - layout.index_bytes :]
                crc = int.from_bytes(tail[-4:].tobytes(), "little")
                if google_crc32c.value(tail[:-4].tobytes()) != crc:
                    raise StoreError(f"{path}: shard index checksum mismatch (the file is damaged)")
                index = layout.shard_index(tail)
                _check_chunks(index[:valid], size - layout.index_bytes, layout, path)
                offsets = index[:, 0].copy()
            else:
                offsets = np.zeros(1, dtype=np.uint64)
            shape = layout.batch_shape
            ref = FileRef.of(str(path), stat)
            if np.array_equal(offsets[:valid], np.arange(valid, dtype=np.uint64) * nbytes):
                # Chunks back to back (as pgprefetch writes them): one typed view of all the file's samples.
                samples = _frozen(mapping[: valid * nbytes].view(layout.dtype).reshape(valid * shape[0], *shape[1:]))
                return MappedFile(mapping, samples, [], offsets, ref, fd)
            chunks = [
                _frozen(mapping[int(o) : int(o) + nbytes].view(layout.dtype).reshape(shape)) for o in offsets[:valid]
            ]
            return MappedFile(mapping, None, chunks, offsets, ref, fd)
        except BaseException:
            os.close(fd)
            raise

    def _fetch(self, layout: ArrayLayout, number: int, start: int, out: np.ndarray) -> None:
        """Object stores: one ranged GET of ``out.size`` bytes of file ``number`` from ``start``, into ``out``.

        pgprefetch writes a shard's chunks back to back, so the range is known from the layout, with no read
        of the shard's index.
        """
        path, _ = layout.file(number * layout.per_file)
        if (str(layout.path), number) not in self._sized:
            self._check_size(layout, number)
        data = self.backend.read_range(str(path), start, out.size)
        raw = np.frombuffer(data, dtype=np.uint8)
        if raw.size != out.size:
            raise StoreError(f"{self.backend.location}/{path}: the object ends before the samples asked (truncated?)")
        out[:] = raw
        with self._lock:
            self.bytes_fetched += raw.size

    def _check_size(self, layout: ArrayLayout, number: int) -> None:
        """Object stores: file ``number`` must be as long as its batches of the shape and its index make.

        The ranges fetched are computed from the metadata alone (no read of the shard's index), so a batch
        size rewritten there would fetch other samples than asked, or the wrong share of each: one size
        request per file, once per process, tells. pgprefetch writes exactly that length.
        """
        path, _ = layout.file(number * layout.per_file)
        valid = min(layout.per_file, layout.n_batches - number * layout.per_file)
        want = valid * layout.batch_bytes + (layout.index_bytes if layout.sharded else 0)
        size = self.backend.size(str(path))
        where = f"{self.backend.location}/{path}"
        if size is None:
            raise StoreError(f"{where}: the object is missing (the epoch is damaged)")
        if size != want:
            raise StoreError(
                f"{where}: {size} bytes where {valid} batches of {layout.batch_shape[0]} samples take {want} (the "
                "metadata's batch size or shape is not what the files hold: a damaged or altered store)"
            )
        self._sized.add((str(layout.path), number))

    def _zarr_array(self, name: str) -> zarr.Array[Any]:
        if self._pid != os.getpid():  # a forked worker opens its own (an S3 client does not fork)
            self.forget()
        array = self._zarr.get(name)
        if array is None:
            key = f"{epoch_name(self.epoch)}/{name}"
            array = self._zarr[name] = zarr.open_array(self.backend.zarr_store(), path=key, mode="r")
        return array

    def forget(self) -> None:
        """Map the files afresh from the next read on.

        For a new pass (in-place edits of a batch do not carry over), or in a forked process (which closes
        its copies of the descriptors).
        """
        with self._lock:
            for file in self._files.values():
                file.close()
            self._files, self._zarr, self._buffers, self._pid = OrderedDict(), {}, {}, os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_files=OrderedDict(), _zarr={}, _buffers={}, _lock=None)  # each process maps and opens its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.RLock(), _pid=os.getpid())

    def __del__(self) -> None:
        files = getattr(self, "_files", None)
        if files and self._pid == os.getpid():
            for file in files.values():
                file.close()


def empty_aligned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An empty array starting on a page boundary.

    ``preadv`` into a buffer that starts 16 bytes past a page (where an allocator may put it) was measured
    at half the speed of one on a page boundary (8.5 vs 19 GB/s).
    """
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    block = np.empty(nbytes + _PAGE, dtype=np.uint8)
    start = -block.ctypes.data % _PAGE
    return block[start : start + nbytes].view(dtype).reshape(shape)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _slots(lo: int, hi: int, size: int) -> list[tuple[int, int, int]]:
    """Samples ``lo..hi`` of a file cut at its chunks: ``(slot, lo, hi)`` per chunk touched."""
    return [(s, max(lo, s * size), min(hi, (s + 1) * size)) for s in range(lo // size, (hi - 1) // size + 1)]


def _mapped(fd: int, size: int, path: object) -> np.ndarray:
    """The open file ``fd`` mapped whole (:func:`map_private`); a failure is a StoreError naming ``path``."""
    try:
        return map_private(fd, size)
    except OSError as e:
        raise StoreError(f"cannot map {path}: {e.strerror or e}") from None


def _check_chunks(index: np.ndarray, end: int, layout: ArrayLayout, path: object) -> None:
    """A shard's ``(offset, nbytes)`` of each batch it holds: present, one batch of the shape, before ``end``."""
    if not len(index):
        return
    offsets, sizes = index[:, 0], index[:, 1]
    absent = offsets == MISSING
    if absent.any():
        raise StoreError(
            f"{path}: the shard's index has no chunk for its batch {int(absent.argmax())} (the file is damaged)"
        )
    wrong = sizes != layout.batch_bytes
    if wrong.any():
        raise StoreError(f"{path}: {layout.wrong_size(int(sizes[wrong][0]))} (a damaged or altered store)")
    if int(offsets.max()) > end - layout.batch_bytes:
        raise StoreError(f"{path}: the shard's index places a batch beyond the file's end (the file is damaged)")


def _pread(fd: int, buffer: np.ndarray | memoryview, offset: int, layout: ArrayLayout, number: int) -> None:
    """Fill ``buffer`` from ``fd`` at ``offset``; ``preadv`` may read less than asked (2 GiB a call)."""
    # memoryview(buffer): an ndarray is a Buffer from Python 3.12 on in numpy's stubs
    view = buffer if isinstance(buffer, memoryview) else buffer.data
    if os.preadv(fd, [view], offset) == len(view):
        return
    while view:
        n = os.preadv(fd, [view], offset)
        if n == 0:
            path, _ = layout.file(number * layout.per_file)
            raise StoreError(f"{path}: the file ends before batch data it should hold (truncated?)")
        view, offset = view[n:], offset + n
