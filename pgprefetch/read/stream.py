"""``EpochStream``: consecutive epochs of a store as one torch ``IterableDataset``, for training loops.

A training run reads many epochs while ``pgprefetch dump --ahead`` writes the next ones, under a framework
with its own ideas about sharding and resuming. The stream is the shape those frameworks take:

- **Order.** This rank's batches of one epoch (as :class:`~pgprefetch.EpochDataset` slices them), then of
  the next, waiting for each to be published and recording the consumer as it opens it.
- **Workers.** With ``num_workers = k``, worker ``w`` takes the ``w``-th of every ``k`` batches of the
  rank's whole sequence, counted across epochs. The DataLoader takes one batch from each worker in turn,
  so it hands batches out in the sequence's order, and whatever was consumed is a prefix of it.
- **State.** A position, (epoch, next sample), the same on every rank. In the main process it advances
  with each batch handed out. In a worker it is the position after that worker's last batch, plus how far
  away its next one is; torchdata's ``StatefulDataLoader`` saves one per worker, and gives each back to its
  worker on restore. With another ``num_workers`` or world size those per-worker states do not fit, so a
  worker refuses them; :meth:`EpochStream.load_state_dict` in the main process takes the loader's whole
  state instead, finds the position, and any loader made afterwards goes on from there.
- **Sharding.** It is already split by rank. Lightning injects no sampler for an ``IterableDataset``;
  Accelerate's ``prepare()`` would split it again, which the stream refuses (see :func:`_resharder`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.utils.data

from pgprefetch.errors import ConfigError, EpochNotFoundError, StoreError
from pgprefetch.read.dataset import EpochDataset, positive, rank_and_world
from pgprefetch.read.padding import trim as trim_padding
from pgprefetch.store.open import open_store

_RESHARDERS = ("IterableDatasetShard", "DataLoaderDispatcher")  # accelerate's wrappers that split a dataset


class EpochStream(torch.utils.data.IterableDataset[dict[str, torch.Tensor]]):
    """Consecutive published epochs of a store, batch by batch, for one rank.

    Args:
        store: the store (``[store] path`` of the config): a folder, or ``s3://bucket/prefix``.
        start_epoch: the first epoch.
        epochs: how many epochs the stream holds; None: it never ends.
        batch_size: samples per batch handed out; None keeps the dump's (see :class:`~pgprefetch.EpochDataset`).
        fields: the fields to return (all by default).
        rank: this process's rank; defaults to ``torch.distributed``'s when it is initialised, else 0.
        world_size: the number of ranks; same default, else 1.
        keys: also return each batch's sample keys, as ``batch["keys"]`` (int64, a slot per key column).
        trim: cut padded fields to each batch's longest sample (see :class:`~pgprefetch.EpochDataset`).
        buffers: 0 hands out views of the mapped files (zero-copy). ``n > 0`` reads each batch with one
            ``preadv`` into a ring of ``n`` reused buffers instead (one copy, no page faults: faster when
            every batch is copied anyway, e.g. to a GPU); a batch is then valid until ``n`` more batches
            have been handed out. DataLoader workers always hand out file ranges.
        consumer: the name this training run is recorded under as it opens each epoch (rank 0 records it),
            which keeps ``pgprefetch dump --ahead`` driving; None records nothing.
        timeout: how long to wait for an epoch to be published before giving up with an error.
    """

    def __init__(
        self,
        store: str | os.PathLike[str],
        start_epoch: int = 0,
        epochs: int | None = None,
        *,
        batch_size: int | None = None,
        fields: Sequence[str] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        keys: bool = False,
        trim: bool = False,
        buffers: int = 0,
        consumer: str | None = "default",
        timeout: float = 600.0,
    ) -> None:
        if isinstance(start_epoch, bool) or not isinstance(start_epoch, int) or start_epoch < 0:
            raise ConfigError(f"start_epoch must be an integer >= 0, got {start_epoch!r}")
        if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
            raise ConfigError(f"epochs must be a positive integer or None, got {epochs!r}")
        if batch_size is not None:
            positive("batch_size", batch_size)  # EpochDataset's check and message
        self.store = store
        self.start_epoch = start_epoch
        self.end = None if epochs is None else start_epoch + epochs  # the first epoch not in the stream
        self.batch_size = batch_size
        self.fields = tuple(fields) if fields is not None else None
        self.keys = keys
        self.trim = trim
        if isinstance(buffers, bool) or not isinstance(buffers, int) or buffers < 0:
            raise ConfigError(f"buffers must be an integer >= 0, got {buffers!r}")
        self.buffers = buffers
        self.consumer = consumer
        self.timeout = timeout
        self._rank, self._world = rank, world_size  # as asked; torch.distributed fills them in when iterating
        # The position: the next batch starts at (epoch, sample), read at batch size _size (None: the dump's)...
        self._epoch, self._sample, self._size = start_epoch, 0, batch_size
        # ...or, while an epoch is read, after the first _done batches of _live (worked out when asked for).
        self._live: EpochDataset | None = None
        self._done = 0
        self._offset: int | None = None  # in a worker: batches between the position and this worker's next
        self._finished = False  # this object read to the end: the next pass starts over
        self._worker_start: tuple[int, int, int | None, int | None] | None = None  # a worker's first position
        self._figures: dict[int, tuple[int, int]] = {}  # epoch -> (n_samples, batch size) as counted (_advance)

    # --- iteration --------------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's batches from the position on, across epochs; a worker takes its share of them."""
        wrapper = _resharder()
        if wrapper is not None and _processes(wrapper) > 1:
            raise _resharding_error(wrapper)
        rank, world = rank_and_world(self._rank, self._world)
        info = torch.utils.data.get_worker_info()
        k, w = (info.num_workers, info.id) if info is not None else (1, 0)
        if info is not None:
            # A persistent worker's next pass starts where the main process's stream stood (or where a
            # StatefulDataLoader put it): what it produced last pass may never have been consumed.
            if self._worker_start is None:
                self._worker_start = (*self._position(), self._offset)
            else:
                self._move(*self._worker_start)
        elif self._finished:  # a finished stream starts over, as a dataset does
            self._move(self.start_epoch, 0, self.batch_size)
        self._finished = False
        epoch, sample, _ = self._position()
        skip = self._offset if self._offset is not None else w  # batches before this worker's first
        while self.end is None or epoch < self.end:
            ds = self._open(epoch, sample, rank, world, record=rank == 0 and w == 0)
            n = len(ds)
            indices = range(skip, n, k)
            ring = [ds.new_buffers() for _ in range(self.buffers if info is None and not ds.remote else 0)]
            plain = info is None and not ring and not self.keys and not ds.remote
            fetched = None if plain or ring else ds.batches(indices, keys=self.keys)  # fetched ahead over S3
            for i in indices:
                if plain:
                    batch = ds[i]
                elif ring:
                    batch = ds.read_into(i, ring[i % len(ring)])
                    if self.keys:
                        batch["keys"] = ds.batch_keys(i)
                    if self.trim:
                        batch = trim_padding(batch, ds.manifest)
                else:
                    batch = next(fetched)  # type: ignore[arg-type]
                # Whoever holds this batch has consumed everything before it: the position is after it.
                if self._live is not ds:  # and from a worker's first batch on, its next is k batches away
                    self._live, self._offset = ds, (k - 1 if info is not None else None)
                self._done = i + 1
                yield batch
            skip = (indices[-1] + k if indices else skip) - n  # this worker's first batch of the next epoch
            epoch, sample = epoch + 1, 0
        self._finished = info is None

    def _open(self, epoch: int, sample: int, rank: int, world: int, *, record: bool) -> EpochDataset:
        """Epoch ``epoch`` from ``sample`` on, once it is published (up to ``timeout``)."""
        ds = EpochDataset(
            self.store,
            epoch,
            fields=self.fields,
            batch_size=self.batch_size,
            rank=rank,
            world_size=world,
            wait=True,
            timeout=self.timeout,
            consumer=None,
            trim=self.trim,
        )
        if sample:
            ds.load_state_dict({"epoch": epoch, "next_sample": sample})
        if record and self.consumer is not None:
            ds.record_consumer(self.consumer)
        return ds

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of epoch ``epoch``, for frameworks that call this before each pass.

        The position stays where it is if it is already in ``epoch``: a stream resumed mid-epoch goes on
        from its state, not from the epoch's start. Accelerate's loaders call this with their own count of
        passes, not an epoch of the store: the stream ignores those calls (and refuses being re-sharded).
        """
        wrapper = _resharder()
        if wrapper is not None:
            if _processes(wrapper) > 1:
                raise _resharding_error(wrapper)
            return
        last = "" if self.end is None else f"..{self.end - 1}"
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < self.start_epoch:
            raise ConfigError(f"set_epoch needs an epoch of the stream ({self.start_epoch}{last}), got {epoch!r}")
        if self.end is not None and epoch >= self.end:
            raise ConfigError(f"set_epoch needs an epoch of the stream ({self.start_epoch}{last}), got {epoch}")
        if epoch != self._position()[0]:
            self._move(epoch, 0, self.batch_size)

    def _position(self) -> tuple[int, int, int | None]:
        """(epoch, next sample, batch size) after the batches handed out."""
        ds = self._live
        if ds is None:
            return self._epoch, self._sample, self._size
        if self._done < len(ds):
            return ds.epoch, ds.next_sample(self._done), ds.batch_size
        return ds.epoch + 1, 0, ds.batch_size  # the next epoch may not be published yet: the size read so far

    def _move(self, epoch: int, sample: int, size: int | None, offset: int | None = None) -> None:
        """Set the position (and, in a worker, the distance to its next batch)."""
        self._epoch, self._sample, self._size, self._offset, self._live = epoch, sample, size, offset, None
        self._finished = False

    # --- state ------------------------------------------------------------------------------------------
    def state_dict(self, batches: int | None = None) -> dict[str, Any]:
        """The resume state: the position (epoch, next sample) after the batches handed out.

        Args:
            batches: with a plain ``DataLoader`` whose workers iterate, the batches consumed since this
                stream's position (its state when the loader started): the main process's stream cannot count
                them itself. The position moves that many batches on, across epochs.
        """
        epoch, sample, size = self._position()
        _, world = rank_and_world(self._rank, self._world)
        info = torch.utils.data.get_worker_info()
        if batches:
            epoch, sample, size = self._advance((epoch, sample), batches, world, self.batch_size)
        if size is None and sample:  # next_global_batch counts in the batch size read: the dump's
            size = self._stored_size(epoch)  # (mid-epoch: the epoch is published)
        state: dict[str, Any] = {
            "epoch": epoch,
            "next_global_batch": sample // size if size else 0,
            "next_sample": sample,
            "batch_size": size,
        }
        if info is not None:  # one worker's share: fits only the same split
            offset = self._offset if self._offset is not None else info.id
            state.update(num_workers=info.num_workers, worker=info.id, worker_offset=offset, world_size=world)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: one of this stream's, or a torchdata ``StatefulDataLoader``'s whole state.

        In the main process this sets the position, for any world size, batch size or ``num_workers``. In a
        worker (a ``StatefulDataLoader`` restoring) it takes that worker's state, which fits only the same
        ``num_workers``, world size and batch size.
        """
        if "_snapshot" in state or "dataset_state" in state:  # a StatefulDataLoader's state
            state = self._from_loader(state)
        info = torch.utils.data.get_worker_info()
        epoch, size = int(state["epoch"]), state.get("batch_size")
        offset = None
        if "num_workers" in state:
            if info is None:
                raise ConfigError(
                    "this is one DataLoader worker's state: load the loader's whole state_dict() into the stream"
                )
            _, world = rank_and_world(self._rank, self._world)
            # A worker that had handed out nothing saved no batch size: its position is in samples, any fits.
            saved = (state["num_workers"], state["world_size"], size)
            reading = (info.num_workers, world, None if size is None else self.batch_size or self._stored_size(epoch))
            if saved != reading:
                raise ConfigError(
                    f"this loader state was saved with num_workers={saved[0]}, world size {saved[1]}, batch size "
                    f"{saved[2]}, and this loader has {reading[0]}, {reading[1]}, {reading[2]}: "
                    "stream.load_state_dict(saved_state), then make a new loader without loading its state"
                )
            offset = int(state["worker_offset"])
        if "next_sample" in state:
            sample = int(state["next_sample"])
        else:  # an older state; at the end of an epoch with a short last batch it counts past the last sample
            manifest = open_store(self.store).manifest(epoch)
            sample = int(state["next_global_batch"]) * int(size or manifest["batch_size"])
            sample = min(sample, int(manifest["n_samples"]))
        self._move(epoch, sample, self.batch_size, offset)
        self._worker_start = (epoch, sample, self.batch_size, offset) if info is not None else None

    def _from_loader(self, loader: dict[str, Any]) -> dict[str, Any]:
        """The position a ``StatefulDataLoader``'s state stands for, as this stream's state."""
        if "dataset_state" in loader:  # num_workers=0: the stream's own state
            if not loader["dataset_state"]:
                raise ConfigError("the loader state holds no stream state (was it a loader over this stream?)")
            return dict(loader["dataset_state"])
        snapshot = loader["_snapshot"]
        workers = [s.get("dataset_state") for s in snapshot.get("_worker_snapshots", {}).values() if s]
        workers = [s for s in workers if s]
        if not workers:
            raise ConfigError("the loader state holds no stream state (was it a loader over this stream?)")
        # Batches are consumed in the sequence's order, so the worker whose batch came last holds the furthest
        # position, and everything before it was consumed; batches since the last snapshot come after that,
        # counted as the saving run counted them.
        latest = max(workers, key=lambda s: (s["epoch"], s["next_sample"]))
        start = (latest["epoch"], latest["next_sample"])
        steps = int(snapshot.get("_steps_since_snapshot", loader.get("_steps_since_snapshot", 0)))
        epoch, sample, size = self._advance(start, steps, latest["world_size"], latest["batch_size"])
        return {"epoch": epoch, "next_sample": sample, "batch_size": size}

    def _advance(self, start: tuple[int, int], batches: int, world: int, size: int | None) -> tuple[int, int, int]:
        """The position ``batches`` of a rank's batches after ``start``, from the epochs' manifests.

        ``world`` and ``size`` are those the batches were read with (``size`` None: each epoch's dump size).
        Each epoch's figures are read once and kept: cron's ``--keep`` deletes the epochs a training run has
        left behind, and a loader's count of batches starts where the loader did, many epochs ago.
        """
        (epoch, sample), left = start, batches
        while True:
            if epoch not in self._figures:
                try:
                    manifest = open_store(self.store).manifest(epoch)
                except EpochNotFoundError as e:
                    raise EpochNotFoundError(
                        f"cannot count the batches consumed through epoch {epoch}: {e}; it was deleted before the "
                        "state was saved in it (save it at least once an epoch, or raise the dump's --keep)"
                    ) from None
                self._figures[epoch] = (int(manifest["n_samples"]), int(manifest["batch_size"]))
            n_samples, stored = self._figures[epoch]
            step = size or stored
            n = -(-(n_samples - sample) // step) // world
            if left < n:
                return epoch, min(n_samples, sample + left * world * step), step
            if left == n:  # the end of this epoch: the next one need not be published yet
                return epoch + 1, 0, step
            epoch, sample, left = epoch + 1, 0, left - n

    # --- what the epochs hold ------------------------------------------------------------------------------
    @property
    def categories(self) -> dict[str, list[str]]:
        """The category list of each categorical field that decodes every published epoch of the stream.

        For sizing an embedding table. A store keeps a code's meaning in all its epochs: ``"auto"`` lists
        only grow, at the end, as new values turn up, so the epochs' lists are prefixes of one another and
        the longest (the newest vocabulary among the stream's epochs published now, including those not
        read yet) decodes them all. It is read from the store when asked, the same in every process and
        DataLoader worker; an epoch dumped later may add values, so ask again at each epoch, or leave room
        in the table. With none of the stream's epochs published yet it waits for the first (``timeout``).

        Raises:
            StoreError: two of the stream's epochs code a field differently (epochs of another config
                written with ``--force``, or written before stores kept their vocabulary).
        """
        backend = open_store(self.store)
        epochs = [e for e in backend.epochs() if e >= self.start_epoch and (self.end is None or e < self.end)]
        lists: dict[str, list[str]] = {}
        source: dict[str, int] = {}  # the epoch each list comes from
        for epoch in epochs or [self.start_epoch]:
            try:
                manifest = backend.wait_manifest(epoch, None if epochs else self.timeout)
            except EpochNotFoundError:  # pruned since it was listed
                continue
            for name, entry in manifest["fields"].items():
                values, known = entry.get("categories"), lists.get(name, [])
                if values is not None and values[: len(known)] != known[: len(values)]:
                    raise StoreError(
                        f"epochs {source[name]} and {epoch} of {backend.location} code field {name} with different "
                        "category lists: one model cannot be trained on both"
                    )
                if values is not None and (name not in lists or len(values) > len(known)):
                    lists[name], source[name] = values, epoch
        return lists

    def _stored_size(self, epoch: int) -> int:
        return int(open_store(self.store).manifest(epoch)["batch_size"])

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_epoch"], state["_sample"], state["_size"] = self._position()
        state["_live"] = None  # the position travels, not the epoch being read
        if state["_rank"] is None or state["_world"] is None:  # pickled for a spawned worker: ranks as they are
            dist = torch.distributed
            if dist.is_available() and dist.is_initialized():
                state["_rank"], state["_world"] = rank_and_world(state["_rank"], state["_world"])
        return state


def _resharder() -> Any:
    """Accelerate's wrapper that is about to split the stream across processes once more, if one called.

    Accelerate shards any ``IterableDataset`` it prepares (``IterableDatasetShard``) or reads it on process 0
    and dispatches the batches (``DataLoaderDispatcher``). The stream is already split by rank, so either
    would drop most of the data without a word; both call ``set_epoch`` before iterating, and the shard
    iterates the stream itself, which is where this looks (a few frames up).
    """
    try:
        frame = sys._getframe(2)
    except ValueError:  # called from the bottom of a stack
        return None
    for _ in range(6):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        kind = type(owner)
        if kind.__name__ in _RESHARDERS and kind.__module__.startswith("accelerate"):
            return owner
        frame = frame.f_back
    return None


def _processes(wrapper: Any) -> int:
    return int(getattr(wrapper, "num_processes", None) or getattr(getattr(wrapper, "state", None), "num_processes", 1))


def _resharding_error(wrapper: Any) -> ConfigError:
    return ConfigError(
        f"EpochStream is already split by rank, and Accelerate's {type(wrapper).__name__} would split it "
        f"again across {_processes(wrapper)} processes and drop data: do not pass its DataLoader to "
        "accelerator.prepare() (move batches with .to(accelerator.device))"
    )
