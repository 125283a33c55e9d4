"""One published epoch for one rank, whatever array type its batches are handed out as.

Everything about reading an epoch that is not the array type lives here, once, for the NumPy reader
(:class:`~pgprefetch.read.epoch.EpochArrays`) and the torch one (:class:`pgprefetch.torch.EpochDataset`):
opening and waiting for the epoch, the fields and the arrays that come with them (NULL masks, lengths,
``n_rows``), ranks, the batch size chosen at read time, the resume state, consumer records, the metadata
(categories, statistics, each batch's longest sample), and the order of a pass. So a state saved by one
reader loads into the other, and both raise the same errors.

Ranks split the epoch by arithmetic: global batch ``g`` goes to rank ``g % world_size``, the remainder is
dropped, so every rank gets the same number of batches and none waits on another. The resume state is a
position in samples, (epoch, next sample): resuming with another world size or batch size re-slices what is
left.
"""

from __future__ import annotations

import abc
import os
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Generic, Self, TypeVar

import numpy as np
import zarr

from pgprefetch.config.load import load_config
from pgprefetch.config.model import SOURCE_ARRAY
from pgprefetch.errors import ConfigError, StoreError
from pgprefetch.keys import KeyColumns, KeyValue
from pgprefetch.read.padding import Sliced
from pgprefetch.read.ranges import Ranges, SampleRanges
from pgprefetch.read.windows import WindowRanges
from pgprefetch.store.base import KEYS_ARRAY, epoch_name
from pgprefetch.store.checks import check_layouts, manifest_fields, manifest_int, manifest_sources, windows_record
from pgprefetch.store.layout import plain_name
from pgprefetch.store.open import open_store
from pgprefetch.store.splits import refuse_whole, served_epoch

B = TypeVar("B", bound=Sliced)  # the array type of a batch: numpy.ndarray, torch.Tensor
Batch = dict[str, B]


