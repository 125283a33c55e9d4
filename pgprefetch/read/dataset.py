"""``EpochDataset``: a published epoch as torch tensors, zero-copy from disk, ahead of the step on the GPU.

Batches are already shuffled, collated and fixed-shape on disk, so reading is slicing: ``ds[i]`` maps the
shard file holding batch ``i`` (once for all its batches) and returns views of it, with no copy and no zarr
call on the hot path (:mod:`pgprefetch.read.arrays`). Compressed stores are decoded by zarr.

The batch size is chosen at read time. The dump's size is the default; a divisor of it gives micro-batches
that are views too, and any other size is one copy of exactly its samples. So a change of GPU count can keep
the global batch without a new dump.

Ranks split the epoch by arithmetic: global batch ``g`` goes to rank ``g % world_size``, the remainder is
dropped, so every rank gets the same number of batches and none waits on another. The resume state is a
position in samples, (epoch, next sample): resuming with another world size or batch size re-slices what is
left.
"""

from __future__ import annotations

import os
import uuid
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.utils.data
import zarr

from pgprefetch.config.load import load_config
from pgprefetch.errors import ConfigError, StoreError
from pgprefetch.keys import KeyColumns
from pgprefetch.read.arrays import EpochArrays, empty_aligned
from pgprefetch.read.padding import trim
from pgprefetch.read.transfer import cuda_batches
from pgprefetch.store.base import KEYS_ARRAY, epoch_name
from pgprefetch.store.open import open_store


