"""``EpochDataset``: a published epoch as torch tensors, zero-copy from disk, ahead of the step on the GPU.

The only module that imports torch. Batches are already shuffled, collated and fixed-shape on disk, so
reading is slicing: ``ds[i]`` maps the shard file holding batch ``i`` (once for all its batches) and
returns views of it, with no copy and no zarr call on the hot path. Compressed stores are decoded by zarr.

Ranks split the epoch by arithmetic: global batch ``g`` goes to rank ``g % world_size``, the remainder is
dropped, so every rank gets the same number of batches and none waits on another. The resume state is
two numbers, (epoch, next global batch): resuming with another world size re-slices what is left.
"""

from __future__ import annotations

import os
import threading
import uuid
import warnings
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import torch
import torch.utils.data
import zarr

from .config import load_config
from .errors import ConfigError, StoreError
from .keys import KeyColumns
from .layout import ArrayLayout, pread_into
from .localstore import LocalStore
from .store import KEYS_ARRAY, Store, epoch_name
from .workers import FileRef, by_reference

_TORCH_DTYPES = {
    np.dtype(name): getattr(torch, name)
    for name in ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")
}
_MAPPINGS_KEPT = 32  # shard mappings kept open per dataset (per worker process), least recently used dropped


class EpochDataset(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """One published epoch of a pgprefetch store, batch by batch, for one rank.

    Args:
        store: the store (``[store] path`` of the config): a folder, or ``s3://bucket/prefix``.
        epoch: the epoch to read.
        fields: the fields to return (all by default).
        rank: this process's rank; defaults to ``torch.distributed``'s when it is initialised, else 0.
        world_size: the number of ranks; same default, else 1.
        wait: if the epoch is not published yet, wait for it (up to ``timeout`` seconds).
        timeout: how long ``wait`` waits.
        consumer: the name this training run is recorded under in the store (the epoch it opened), which
            ``pgprefetch dump --ahead`` and ``--keep`` go by; None records nothing.
        prefetch: object stores: batches fetched ahead during iteration, as concurrent ranged GETs.
    """

    def __init__(
        self,
        store: str | os.PathLike[str],
        epoch: int,
        *,
        fields: Sequence[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        wait: bool = False,
        timeout: float = 600.0,
        consumer: str | None = "default",
        prefetch: int = 4,
    ) -> None:
        self._backend = Store(store)
        self._remote = not isinstance(self._backend, LocalStore)
        self.store: Path | str = self._backend.location if self._remote else Path(store)
        self.epoch = epoch
        self.prefetch = max(1, prefetch)
        self.bytes_fetched = 0  # object stores: batch bytes this dataset fetched (in this process)
        self.manifest = self._backend.wait_manifest(epoch, timeout if wait else None)
        self.manifest.pop("checksums", None)  # for `verify`; kept out of every DataLoader worker's pickle
        available = list(self.manifest["fields"])
        unknown = [f for f in fields or () if f not in available]
        if unknown:
            raise ConfigError(f"unknown field {unknown[0]!r}: epoch {epoch} has fields {', '.join(available)}")
        self.fields = tuple(fields or available)
        # A field with a NULL policy comes with its mask, "<field>_null", true where the database had NULL.
        masks = (self.manifest["fields"][f].get("null", {}).get("mask") for f in self.fields)
        self.arrays = (*self.fields, *(m for m in masks if m))
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.batch_size = int(self.manifest["batch_size"])
        self.n_global = int(self.manifest["n_batches"])
        self.n_samples = int(self.manifest["n_samples"])
        names = (*self.arrays, KEYS_ARRAY)
        if self._remote:
            self._layouts = {name: self._backend.array_layout(epoch, name) for name in names}
        else:  # local: Paths, for mapping and preadv
            self._layouts = {name: ArrayLayout.read(Path(store) / epoch_name(epoch) / name) for name in names}
        self._last_valid = self.n_samples - (self.n_global - 1) * self.batch_size  # samples in the last batch
        self._start = 0  # first global batch of this view (the resume point)
        self._pos = 0  # local batches handed out by iteration
        # (array, file number) -> batches of that file, indexable by slot (a tensor, or a list when a
        # zarr-written shard stores its chunks out of order), and the byte offset of each slot.
        self._shards: OrderedDict[tuple[str, int], tuple[Any, np.ndarray, FileRef]] = OrderedDict()
        self._zarr: dict[str, zarr.Array] = {}  # compressed arrays, opened once per process
        self._zarr_pid = os.getpid()
        self._fetched = threading.Lock()  # bytes_fetched is counted from the prefetch threads
        if consumer is not None and torch.utils.data.get_worker_info() is None:
            try:
                self._backend.record_consumer(consumer, epoch)
            except (OSError, StoreError) as e:  # a read-only copy of a store can still be read
                warnings.warn(f"cannot record consumer {consumer!r} in {self.store}: {e}", stacklevel=2)

    @property
    def categories(self) -> dict[str, list[str]]:
        """The category list of each categorical field: code ``i`` stands for ``categories[field][i]``."""
        return {name: f["categories"] for name, f in self.manifest["fields"].items() if "categories" in f}

    @property
    def key_columns(self) -> KeyColumns:
        """The key columns: each takes one int64 slot of :meth:`batch_keys`, a uuid column two."""
        m = self.manifest
        return KeyColumns(tuple(m["key_columns"]), tuple(t == "uuid" for t in m.get("key_types", ())))

    @classmethod
    def from_config(cls, config: str | os.PathLike[str], epoch: int, **kwargs: Any) -> EpochDataset:
        """Open epoch ``epoch`` of the store named by a config file."""
        return cls(load_config(config).store.path, epoch, **kwargs)

    def __len__(self) -> int:
        """Batches for this rank (from the resume point on)."""
        return max(0, (self.n_global - self._start) // self.world_size)

    def global_batch(self, i: int) -> int:
        """The epoch-wide index of this rank's batch ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"batch {i} out of range for a rank with {len(self)} batches")
        return self._start + i * self.world_size + self.rank

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        """Batch ``i`` of this rank: one tensor per field (and NULL mask), ``(size, *sample_shape)``.

        A short last batch is trimmed.
        """
        g = self.global_batch(i)
        batch = {name: self._read(name, g) for name in self.arrays}
        if torch.utils.data.get_worker_info() is not None and not self._remote:
            # In a DataLoader worker the batch is sent to the main process: as a reference to its bytes in
            # the file, which the main process maps too, not as a copy (see pgprefetch.workers).
            batch = {name: self._by_reference(name, g, t) for name, t in batch.items()}
        return batch

    def _by_reference(self, name: str, g: int, tensor: torch.Tensor) -> torch.Tensor:
        """Global batch ``g`` of ``name`` (``tensor``, just read) as a tensor that travels as a file range."""
        layout = self._layouts[name]
        if not layout.raw:
            return tensor  # decoded by zarr: a tensor of its own, which torch sends as usual
        number, slot = divmod(g, layout.per_file)
        _, offsets, file = self._shards[(name, number)]
        return by_reference(tensor, file, int(offsets[slot]))

    def batch_keys(self, i: int) -> torch.Tensor:
        """The keys of batch ``i``'s samples as stored, int64 ``(size, n_slots)``.

        A slot per key column, two per uuid column: its 16 bytes as two big-endian halves, which
        :func:`pgprefetch.uuid_bytes` turns back into bytes (:meth:`sample_keys` gives ``uuid.UUID``).
        """
        return self._read(KEYS_ARRAY, self.global_batch(i))

    def sample_keys(self, i: int) -> list[tuple[int | uuid.UUID, ...]]:
        """The keys of batch ``i``'s samples as the database has them: ints, and ``uuid.UUID`` for uuids."""
        columns = self.key_columns
        return [columns.values(row) for row in self.batch_keys(i).numpy().tolist()]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's batches from the resume state on; each one handed out advances the state."""
        if self._pos >= len(self):
            self._pos = 0  # a finished pass starts over
        if self._pos == 0:
            self._shards.clear()  # a new pass maps the files afresh (in-place edits of a batch do not carry over)
        if self._remote:
            yield from self._fetch_ahead()
            return
        while self._pos < len(self):
            batch = self[self._pos]
            self._pos += 1
            yield batch

    def _fetch_ahead(self) -> Iterator[dict[str, torch.Tensor]]:
        """Object stores: ``prefetch`` batches in flight as concurrent ranged GETs, handed out in order."""
        with ThreadPoolExecutor(self.prefetch, thread_name_prefix="pgprefetch-read") as pool:
            pending: deque[Future[dict[str, torch.Tensor]]] = deque()
            ahead = self._pos
            try:
                while self._pos < len(self):
                    while ahead < len(self) and len(pending) < self.prefetch:
                        pending.append(pool.submit(self.__getitem__, ahead))
                        ahead += 1
                    batch = pending.popleft().result()
                    self._pos += 1
                    yield batch
            finally:
                for future in pending:
                    future.cancel()

    def to_device(self, device: str | torch.device, prefetch: int = 2) -> Iterator[dict[str, torch.Tensor]]:
        """Iterate like ``iter(self)``, with batches already on ``device``.

        On CUDA, a ring of ``prefetch + 1`` reused pinned host buffers is filled with batches
        ``i+1 .. i+prefetch`` and copied on a side stream while the step runs on batch ``i``; the consumer's
        stream waits only for its own batch's copy. On the CPU the mapped tensors are yielded as they are.
        """
        device = torch.device(device)
        if device.type == "cpu":
            return iter(self)
        if device.type == "cuda":
            return _cuda_batches(self, device, max(1, prefetch))
        return ({k: v.to(device) for k, v in b.items()} for b in self)

    def state_dict(self, batches: int | None = None) -> dict[str, int]:
        """The resume state: the epoch and the first global batch not yet handed out.

        Args:
            batches: the batches this rank has consumed, when they came through a ``DataLoader`` (which
                calls ``ds[i]``, not ``iter(ds)``, so the dataset cannot count them itself).
        """
        done = self._pos if batches is None else batches
        return {"epoch": self.epoch, "next_global_batch": self._start + done * self.world_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from ``state``: this rank's batches are re-sliced from the remaining global batches."""
        if state["epoch"] != self.epoch:
            raise ConfigError(f"resume state is for epoch {state['epoch']}, this dataset reads epoch {self.epoch}")
        if not 0 <= state["next_global_batch"] <= self.n_global:
            raise ConfigError(f"resume state batch {state['next_global_batch']} is outside 0..{self.n_global}")
        self._start, self._pos = int(state["next_global_batch"]), 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_shards"] = OrderedDict()  # mappings are per process: each DataLoader worker opens its own
        state["_zarr"] = {}
        state["_fetched"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _fetched=threading.Lock())

    def _read(self, name: str, g: int) -> torch.Tensor:
        """Global batch ``g`` of array ``name``: a view of the mapped file, a fetched copy, or zarr's decoding."""
        layout = self._layouts[name]
        if not layout.raw:  # compressed: zarr decodes
            if self._zarr_pid != os.getpid():  # a forked worker opens its own (an S3 client does not fork)
                self._zarr, self._zarr_pid = {}, os.getpid()
            if name not in self._zarr:
                key = f"{epoch_name(self.epoch)}/{name}"
                self._zarr[name] = zarr.open_array(self._backend.zarr_store(), path=key, mode="r")
            tensor = torch.from_numpy(np.ascontiguousarray(self._zarr[name][g]))
        elif self._remote:
            tensor = torch.empty(layout.batch_shape, dtype=_TORCH_DTYPES[layout.dtype])
            self._fetch_into(name, g, tensor.numpy())
        else:
            number, slot = divmod(g, layout.per_file)
            shard = self._shards.get((name, number))
            if shard is None:
                shard = self._map(name, number)
            else:
                self._shards.move_to_end((name, number))
            tensor = shard[0][slot]
        return tensor[: self._last_valid] if g == self.n_global - 1 else tensor

    def read_into(self, i: int, out: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Read batch ``i`` with ``preadv`` straight into ``out``'s tensors (one copy, no page mapping).

        ``out`` holds a contiguous CPU tensor of shape ``(size, *sample_shape)`` per array (``self.arrays``:
        the fields and their NULL masks), e.g. pinned staging buffers; returns views of them (trimmed for a
        short last batch).
        """
        g = self.global_batch(i)
        result = {}
        for name in self.arrays:
            layout, target = self._layouts[name], out[name]
            if not layout.raw:
                batch = self._read(name, g)
                target[: batch.shape[0]].copy_(batch)
            elif self._remote:
                self._fetch_into(name, g, target.numpy())
            else:
                number, slot = divmod(g, layout.per_file)
                shard = self._shards.get((name, number)) or self._map(name, number)
                path, _ = layout.file(g)
                pread_into(path, target.numpy().reshape(-1).view(np.uint8), int(shard[1][slot]))
            result[name] = target[: self._last_valid] if g == self.n_global - 1 else target
        return result

    def _fetch_into(self, name: str, g: int, out: np.ndarray) -> None:
        """Object stores: one ranged GET of batch ``g`` of ``name`` into ``out``.

        pgprefetch writes a shard's chunks back to back, so the range is known from the layout, with no
        read of the shard's index.
        """
        layout = self._layouts[name]
        path, slot = layout.file(g)
        data = self._backend.read_range(str(path), slot * layout.batch_bytes, layout.batch_bytes)
        raw = np.frombuffer(data, dtype=np.uint8)
        if raw.size != layout.batch_bytes:
            raise StoreError(f"{self.store}/{path}: the object ends before batch {g} (truncated?)")
        out.reshape(-1).view(np.uint8)[:] = raw
        with self._fetched:
            self.bytes_fetched += raw.size

    def _map(self, name: str, number: int) -> tuple[Any, np.ndarray, FileRef]:
        """Map file ``number`` of array ``name`` once (private, copy-on-write) and keep it for its batches."""
        layout = self._layouts[name]
        path, _ = layout.file(number * layout.per_file)
        stat = path.stat()
        size = stat.st_size
        mapping = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8)
        nbytes = layout.batch_bytes
        if layout.sharded:
            tail = mapping[size - layout.index_bytes :].numpy()
            crc = int.from_bytes(tail[-4:].tobytes(), "little")
            if google_crc32c.value(tail[:-4].tobytes()) != crc:
                raise StoreError(f"{path}: shard index checksum mismatch (the file is damaged)")
            offsets = layout.shard_index(tail)[:, 0].copy()
        else:
            offsets = np.zeros(1, dtype=np.uint64)
        valid = min(layout.per_file, layout.n_batches - number * layout.per_file)
        dtype = _TORCH_DTYPES[layout.dtype]
        if np.array_equal(offsets[:valid], np.arange(valid, dtype=np.uint64) * nbytes):
            # Chunks back to back (as pgprefetch writes them): one typed view, indexed by slot.
            batches: Any = mapping[: valid * nbytes].view(dtype).view(valid, *layout.batch_shape)
        else:
            batches = [mapping[int(o) : int(o) + nbytes].view(dtype).view(layout.batch_shape) for o in offsets[:valid]]
        self._shards[(name, number)] = (batches, offsets, FileRef.of(str(path), stat))
        if len(self._shards) > _MAPPINGS_KEPT:  # tensors handed out keep their mapping alive themselves
            self._shards.popitem(last=False)
        return self._shards[(name, number)]


def _rank_and_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    dist = torch.distributed
    initialised = dist.is_available() and dist.is_initialized()
    world = world_size if world_size is not None else (dist.get_world_size() if initialised else 1)
    r = rank if rank is not None else (dist.get_rank() if initialised else 0)
    if world < 1 or not 0 <= r < world:
        raise ConfigError(f"rank {r} is outside 0..{world - 1} (world_size {world})")
    return r, world


def _cuda_batches(ds: EpochDataset, device: torch.device, depth: int) -> Iterator[dict[str, torch.Tensor]]:
    """The CUDA side of :meth:`EpochDataset.to_device` (see its docstring)."""
    stream = torch.cuda.Stream(device)
    n_slots = depth + 1
    pinned: list[dict[str, torch.Tensor] | None] = [None] * n_slots
    copied: list[torch.cuda.Event | None] = [None] * n_slots
    pending: deque[tuple[dict[str, torch.Tensor], torch.cuda.Event]] = deque()
    if ds._pos >= len(ds):
        ds._pos = 0
    start, n = ds._pos, len(ds)

    def submit(i: int) -> None:
        slot = i % n_slots
        if copied[slot] is not None:
            copied[slot].synchronize()  # the slot's previous copy must be done before it is overwritten
        if pinned[slot] is None:
            pinned[slot] = {
                name: torch.empty(
                    ds._layouts[name].batch_shape, dtype=_TORCH_DTYPES[ds._layouts[name].dtype]
                ).pin_memory()
                for name in ds.arrays
            }
        buffers = pinned[slot]
        assert buffers is not None
        host = ds.read_into(i, buffers)  # page cache -> pinned with preadv: one copy, no page faults
        out = {}
        with torch.cuda.stream(stream):
            for name, staging in host.items():
                out[name] = staging.to(device, non_blocking=True)  # pinned -> device, on the side stream
            event = torch.cuda.Event()
            event.record(stream)
        copied[slot] = event
        pending.append((out, event))

    submitted = start
    for i in range(start, n):
        while submitted < n and submitted <= i + depth:
            submit(submitted)
            submitted += 1
        out, event = pending.popleft()
        current = torch.cuda.current_stream(device)
        current.wait_event(event)  # the step waits for this batch only
        for tensor in out.values():
            tensor.record_stream(current)  # allocated on the side stream, used on the step's
        ds._pos = i + 1
        yield out
