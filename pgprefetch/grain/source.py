"""``EpochSource``: one published epoch as a Grain ``RandomAccessDataSource`` whose records are batches.

Grain's ``DataLoader`` samples records, reads them (in worker processes if asked), and checkpoints where it
is. pgprefetch's records are its stored batches, already shuffled and collated, so the source is the epoch
read at one batch size for one process (:class:`~pgprefetch.read.epoch.EpochArrays`, rank 0 of 1): record
``i`` is global batch ``i``, a dict of read-only NumPy views of the mapped shard file. Grain's sampler does
the sharding across processes and its iterator state is the resume point; the sampler must not shuffle
again or batch again (README, "JAX and Grain"). The source pickles without its mappings, so each Grain
worker maps the files it reads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from pgprefetch.read.epoch import EpochArrays
from pgprefetch.read.view import Batch


class EpochSource:
    """A published epoch as a Grain data source: ``len`` stored batches, ``source[i]`` global batch ``i``.

    Args:
        store: the store: a folder, or ``s3://bucket/prefix``.
        epoch: the epoch to read.
        fields: the fields to return (all by default).
        batch_size: samples per record; None keeps the dump's (see :class:`pgprefetch.EpochArrays`).
        keys: also return each batch's sample keys as ``"keys"``.
        trim: cut padded fields to each batch's longest sample.
        wait: wait for the epoch to be published (up to ``timeout`` seconds).
        timeout: how long ``wait`` waits.
        consumer: the name this training run is recorded under in the store; None records nothing.
        prefetch: object stores: records fetched at once by Grain's batched read, as concurrent ranged GETs.
        split: one of the store's splits (a config's ``[splits]``).
    """

    def __init__(
        self,
        store: str | os.PathLike[str],
        epoch: int,
        *,
        fields: Sequence[str] | None = None,
        batch_size: int | None = None,
        keys: bool = False,
        trim: bool = False,
        wait: bool = False,
        timeout: float = 600.0,
        consumer: str | None = "default",
        prefetch: int = 4,
        split: str | None = None,
    ) -> None:
        self.epoch_arrays = EpochArrays(
            store,
            epoch,
            fields=fields,
            batch_size=batch_size,
            rank=0,
            world_size=1,
            wait=wait,
            timeout=timeout,
            consumer=consumer,
            prefetch=prefetch,
            trim=trim,
            split=split,
        )
        self.keys = keys

    def __len__(self) -> int:
        """The epoch's batches at this batch size (the short last one included)."""
        return len(self.epoch_arrays)

    def __getitem__(self, index: int) -> Batch[np.ndarray]:
        """Global batch ``index``: a dict of read-only arrays (fields, NULL masks, lengths; keys if asked)."""
        return self.epoch_arrays.batch(int(index), keys=self.keys)

    def _getitems(self, indices: Sequence[int]) -> list[Batch[np.ndarray]]:
        """Grain's batched read: over S3, the batches' ranged GETs run ``prefetch`` at a time."""
        return list(self.epoch_arrays.batches([int(i) for i in indices], keys=self.keys))

    def __repr__(self) -> str:
        """Grain checks a checkpoint against the source's ``repr``: it names what decides the records."""
        ep = self.epoch_arrays
        return (
            f"EpochSource({str(ep.store)!r}, epoch={ep.epoch}, batch_size={ep.batch_size}, "
            f"fields={list(ep.fields)!r}, keys={self.keys}, trim={ep.trim}, n={len(ep)})"
        )
