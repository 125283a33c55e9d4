"""DataLoader workers hand the main process references to batches, not their bytes.

Part of the torch layer.

A batch read in a ``DataLoader`` worker goes to the main process through a pipe, and torch sends a tensor
by moving its storage into a fresh shared-memory block: a copy, a new file and a new mapping for every
batch. That was measured at 17-19x slower than reading in the main process. But a batch of a local epoch
is a byte range of a file that is never written again, which the main process can map as well. So in a
worker :class:`~pgprefetch.EpochDataset` returns each array as a :class:`MappedBatch`: a tensor (a view of
the worker's mapping, usable in the worker like any other) that pickles as (file, identity, offset, shape,
dtype). The main process rebuilds it as a view of its own mapping of that file: no copy, and the page
cache holds the bytes once for every process.

Only the tensor itself travels this way. What operations on it return (a slice, a sum, a stack) is sent by
value, as torch sends any tensor. In-place edits made *in the worker* are not seen by the main process,
which reads the file's bytes: edit a copy there, or edit in the main process.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections import OrderedDict
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch
from torch.multiprocessing.reductions import reduce_tensor

from pgprefetch.errors import StoreError
from pgprefetch.read.mapping import FileRef, map_path

_MAPPINGS_KEPT = 64  # files the main process keeps mapped for the workers' batches, least recently used dropped


class MappedBatch(torch.Tensor):
    """A tensor that is a byte range of a store's file, sent between processes as that range.

    What operations on it return are of this class too, without the range: they are sent by value.
    """

    _pgpf_ref: tuple[FileRef, int, int]  # the file, the byte offset, and the data pointer it was made with


_warned = False


def _warn_once() -> None:
    """Say once per process that reads batches from workers that iterating in the main process is faster."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(
            "pgprefetch: batches are already shuffled, collated and zero-copy, and DataLoader "
            "workers only add a hand-over between processes per batch, which costs more than reading it: "
            "DataLoader(ds, batch_size=None, num_workers=0), or `for batch in ds`, is faster",
            stacklevel=2,
        )


def by_reference(tensor: torch.Tensor, file: FileRef, offset: int) -> MappedBatch:
    """``tensor`` (bytes ``offset..`` of ``file``, contiguous) as a batch that travels by reference."""
    out = tensor.as_subclass(MappedBatch)
    out._pgpf_ref = (file, offset, tensor.data_ptr())
    return out


def _reduce(t: MappedBatch) -> tuple[Any, tuple[Any, ...]]:
    """How a worker's tensor travels: as its file range, or (anything derived from it) by value.

    It must not raise: the DataLoader pickles on a queue's feeder thread, where an error is lost and the
    main process would wait for the batch forever.
    """
    ref = getattr(t, "_pgpf_ref", None)
    if ref is not None and ref[2] == t.data_ptr() and t.is_contiguous():
        file, offset, _ = ref
        return _rebuild, (file.path, file.ident, file.serial, offset, tuple(t.shape), t.dtype)
    plain = t.as_subclass(torch.Tensor)
    if plain.untyped_storage().is_shared():
        # A slice or view of the mapped file (torch counts a file mapping as shared): torch would try to pass
        # the mapping's long-closed descriptor, and would send a whole shard for one slice. Its own bytes go.
        plain = plain.clone()
    reduced: tuple[Any, tuple[Any, ...]] = reduce_tensor(plain)  # torch leaves it unannotated
    return reduced


_mappings: OrderedDict[tuple[str, tuple[int, int], tuple[int, int]], torch.Tensor] = OrderedDict()
_lock = threading.Lock()  # batches are rebuilt on the main thread, or on the pin-memory thread


def _rebuild(
    path: str, ident: tuple[int, int], serial: tuple[int, int], offset: int, shape: tuple[int, ...], dtype: torch.dtype
) -> torch.Tensor:
    """In the receiving process: the batch as a view of this process's own mapping of the file."""
    _warn_once()
    nbytes = math.prod(shape) * dtype.itemsize
    return _mapping(path, ident, serial)[offset : offset + nbytes].view(dtype).view(shape)


def _mapping(path: str, ident: tuple[int, int], serial: tuple[int, int]) -> torch.Tensor:
    key = (path, ident, serial)
    with _lock:
        mapping = _mappings.get(key)
        if mapping is not None:
            _mappings.move_to_end(key)
            return mapping
        try:
            raw, st = map_path(path)
        except OSError as e:
            raise StoreError(f"{path}: cannot read a batch a DataLoader worker sent: {e.strerror or e}") from None
        if (st.st_dev, st.st_ino) != ident:
            raise StoreError(f"{path} was replaced while a DataLoader worker read it (was the epoch rewritten?)")
        mapping = torch.from_numpy(raw)
        _mappings[key] = mapping
        if len(_mappings) > _MAPPINGS_KEPT:  # batches handed out keep their mapping alive themselves
            _mappings.popitem(last=False)
        return mapping


ForkingPickler.register(MappedBatch, _reduce)