class EpochView(abc.ABC, Generic[B]):
    """One published epoch of a pgprefetch store, batch by batch, for one rank.

    Args:
        store: the store (``[store] path`` of the config): a folder, or ``s3://bucket/prefix``.
        epoch: the epoch to read.
        fields: the fields to return (all by default).
        batch_size: samples per batch handed out; None keeps the dump's. A divisor of the dump's size gives
            views (micro-batches); other sizes copy their samples once when they span stored batches.
        rank: this process's rank; by default the framework's (see :meth:`default_ranks`), else 0.
        world_size: the number of ranks; same default, else 1.
        wait: if the epoch is not published yet, wait for it (up to ``timeout`` seconds).
        timeout: how long ``wait`` waits.
        consumer: the name this training run is recorded under in the store (the epoch it opened), which
            ``pgprefetch dump --ahead`` and ``--keep`` go by; None records nothing.
        prefetch: object stores: batches fetched ahead during iteration, as concurrent ranged GETs.
        trim: cut each padded field (``max_length``) to the batch's longest sample, and padded rows
            (``max_rows``) to its most rows: views, nothing more read.
        split: one of the store's splits (``train``, ``val``: a config's ``[splits]``); required for a
            store that has them. An evaluation split's one epoch is every epoch number's (docs/splits.md).
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
        split: str | None = None,
    ) -> None:
        self._backend = open_store(store, split)
        if split is None:
            refuse_whole(self._backend)
        self._remote = self._backend.local_root is None
        self.store: Path | str = self._backend.location if self._remote else Path(self._backend.location)
        self.split = split
        epoch = served_epoch(self._backend, epoch)  # an evaluation split's one epoch serves every number
        self.epoch = epoch
        self.prefetch = max(1, prefetch)
        self.manifest = self._backend.wait_manifest(epoch, timeout if wait else None)
        self.manifest.pop("checksums", None)  # for `verify`; kept out of every worker's pickle
        where = f"{self._backend.location}/{epoch_name(epoch)}"
        self.fields = _chosen_fields(self.manifest, fields, epoch, where)
        self.arrays = self._arrays_of(self.fields)
        self.trim = trim
        self.rank, self.world_size = self._ranks(rank, world_size)
        self.stored_batch_size = manifest_int(self.manifest, "batch_size", where, least=1)
        self.batch_size = self.stored_batch_size if batch_size is None else positive("batch_size", batch_size)
        self.n_samples = manifest_int(self.manifest, "n_samples", where)
        names = (*self.arrays, KEYS_ARRAY)
        windows = windows_record(self.manifest, where)  # windows stored as starts: gathered from their rows
        self._ranges: Ranges = (
            SampleRanges(self._backend, epoch, names)
            if windows is None
            else WindowRanges(self._backend, epoch, names, windows)
        )
        check_layouts(self.manifest, self._ranges.layouts, where)
        self._seek(0)  # _base: the first sample of this view; _pos: local batches handed out by iteration
        if consumer is not None and not self.in_worker():
            self.record_consumer(consumer)

    def _arrays_of(self, fields: tuple[str, ...]) -> tuple[str, ...]:
        """The arrays a batch of ``fields`` holds: the fields, their NULL masks and lengths, rows, sources.

        A field with a NULL policy comes with its mask, "<field>_null", true where the database had NULL; a
        padded one with its lengths, "<field>_length"; samples of 1..max_rows rows with "n_rows"; a mixed
        epoch with each sample's source code, named by :attr:`sources`.
        """
        entries = [self.manifest["fields"][f] for f in fields]
        masks = [m for e in entries if (m := e.get("null", {}).get("mask"))]
        lengths = [n for e in entries if (n := e.get("lengths"))]
        rows = (self.manifest["n_rows"],) if "n_rows" in self.manifest else ()
        return (*fields, *masks, *lengths, *rows, *((SOURCE_ARRAY,) if self.sources else ()))

    def _ranks(self, rank: int | None, world_size: int | None) -> tuple[int, int]:
        """This view's rank and world size: as given, else the framework's (:meth:`default_ranks`)."""
        default = self.default_ranks()
        return check_ranks(default[0] if rank is None else rank, default[1] if world_size is None else world_size)

    # --- what a framework layer decides ---------------------------------------------------------------
    def default_ranks(self) -> tuple[int, int]:
        """(rank, world size) when none is given: one process. The torch layer asks ``torch.distributed``."""
        return 0, 1

    def in_worker(self) -> bool:
        """Whether this runs in a framework's data-loading worker (which records no consumer)."""
        return False

    @abc.abstractmethod
    def __getitem__(self, i: int) -> Batch[B]:
        """Batch ``i`` of this rank: one array per field (and NULL mask, lengths), ``(size, *sample_shape)``."""

    @abc.abstractmethod
    def batch(self, i: int, *, keys: bool = False) -> Batch[B]:
        """``self[i]``, with the samples' keys as ``"keys"`` if ``keys``."""

    @abc.abstractmethod
    def batch_keys(self, i: int) -> B:
        """The keys of batch ``i``'s samples as stored, int64 ``(size, n_slots)``."""

    @abc.abstractmethod
    def new_buffers(self) -> Batch[B]:
        """Empty buffers that hold one batch of every array, for :meth:`read_into`."""

    @abc.abstractmethod
    def read_into(self, i: int, out: Batch[B]) -> Batch[B]:
        """Read batch ``i`` with ``preadv`` straight into ``out`` (one copy, no page mapping); views of ``out``."""

    # --- the epoch ------------------------------------------------------------------------------------
    def record_consumer(self, name: str) -> None:
        """Record in the store that this rank of training run ``name`` opened this epoch (a warning if it cannot).

        Each rank records its own epoch (:mod:`pgprefetch.store.consumers`): ``--keep`` keeps what the slowest
        rank still reads.
        """
        try:
            self._backend.record_consumer(name, self.epoch, self.rank, self.world_size)
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
    def sources(self) -> list[str]:
        """A mixed epoch's sources, in code order: ``batch["source"] == i`` marks samples of ``sources[i]``.

        Empty for an epoch of one source (which has no ``source`` array).
        """
        return manifest_sources(self.manifest, f"{self._backend.location}/{epoch_name(self.epoch)}")

    @property
    def key_columns(self) -> KeyColumns:
        """The key columns: each takes one int64 slot of ``batch_keys``, a uuid column two."""
        m = self.manifest
        return KeyColumns.of_types(m["key_columns"], m.get("key_types", ["int"] * len(m["key_columns"])))

    @property
    def stats(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per field and column: count, mean, std, min and max over the epoch's real values (no padding)."""
        stats: dict[str, dict[str, dict[str, Any]]] = self.manifest.get("stats", {})
        return stats

    @property
    def longest(self) -> dict[str, np.ndarray]:
        """Each stored batch's longest sample per lengths array (``<field>_length``), and most rows (``n_rows``).

        Read from the epoch's ``_longest`` array, a few bytes a batch, not from the batches: to bucket
        batches by length, or to size a model's buffers, before reading any. Empty without padded fields.
        """
        entry = self.manifest.get("longest")
        if not entry:
            return {}
        where = f"{self._backend.location}/{epoch_name(self.epoch)}"
        names = entry.get("arrays") if isinstance(entry, dict) else None
        if not isinstance(names, list):
            raise StoreError(f"{where}: the manifest's record of the longest samples is not a table (a damaged store)")
        path = f"{epoch_name(self.epoch)}/{plain_name(entry.get('array'), where)}"
        n_batches = manifest_int(self.manifest, "n_batches", where)
        try:  # through zarr, which reads a local store with no link followed, as the batches are
            array = zarr.open_array(self._backend.zarr_store(), path=path, mode="r")
            if array.shape != (len(names), n_batches):  # it is read whole below: its size must be what it says
                raise ValueError(f"the table is {list(array.shape)}, not {len(names)} arrays of {n_batches} batches")
            table = np.asarray(array[:])
        except (OSError, ValueError, KeyError, TypeError) as e:  # zarr's, on metadata it cannot use
            raise StoreError(f"cannot read {self._backend.location}/{path}: {e} (a damaged store)") from None
        return {name: table[i] for i, name in enumerate(names)}

    @property
    def remote(self) -> bool:
        """Whether the store is an object store (batches fetched with ranged GETs, not mapped)."""
        return self._remote

    @property
    def bytes_fetched(self) -> int:
        """Object stores: batch bytes this reader fetched (in this process)."""
        return self._ranges.bytes_fetched

    @classmethod
    def from_config(
        cls,
        config: str | os.PathLike[str],
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
    ) -> Self:
        """Open epoch ``epoch`` of the store named by a config file; the other arguments are the class's."""
        return cls(
            load_config(config).store.path, epoch, fields=fields, batch_size=batch_size, rank=rank,
            world_size=world_size, wait=wait, timeout=timeout, consumer=consumer, prefetch=prefetch, trim=trim,
        )  # fmt: skip

    # --- this rank's batches --------------------------------------------------------------------------
    @property
    def n_global(self) -> int:
        """Global batches of the epoch at this batch size, counted from the resume point's batch."""
        return self._base // self.batch_size + -(-(self.n_samples - self._base) // self.batch_size)

    def __len__(self) -> int:
        """Batches for this rank (from the resume point on)."""
        return self._len

    def _seek(self, sample: int) -> None:
        """Start this view at ``sample`` (the resume point), the same on every rank."""
        self._base, self._pos = sample, 0
        self._len = -(-(self.n_samples - sample) // self.batch_size) // self.world_size

    def short_batch(self) -> int | None:
        """The samples of the short batch that ends this view on some rank, or None when every batch is full.

        Known at open, from the manifest's sample count: readers that need every batch the same size (a JAX
        global array) refuse it, or pad it, before the first step rather than at the epoch's end. Only the
        epoch's last global batch can be short, and a rank gets it only where the split does not drop it.
        """
        end = self._base + self._len * self.world_size * self.batch_size  # past the last sample handed out
        return self.batch_size - (end - self.n_samples) if self._len and end > self.n_samples else None

    def global_batch(self, i: int) -> int:
        """The epoch-wide index of this rank's batch ``i``."""
        i = self._index(i)
        return self._base // self.batch_size + i * self.world_size + self.rank

    def samples(self, i: int) -> tuple[int, int]:
        """The epoch's samples ``a..b`` that this rank's batch ``i`` holds (``b - a`` < batch size at the end)."""
        if not 0 <= i < self._len:
            i = self._index(i)
        a = self._base + (i * self.world_size + self.rank) * self.batch_size
        return a, min(self.n_samples, a + self.batch_size)

    def _index(self, i: int) -> int:
        """Batch ``i`` as a Python sequence takes it: ``-1`` is the last one; out of range an IndexError."""
        n = len(self)
        if isinstance(i, bool) or not -n <= i < n:
            raise IndexError(f"batch {i} out of range for a rank with {n} batches")
        return i + n if i < 0 else i

    def keys_array(self, i: int) -> np.ndarray:
        """The keys of batch ``i``'s samples as stored, int64 ``(size, n_slots)``, read-only NumPy."""
        return self._ranges.read(KEYS_ARRAY, *self.samples(i))

    def sample_keys(self, i: int) -> list[tuple[KeyValue, ...]]:
        """The keys of batch ``i``'s samples as the database has them.

        Ints, ``uuid.UUID`` for uuids, ``datetime.date`` for dates and ``datetime.datetime`` for timestamps
        (aware, in UTC, for timestamptz).
        """
        columns = self.key_columns
        return [columns.values(row) for row in self.keys_array(i).tolist()]

    def __iter__(self) -> Iterator[Batch[B]]:
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
            self._ranges.forget()  # a new pass maps the files afresh (in-place edits of a batch do not carry over)

    def batches(self, indices: Sequence[int], *, keys: bool = False) -> Iterator[Batch[B]]:
        """``self.batch(i, keys=keys)`` for each ``i`` of ``indices``, in order, without moving the state.

        Object stores: ``prefetch`` batches in flight as concurrent ranged GETs.
        """
        if not self._remote:
            for i in indices:
                yield self.batch(i, keys=keys)
            return
        with ThreadPoolExecutor(self.prefetch, thread_name_prefix="pgprefetch-read") as pool:
            pending: deque[Future[Batch[B]]] = deque()
            ahead = iter(indices)
            try:
                for _ in indices:
                    while len(pending) < self.prefetch and (j := next(ahead, None)) is not None:
                        pending.append(pool.submit(self.batch, j, keys=keys))
                    yield pending.popleft().result()
            finally:
                for future in pending:
                    future.cancel()

    # --- the resume state -----------------------------------------------------------------------------
    def state_dict(self, batches: int | None = None) -> dict[str, int]:
        """The resume state: the epoch and the first sample (and global batch) not yet handed out.

        Args:
            batches: the batches this rank has consumed, when they came through a loader that indexes the
                reader (``ds[i]``) rather than iterating it, so the reader cannot count them itself.
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

        The state may come from another world size, batch size or reader (NumPy or torch); one without
        ``next_sample`` (an older pgprefetch's) counts ``next_global_batch`` in its ``batch_size``, or the dump's.
        """
        if served_epoch(self._backend, state["epoch"]) != self.epoch:  # (an evaluation split: any, its one)
            raise ConfigError(f"resume state is for epoch {state['epoch']}, this dataset reads epoch {self.epoch}")
        if "next_sample" in state:
            sample = int(state["next_sample"])
        else:  # an older state; at the end of an epoch with a short last batch it counts past the last sample
            sample = int(state["next_global_batch"]) * int(state.get("batch_size") or self.stored_batch_size)
            sample = min(sample, self.n_samples)
        if not 0 <= sample <= self.n_samples:
            raise ConfigError(f"resume state sample {sample} is outside 0..{self.n_samples} of epoch {self.epoch}")
        self._seek(sample)


def check_ranks(rank: int, world_size: int) -> tuple[int, int]:
    """``(rank, world_size)``, if the rank is one of the world's; else a ConfigError."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside 0..{world_size - 1} (world_size {world_size})")
    return rank, world_size


def positive(name: str, value: int) -> int:
    """``value``, if it is a positive integer; else a ConfigError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def _chosen_fields(manifest: dict[str, Any], fields: Sequence[str] | None, epoch: int, where: str) -> tuple[str, ...]:
    """The fields asked for (every one by default), each checked to be the epoch's."""
    available = list(manifest_fields(manifest, where))  # every entry checked before a name is taken
    unknown = [f for f in fields or () if f not in available]
    if unknown:
        raise ConfigError(f"unknown field {unknown[0]!r}: epoch {epoch} has fields {', '.join(available)}")
    return tuple(fields or available)