class EpochDataset(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """One published epoch of a pgprefetch store, batch by batch, for one rank.

    Args:
        store: the store (``[store] path`` of the config): a folder, or ``s3://bucket/prefix``.
        epoch: the epoch to read.
        fields: the fields to return (all by default).
        batch_size: samples per batch handed out; None keeps the dump's. A divisor of the dump's size gives
            views (micro-batches); other sizes copy their samples once when they span stored batches.
        rank: this process's rank; defaults to ``torch.distributed``'s when it is initialised, else 0.
        world_size: the number of ranks; same default, else 1.
        wait: if the epoch is not published yet, wait for it (up to ``timeout`` seconds).
        timeout: how long ``wait`` waits.
        consumer: the name this training run is recorded under in the store (the epoch it opened), which
            ``pgprefetch dump --ahead`` and ``--keep`` go by; None records nothing.
        prefetch: object stores: batches fetched ahead during iteration, as concurrent ranged GETs.
        trim: cut each padded field (``max_length``) to the batch's longest sample, and padded rows
            (``max_rows``) to its most rows: views, nothing more read.
    """

    def __init__(
        self,
        store: str | os.PathLike[str],
        epoch: int,
        *,
        fields: Sequence[str] | None = None,
        batch_size: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        wait: bool = False,
        timeout: float = 600.0,
        consumer: str | None = "default",
        prefetch: int = 4,
        trim: bool = False,
    ) -> None:
        self._backend = open_store(store)
        self._remote = self._backend.local_root is None
        self.store: Path | str = self._backend.location if self._remote else Path(store)
        self.epoch = epoch
        self.prefetch = max(1, prefetch)
        self.manifest = self._backend.wait_manifest(epoch, timeout if wait else None)
        self.manifest.pop("checksums", None)  # for `verify`; kept out of every DataLoader worker's pickle
        available = list(self.manifest["fields"])
        unknown = [f for f in fields or () if f not in available]
        if unknown:
            raise ConfigError(f"unknown field {unknown[0]!r}: epoch {epoch} has fields {', '.join(available)}")
        self.fields = tuple(fields or available)
        # A field with a NULL policy comes with its mask, "<field>_null", true where the database had NULL;
        # a padded one with its lengths, "<field>_length"; samples of 1..max_rows rows with "n_rows".
        entries = [self.manifest["fields"][f] for f in self.fields]
        masks = [e.get("null", {}).get("mask") for e in entries]
        lengths = [e.get("lengths") for e in entries]
        self.arrays = (*self.fields, *(m for m in masks if m), *(n for n in lengths if n))
        if "n_rows" in self.manifest:
            self.arrays += (self.manifest["n_rows"],)
        self.trim = trim
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.stored_batch_size = int(self.manifest["batch_size"])
        self.batch_size = self.stored_batch_size if batch_size is None else positive("batch_size", batch_size)
        self.n_samples = int(self.manifest["n_samples"])
        self._arrays = EpochArrays(self._backend, epoch, (*self.arrays, KEYS_ARRAY))
        self._seek(0)  # _base: the first sample of this view; _pos: local batches handed out by iteration
        if consumer is not None and torch.utils.data.get_worker_info() is None:
            self.record_consumer(consumer)

    def record_consumer(self, name: str) -> None:
        """Record in the store that training run ``name`` opened this epoch (a warning if it cannot)."""
        try:
            self._backend.record_consumer(name, self.epoch)
        except (OSError, StoreError) as e:  # a read-only copy of a store can still be read
            warnings.warn(f"cannot record consumer {name!r} in {self.store}: {e}", stacklevel=3)

    @property
    def categories(self) -> dict[str, list[str]]:
        """The category list of each categorical field: code ``i`` stands for ``categories[field][i]``.

        For ``categories = "auto"`` it is the store's vocabulary when the epoch was planned, which later
        epochs only extend at the end: a code means the same in every epoch of a store, and the list of a
        later epoch decodes this one too (see :attr:`pgprefetch.EpochStream.categories`).
        """
        return {name: f["categories"] for name, f in self.manifest["fields"].items() if "categories" in f}

    @property
    def key_columns(self) -> KeyColumns:
        """The key columns: each takes one int64 slot of :meth:`batch_keys`, a uuid column two."""
        m = self.manifest
        return KeyColumns(tuple(m["key_columns"]), tuple(t == "uuid" for t in m.get("key_types", ())))

    @property
    def stats(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per field and column: count, mean, std, min and max over the epoch's real values (no padding)."""
        return self.manifest.get("stats", {})

    @property
    def longest(self) -> dict[str, np.ndarray]:
        """Each stored batch's longest sample per lengths array (``<field>_length``), and most rows (``n_rows``).

        Read from the epoch's ``_longest`` array, a few bytes a batch, not from the batches: to bucket
        batches by length, or to size a model's buffers, before reading any. Empty without padded fields.
        """
        entry = self.manifest.get("longest")
        if not entry:
            return {}
        path = f"{epoch_name(self.epoch)}/{entry['array']}"
        table = zarr.open_array(self._backend.zarr_store(), path=path, mode="r")[:]
        return {name: table[i] for i, name in enumerate(entry["arrays"])}

    @property
    def remote(self) -> bool:
        """Whether the store is an object store (batches fetched with ranged GETs, not mapped)."""
        return self._remote

    @property
    def bytes_fetched(self) -> int:
        """Object stores: batch bytes this dataset fetched (in this process)."""
        return self._arrays.bytes_fetched

    @property
    def n_global(self) -> int:
        """Global batches of the epoch at this batch size, counted from the resume point's batch."""
        return self._base // self.batch_size + -(-(self.n_samples - self._base) // self.batch_size)

    @classmethod
    def from_config(cls, config: str | os.PathLike[str], epoch: int, **kwargs: Any) -> EpochDataset:
        """Open epoch ``epoch`` of the store named by a config file."""
        return cls(load_config(config).store.path, epoch, **kwargs)

    def __len__(self) -> int:
        """Batches for this rank (from the resume point on)."""
        return self._len

    def _seek(self, sample: int) -> None:
        """Start this view at ``sample`` (the resume point), the same on every rank."""
        self._base, self._pos = sample, 0
        self._len = -(-(self.n_samples - sample) // self.batch_size) // self.world_size

    def global_batch(self, i: int) -> int:
        """The epoch-wide index of this rank's batch ``i``."""
        self._check(i)
        return self._base // self.batch_size + i * self.world_size + self.rank

    def samples(self, i: int) -> tuple[int, int]:
        """The epoch's samples ``a..b`` that this rank's batch ``i`` holds (``b - a`` < batch size at the end)."""
        if not 0 <= i < self._len:
            self._check(i)
        a = self._base + (i * self.world_size + self.rank) * self.batch_size
        return a, min(self.n_samples, a + self.batch_size)

    def _check(self, i: int) -> None:
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} out of range for a rank with {len(self)} batches")

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        """Batch ``i`` of this rank: one tensor per field (and NULL mask), ``(size, *sample_shape)``.

        A short last batch is trimmed.
        """
        a, b = self.samples(i)
        if self.trim:
            return self.batch(i)
        if torch.utils.data.get_worker_info() is None or self._remote:
            read = self._arrays.read
            return {name: read(name, a, b) for name in self.arrays}
        return self.batch(i)

    def batch(self, i: int, *, keys: bool = False) -> dict[str, torch.Tensor]:
        """``ds[i]``, with the samples' keys as ``"keys"`` (see :meth:`batch_keys`) if ``keys``."""
        a, b = self.samples(i)
        # In a DataLoader worker the batch is sent to the main process: as a reference to its bytes in the
        # file, which the main process maps too, not as a copy (see pgprefetch.read.workers).
        shareable = not self._remote and torch.utils.data.get_worker_info() is not None
        names = (*self.arrays, KEYS_ARRAY) if keys else self.arrays
        batch = {name: self._arrays.read(name, a, b, shareable=shareable) for name in names}
        return trim(batch, self.manifest) if self.trim else batch

    def batch_keys(self, i: int) -> torch.Tensor:
        """The keys of batch ``i``'s samples as stored, int64 ``(size, n_slots)``.

        A slot per key column, two per uuid column: its 16 bytes as two big-endian halves, which
        :func:`pgprefetch.uuid_bytes` turns back into bytes (:meth:`sample_keys` gives ``uuid.UUID``).
        """
        return self._arrays.read(KEYS_ARRAY, *self.samples(i))

    def sample_keys(self, i: int) -> list[tuple[int | uuid.UUID, ...]]:
        """The keys of batch ``i``'s samples as the database has them: ints, and ``uuid.UUID`` for uuids."""
        columns = self.key_columns
        return [columns.values(row) for row in self.batch_keys(i).numpy().tolist()]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's batches from the resume state on; each one handed out advances the state."""
        self._new_pass()
        if self._remote:
            for batch in self.batches(range(self._pos, len(self))):
                self._pos += 1
                yield batch
            return
        while self._pos < len(self):
            batch = self[self._pos]
            self._pos += 1
            yield batch

    def _new_pass(self) -> None:
        if self._pos >= len(self):
            self._pos = 0  # a finished pass starts over
        if self._pos == 0:
            self._arrays.forget()  # a new pass maps the files afresh (in-place edits of a batch do not carry over)

    def batches(self, indices: range, *, keys: bool = False) -> Iterator[dict[str, torch.Tensor]]:
        """``self.batch(i, keys=keys)`` for each ``i`` of ``indices``, in order, without moving the state.

        Object stores: ``prefetch`` batches in flight as concurrent ranged GETs.
        """
        if not self._remote:
            for i in indices:
                yield self.batch(i, keys=keys)
            return
        with ThreadPoolExecutor(self.prefetch, thread_name_prefix="pgprefetch-read") as pool:
            pending: deque[Future[dict[str, torch.Tensor]]] = deque()
            ahead = iter(indices)
            try:
                for _ in indices:
                    while len(pending) < self.prefetch and (i := next(ahead, None)) is not None:
                        pending.append(pool.submit(self.batch, i, keys=keys))
                    yield pending.popleft().result()
            finally:
                for future in pending:
                    future.cancel()

    def to_device(self, device: str | torch.device, prefetch: int = 2) -> Iterator[dict[str, torch.Tensor]]:
        """Iterate like ``iter(self)``, with batches already on ``device``.

        On CUDA, a ring of ``prefetch + 1`` reused pinned host buffers is filled with batches
        ``i+1 .. i+prefetch`` and copied on a side stream while the step runs on batch ``i``; the consumer's
        stream waits only for its own batch's copy (:mod:`pgprefetch.read.transfer`). On the CPU the mapped
        tensors are yielded as they are.
        """
        device = torch.device(device)
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

    def state_dict(self, batches: int | None = None) -> dict[str, int]:
        """The resume state: the epoch and the first sample (and global batch) not yet handed out.

        Args:
            batches: the batches this rank has consumed, when they came through a ``DataLoader`` (which
                calls ``ds[i]``, not ``iter(ds)``, so the dataset cannot count them itself).
        """
        done = self._pos if batches is None else batches
        return {
            "epoch": self.epoch,
            "next_global_batch": self._base // self.batch_size + done * self.world_size,
            "next_sample": self.next_sample(done),
            "batch_size": self.batch_size,
        }

    def next_sample(self, batches: int) -> int:
        """The resume point once every rank has consumed ``batches`` of its batches: a sample of the epoch."""
        return min(self.n_samples, self._base + batches * self.world_size * self.batch_size)

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from ``state``: this rank's batches are re-sliced from the remaining samples.

        The state may come from another world size or batch size; one without ``next_sample`` (an older
        pgprefetch's) counts ``next_global_batch`` in its ``batch_size``, or the dump's.
        """
        if state["epoch"] != self.epoch:
            raise ConfigError(f"resume state is for epoch {state['epoch']}, this dataset reads epoch {self.epoch}")
        if "next_sample" in state:
            sample = int(state["next_sample"])
        else:  # an older state; at the end of an epoch with a short last batch it counts past the last sample
            sample = int(state["next_global_batch"]) * int(state.get("batch_size") or self.stored_batch_size)
            sample = min(sample, self.n_samples)
        if not 0 <= sample <= self.n_samples:
            raise ConfigError(f"resume state sample {sample} is outside 0..{self.n_samples} of epoch {self.epoch}")
        self._seek(sample)

    def new_buffers(self, *, pin: bool = False) -> dict[str, torch.Tensor]:
        """Empty CPU tensors that hold one batch of every array, for :meth:`read_into`.

        They start on a page boundary; ``pin``: in page-locked memory, for asynchronous copies to a GPU.
        """
        a = self._arrays
        shapes = {n: (self.batch_size, *a.sample_shape(n)) for n in self.arrays}
        if pin:
            return {n: torch.empty(shape, dtype=a.dtype(n), pin_memory=True) for n, shape in shapes.items()}
        return {n: empty_aligned(shape, a.dtype(n)) for n, shape in shapes.items()}

    def read_into(self, i: int, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Read batch ``i`` with ``preadv`` straight into ``out``'s tensors (one copy, no page mapping).

        ``out`` holds a contiguous CPU tensor of shape ``(batch_size, *sample_shape)`` per array
        (``self.arrays``: the fields and their NULL masks), e.g. reused or pinned buffers from
        :meth:`new_buffers`; returns views of them (trimmed for a short last batch).
        """
        a, b = self.samples(i)
        read_into = self._arrays.read_into
        for name in self.arrays:
            read_into(name, a, b, out[name])
        if b - a == self.batch_size:
            return {name: out[name] for name in self.arrays}
        return {name: out[name][: b - a] for name in self.arrays}


def rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``rank`` and ``world_size``, each defaulting to ``torch.distributed``'s when it is initialised."""
    dist = torch.distributed
    initialised = dist.is_available() and dist.is_initialized()
    world = world_size if world_size is not None else (dist.get_world_size() if initialised else 1)
    r = rank if rank is not None else (dist.get_rank() if initialised else 0)
    if world < 1 or not 0 <= r < world:
        raise ConfigError(f"rank {r} is outside 0..{world - 1} (world_size {world})")
    return r, world


def positive(name: str, value: int) -> int:
    """``value``, if it is a positive integer; else a ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value
