"""``EpochDataset``: a published epoch as torch tensors, zero-copy from disk, ahead of the step on the GPU.

A thin torch layer over the reading core: everything but the array type (opening, ranks, read-time batch
size, resume state, metadata) is :class:`~pgprefetch.read.view.EpochView`'s, shared with the NumPy reader
(:class:`pgprefetch.EpochArrays`), so a state saved by either loads into the other. The tensors are views of
the core's private mappings of the shard files (:mod:`pgprefetch.torch.tensors`): no copy and no zarr call
on the hot path. What is torch's own lives here and beside it: ranks from ``torch.distributed``, batches
handed from DataLoader workers by reference (:mod:`pgprefetch.torch.workers`), and copies to the GPU through
pinned buffers ahead of the step (:mod:`pgprefetch.torch.transfer`).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property, partial

import torch
import torch.utils.data

from pgprefetch.read.padding import trim
from pgprefetch.read.ranges import empty_aligned
from pgprefetch.read.view import Batch, EpochView, check_ranks
from pgprefetch.store.base import KEYS_ARRAY
from pgprefetch.torch.tensors import TORCH_DTYPES, TensorRanges
from pgprefetch.torch.transfer import cuda_batches, usable_device


class EpochDataset(EpochView[torch.Tensor], torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """One published epoch of a pgprefetch store, batch by batch, for one rank, as torch tensors.

    Takes :class:`~pgprefetch.read.view.EpochView`'s arguments (store, epoch, fields, batch_size, rank,
    world_size, wait, timeout, consumer, prefetch, trim); ``rank`` and ``world_size`` default to
    ``torch.distributed``'s when it is initialised, else 0 and 1.
    """

    # No __init__ of its own: EpochView's is the signature `help(EpochDataset)` and `inspect.signature` show
    # (a pass-through `__init__(*args, **kwargs)` hid every parameter).

    @cached_property
    def _tensors(self) -> TensorRanges:
        """The core's sample ranges as tensors (made on first read, so the class keeps EpochView's __init__)."""
        return TensorRanges(self._ranges)

    def default_ranks(self) -> tuple[int, int]:
        """``torch.distributed``'s rank and world size when it is initialised, else 0 and 1."""
        return distributed_ranks()

    def in_worker(self) -> bool:
        """Whether this runs in a DataLoader worker."""
        return torch.utils.data.get_worker_info() is not None

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        """Batch ``i`` of this rank: one tensor per field (and NULL mask), ``(size, *sample_shape)``.

        A short last batch is trimmed.
        """
        a, b = self.samples(i)
        if self.trim:
            return self.batch(i)
        if torch.utils.data.get_worker_info() is None or self._remote:
            read = self._tensors.read
            return {name: read(name, a, b) for name in self.arrays}
        return self.batch(i)

    def batch(self, i: int, *, keys: bool = False) -> dict[str, torch.Tensor]:
        """``ds[i]``, with the samples' keys as ``"keys"`` (see :meth:`batch_keys`) if ``keys``."""
        a, b = self.samples(i)
        # In a DataLoader worker the batch is sent to the main process: as a reference to its bytes in the
        # file, which the main process maps too, not as a copy (see pgprefetch.torch.workers).
        shareable = not self._remote and torch.utils.data.get_worker_info() is not None
        names = (*self.arrays, KEYS_ARRAY) if keys else self.arrays
        batch = {name: self._tensors.read(name, a, b, shareable=shareable) for name in names}
        return trim(batch, self.manifest) if self.trim else batch

    def batch_keys(self, i: int) -> torch.Tensor:
        """The keys of batch ``i``'s samples as stored, int64 ``(size, n_slots)``.

        A slot per key column, two per uuid column: its 16 bytes as two big-endian halves, which
        :func:`pgprefetch.uuid_bytes` turns back into bytes (:meth:`sample_keys` gives ``uuid.UUID``).
        """
        return self._tensors.read(KEYS_ARRAY, *self.samples(i))

    def to_device(self, device: str | torch.device, prefetch: int = 2) -> Iterator[dict[str, torch.Tensor]]:
        """Iterate like ``iter(self)``, with batches already on ``device``.

        On CUDA, a ring of ``prefetch + 1`` reused pinned host buffers is filled with batches
        ``i+1 .. i+prefetch`` and copied on a side stream while the step runs on batch ``i``; the consumer's
        stream waits only for its own batch's copy (:mod:`pgprefetch.torch.transfer`). On the CPU the mapped
        tensors are yielded as they are.

        Raises:
            ConfigError: ``device`` is not one this torch and this machine have (CUDA asked for without it).
        """
        device = usable_device(device)
        if device.type == "cpu":
            return iter(self)
        if device.type == "cuda":
            return self._cuda(device, max(1, prefetch))
        return ({k: v.to(device) for k, v in b.items()} for b in self)

    def _cuda(self, device: torch.device, depth: int) -> Iterator[dict[str, torch.Tensor]]:
        self._new_pass()
        indices = range(self._pos, len(self))
        pinned = partial(self.new_buffers, pin=True)
        for i, batch in cuda_batches(self.read_into, pinned, indices, device, depth):
            self._pos = i + 1
            yield batch

    def new_buffers(self, *, pin: bool = False) -> dict[str, torch.Tensor]:
        """Empty CPU tensors that hold one batch of every array, for :meth:`read_into`.

        They start on a page boundary; ``pin``: in page-locked memory, for asynchronous copies to a GPU.
        """
        r = self._ranges
        shapes = {n: (self.batch_size, *r.sample_shape(n)) for n in self.arrays}
        if pin:
            return {n: torch.empty(s, dtype=TORCH_DTYPES[r.dtype(n)], pin_memory=True) for n, s in shapes.items()}
        return {n: torch.from_numpy(empty_aligned(s, r.dtype(n))) for n, s in shapes.items()}

    def read_into(self, i: int, out: Batch[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Read batch ``i`` with ``preadv`` straight into ``out``'s tensors (one copy, no page mapping).

        ``out`` holds a contiguous CPU tensor of shape ``(batch_size, *sample_shape)`` per array
        (``self.arrays``: the fields and their NULL masks), e.g. reused or pinned buffers from
        :meth:`new_buffers`; returns views of them (trimmed for a short last batch).
        """
        a, b = self.samples(i)
        read_into = self._tensors.read_into
        for name in self.arrays:
            read_into(name, a, b, out[name])
        if b - a == self.batch_size:
            return {name: out[name] for name in self.arrays}
        return {name: out[name][: b - a] for name in self.arrays}


def distributed_ranks() -> tuple[int, int]:
    """``torch.distributed``'s (rank, world size) when it is initialised, else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``rank`` and ``world_size``, each defaulting to ``torch.distributed``'s when it is initialised."""
    default = distributed_ranks() if rank is None or world_size is None else (0, 1)
    return check_ranks(default[0] if rank is None else rank, default[1] if world_size is None else world_size)
