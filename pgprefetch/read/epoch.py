"""``EpochArrays``: a published epoch as NumPy arrays, zero-copy from disk, with no framework installed.

Batches are already shuffled, collated and fixed-shape on disk, so reading is slicing: ``ep[i]`` maps the
shard file holding batch ``i`` (once for all its batches) and returns read-only views of it, with no copy
and no zarr call on the hot path (:mod:`pgprefetch.read.ranges`). Compressed stores are decoded by zarr.

Everything but the array type (ranks, read-time batch size, resume state, waiting, metadata) is
:class:`~pgprefetch.read.view.EpochView`'s, shared with :class:`pgprefetch.EpochDataset`: a state saved by
either loads into the other. The views are read-only (``writeable=False``): the mapping is private, so an
edit would not reach the file, but it would change what the next read of the same page in this pass sees;
so an in-place edit is an error here. Copy a batch (``np.array(batch["x"])``) to change it.
"""

from __future__ import annotations

import numpy as np

from pgprefetch.read.padding import trim
from pgprefetch.read.ranges import empty_aligned
from pgprefetch.read.view import Batch, EpochView
from pgprefetch.store.base import KEYS_ARRAY


class EpochArrays(EpochView[np.ndarray]):
    """One published epoch of a pgprefetch store, batch by batch, for one rank, as read-only NumPy arrays.

    Takes :class:`~pgprefetch.read.view.EpochView`'s arguments; ``rank`` and ``world_size`` default to 0 and 1
    (pass them: ``jax.process_index()`` and ``jax.process_count()`` under JAX, say).
    """

    def __getitem__(self, i: int) -> Batch[np.ndarray]:
        """Batch ``i`` of this rank: one read-only array per field (and NULL mask, lengths).

        ``(size, *sample_shape)``; a short last batch is trimmed.
        """
        a, b = self.samples(i)
        read = self._ranges.read
        batch = {name: read(name, a, b) for name in self.arrays}
        return trim(batch, self.manifest) if self.trim else batch

    def batch(self, i: int, *, keys: bool = False) -> Batch[np.ndarray]:
        """``ep[i]``, with the samples' keys as ``"keys"`` (see :meth:`batch_keys`) if ``keys``."""
        batch = self[i]
        if keys:
            batch[KEYS_ARRAY] = self.batch_keys(i)
        return batch

    def batch_keys(self, i: int) -> np.ndarray:
        """The keys of batch ``i``'s samples as stored, int64 ``(size, n_slots)``.

        A slot per key column, two per uuid column: its 16 bytes as two big-endian halves, which
        :func:`pgprefetch.uuid_bytes` turns back into bytes (:meth:`sample_keys` gives ``uuid.UUID``).
        """
        return self.keys_array(i)

    def new_buffers(self) -> Batch[np.ndarray]:
        """Empty arrays that hold one batch of every array, for :meth:`read_into`, each on a page boundary."""
        r = self._ranges
        return {n: empty_aligned((self.batch_size, *r.sample_shape(n)), r.dtype(n)) for n in self.arrays}

    def read_into(self, i: int, out: Batch[np.ndarray]) -> Batch[np.ndarray]:
        """Read batch ``i`` with ``preadv`` straight into ``out``'s arrays (one copy, no page mapping).

        ``out`` holds a C-contiguous array of shape ``(batch_size, *sample_shape)`` per array
        (``self.arrays``), e.g. reused buffers from :meth:`new_buffers`; returns views of them (trimmed for
        a short last batch). These are the caller's buffers, so they stay writable.
        """
        a, b = self.samples(i)
        read_into = self._ranges.read_into
        for name in self.arrays:
            read_into(name, a, b, out[name])
        if b - a == self.batch_size:
            return {name: out[name] for name in self.arrays}
        return {name: out[name][: b - a] for name in self.arrays}

    def __repr__(self) -> str:
        return (
            f"EpochArrays({str(self.store)!r}, epoch={self.epoch}, batch_size={self.batch_size}, "
            f"rank={self.rank}, world_size={self.world_size}, fields={list(self.fields)!r}, trim={self.trim})"
        )
