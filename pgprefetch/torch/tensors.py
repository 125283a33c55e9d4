"""The reading core's sample ranges as torch tensors: views of the same private mappings, no copy.

Part of the torch layer. :class:`~pgprefetch.read.ranges.SampleRanges` maps each shard file once and says
where a range lies (:meth:`~pgprefetch.read.ranges.SampleRanges.mapped`); this module makes one tensor of
each mapped file (``torch.from_numpy`` of the whole mapping, so a batch's storage is the file's mapping, as
it always was) and slices it, and reads copies straight into tensors' memory through the core's
``preadv``. The tensors are writable (the mapping is private: an edit never reaches the file), as
``EpochDataset``'s always were; the NumPy reader's views are read-only.
"""

from __future__ import annotations

import ctypes
import weakref
from typing import Any

import numpy as np
import torch

from pgprefetch.read.ranges import MappedFile, Ranges
from pgprefetch.torch.workers import by_reference

TORCH_DTYPES: dict[np.dtype[Any], torch.dtype] = {
    np.dtype(name): getattr(torch, name)
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "float16",
        "float32",
        "float64",
    )
    if hasattr(torch, name)  # (uint16 and uint32 from torch 2.3)
}
NUMPY_DTYPES = {t: n for n, t in TORCH_DTYPES.items()}
_HOSTS_KEPT = 64  # tensors whose NumPy views read_into keeps (weakly)


class TensorRanges:
    """Sample ranges of one epoch's arrays as torch tensors, over its :class:`~pgprefetch.read.ranges.Ranges`."""

    def __init__(self, ranges: Ranges) -> None:
        self.ranges = ranges
        self._hosts: dict[int, tuple[weakref.ref[torch.Tensor], np.ndarray]] = {}  # see _host

    def dtype(self, name: str) -> torch.dtype:
        """The torch dtype of array ``name``."""
        return TORCH_DTYPES[self.ranges.dtype(name)]

    def read(self, name: str, a: int, b: int, *, shareable: bool = False) -> torch.Tensor:
        """Samples ``a..b`` of ``name``: a view of a mapped file when they lie in one local file, else a copy.

        ``shareable``: a view comes back as a :class:`~pgprefetch.torch.workers.MappedBatch`, which a DataLoader
        worker sends to the main process as a file range.
        """
        hit = self.ranges.mapped(name, a, b)
        if hit is not None:
            file, lo, hi = hit
            samples = file.views.get("torch")
            if samples is None:
                samples = file.views["torch"] = _samples(file)
            piece = samples[lo:hi]
            if shareable:
                return by_reference(piece, file.ref, piece.data_ptr() - piece.untyped_storage().data_ptr())
            return piece
        out = torch.empty((b - a, *self.ranges.sample_shape(name)), dtype=self.dtype(name))
        self.read_into(name, a, b, out)
        return out

    def read_into(self, name: str, a: int, b: int, out: torch.Tensor) -> None:
        """Fill ``out[: b - a]`` (contiguous, on the CPU) with samples ``a..b`` of ``name``: one copy."""
        self.ranges.read_into(name, a, b, self._host(out))

    def _host(self, t: torch.Tensor) -> np.ndarray:
        """A NumPy view of ``t``'s memory, the same object each time for the same live tensor.

        The core's ``read_into`` keeps its fast path per buffer object, so the view is kept (weakly: it is made
        over ``t``'s address, and used only while ``t`` is the same live tensor).
        """
        entry = self._hosts.get(id(t))
        if entry is not None and entry[0]() is t:
            return entry[1]
        if not t.is_contiguous():
            raise ValueError("read_into needs contiguous CPU tensors")
        nbytes = t.numel() * t.element_size()
        if not nbytes:
            return np.empty(tuple(t.shape), dtype=NUMPY_DTYPES[t.dtype])
        at = (ctypes.c_char * nbytes).from_address(t.data_ptr())
        raw = np.frombuffer(at, dtype=np.uint8)  # type: ignore[call-overload]  # a ctypes array is a Buffer from 3.12 in typeshed
        host: np.ndarray = raw.view(NUMPY_DTYPES[t.dtype]).reshape(t.shape)
        if len(self._hosts) >= _HOSTS_KEPT:
            self._hosts = {k: v for k, v in self._hosts.items() if v[0]() is not None}
        if len(self._hosts) < _HOSTS_KEPT:
            self._hosts[id(t)] = (weakref.ref(t), host)
        return host

    def forget(self) -> None:
        """Map the files afresh from the next read on (see :meth:`SampleRanges.forget`)."""
        self.ranges.forget()

    def __getstate__(self) -> dict[str, object]:
        return {"ranges": self.ranges, "_hosts": {}}


def _samples(file: MappedFile) -> torch.Tensor:
    """All samples of a mapped file as one tensor whose storage is the whole mapping."""
    assert file.samples is not None
    whole = torch.from_numpy(file.mapping)
    return whole[: file.samples.nbytes].view(TORCH_DTYPES[file.samples.dtype]).view(file.samples.shape)
