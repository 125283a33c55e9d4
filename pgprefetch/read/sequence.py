"""Consecutive published epochs of a store as one sequence of batches: the position, the order, the state.

A training run reads many epochs while ``pgprefetch dump --ahead`` writes the next ones. What that takes,
whatever the array type, lives here once, for the NumPy stream (:class:`~pgprefetch.read.stream.ArrayStream`)
and the torch one (:class:`pgprefetch.EpochStream`, which adds DataLoader workers and torchdata's loader
state on top):

- **Order.** This rank's batches of one epoch (as the epoch readers slice them), then of the next, waiting
  for each to be published and recording the consumer as it opens it (each rank its own record).
- **Shares.** Worker ``w`` of ``k`` takes the ``w``-th of every ``k`` batches of the rank's whole sequence,
  counted across epochs; one process is worker 0 of 1.
- **State.** A position, (epoch, next sample), the same on every rank: after the batches handed out.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any, Generic

from pgprefetch.errors import ConfigError, EpochNotFoundError, EpochNotReadyError, StoreError
from pgprefetch.read.padding import trim as trim_padding
from pgprefetch.read.view import B, Batch, EpochView, positive
from pgprefetch.store.base import Store, epoch_name
from pgprefetch.store.checks import manifest_fields, manifest_int, manifest_sources
from pgprefetch.store.open import open_store
from pgprefetch.store.splits import refuse_whole, served_epoch


class EpochSequence(Generic[B]):
    """Consecutive published epochs of a store, batch by batch, for one rank; subclasses name the reader.

    Args:
        store: the store (``[store] path`` of the config): a folder, or ``s3://bucket/prefix``.
        start_epoch: the first epoch.
        epochs: how many epochs the stream holds; None: it never ends.
        batch_size: samples per batch handed out; None keeps the dump's.
        fields: the fields to return (all by default).
        rank: this process's rank; by default the framework's when the stream is iterated, else 0.
        world_size: the number of ranks; same default, else 1.
        keys: also return each batch's sample keys, as ``batch["keys"]`` (int64, a slot per key column).
        trim: cut padded fields to each batch's longest sample.
        buffers: 0 hands out views of the mapped files (zero-copy). ``n > 0`` reads each batch with one
            ``preadv`` into a ring of ``n`` reused buffers instead (one copy, no page faults: faster when
            every batch is copied anyway, e.g. to a device); a batch is then valid until ``n`` more batches
            have been handed out.
        consumer: the name this training run is recorded under as it opens each epoch (each rank records its
            own), which keeps ``pgprefetch dump --ahead`` driving; None records nothing.
        timeout: how long to wait for an epoch to be published before giving up with an error.
        split: one of the store's splits (a config's ``[splits]``); required for a store that has them.
    """

    reader: type[EpochView[Any]]  # the class that reads one epoch

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
        split: str | None = None,
    ) -> None:
        if isinstance(start_epoch, bool) or not isinstance(start_epoch, int) or start_epoch < 0:
            raise ConfigError(f"start_epoch must be an integer >= 0, got {start_epoch!r}")
        if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
            raise ConfigError(f"epochs must be a positive integer or None, got {epochs!r}")
        if batch_size is not None:
            positive("batch_size", batch_size)  # the epoch readers' check and message
        self.store = store
        self.split = split
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
        self._rank, self._world = rank, world_size  # as asked; the framework fills them in when iterating
        # The position: the next batch starts at (epoch, sample), read at batch size _size (None: the dump's)...
        self._epoch, self._sample, self._size = start_epoch, 0, batch_size
        # ...or, while an epoch is read, after the first _done batches of _live (worked out when asked for).
        self._live: EpochView[B] | None = None
        self._live_epoch = 0  # the stream's number of _live's epoch (an evaluation split's view reads epoch 0)
        self._done = 0
        self._offset: int | None = None  # in a worker: batches between the position and this worker's next
        self._finished = False  # this object read to the end: the next pass starts over
        self._figures: dict[int, tuple[int, int]] = {}  # epoch -> (n_samples, batch size) as counted (_advance)

    # --- iteration --------------------------------------------------------------------------------------
    def _batches(self, rank: int, world: int, k: int = 1, w: int = 0, *, worker: bool = False) -> Iterator[Batch[B]]:
        """This rank's batches from the position on, across epochs; worker ``w`` of ``k`` takes its share."""
        self._finished = False
        epoch, sample, _ = self._position()
        skip = self._offset if self._offset is not None else w  # batches before this worker's first
        while self.end is None or epoch < self.end:
            ds = self._open(epoch, sample, rank, world, record=w == 0)  # each rank's first worker records
            indices = range(skip, len(ds), k)
            for i, batch in zip(indices, self._epoch_batches(ds, indices, worker=worker), strict=True):
                # Whoever holds this batch has consumed everything before it: the position is after it.
                if self._live is not ds:  # and from a worker's first batch on, its next is k batches away
                    self._live, self._live_epoch, self._offset = ds, epoch, (k - 1 if worker else None)
                self._done = i + 1
                yield batch
            skip = (indices[-1] + k if indices else skip) - len(ds)  # this worker's first batch of the next epoch
            epoch, sample = epoch + 1, 0
        self._finished = not worker

    def _epoch_batches(self, ds: EpochView[B], indices: range, *, worker: bool) -> Iterator[Batch[B]]:
        """The batches ``indices`` of one epoch: indexed, read into a ring of reused buffers, or fetched ahead.

        A worker process and a remote store's epoch fetch ahead (the batches leave the process, or come over
        the network); otherwise a ring of ``buffers`` reused buffers where asked for, else plain indexing.
        """
        ring = [ds.new_buffers() for _ in range(self.buffers if not worker and not ds.remote else 0)]
        if ring:
            for i in indices:
                batch = ds.read_into(i, ring[i % len(ring)])
                if self.keys:
                    batch["keys"] = ds.batch_keys(i)
                yield trim_padding(batch, ds.manifest) if self.trim else batch
        elif not worker and not self.keys and not ds.remote:
            for i in indices:
                yield ds[i]
        else:
            yield from ds.batches(indices, keys=self.keys)  # fetched ahead over S3

    def _open(self, epoch: int, sample: int, rank: int, world: int, *, record: bool, wait: bool = True) -> EpochView[B]:
        """Epoch ``epoch`` from ``sample`` on, once it is published (up to ``timeout``; ``wait``: else at once)."""
        ds = self.reader(
            self.store,
            epoch,
            fields=self.fields,
            batch_size=self.batch_size,
            rank=rank,
            world_size=world,
            wait=wait,
            timeout=self.timeout,
            consumer=None,
            trim=self.trim,
            split=self.split,
        )
        if sample:
            ds.load_state_dict({"epoch": ds.epoch, "next_sample": sample})  # (an evaluation split's: epoch 0)
        if record and self.consumer is not None:
            ds.record_consumer(self.consumer)
        return ds

    def short_batches(self, rank: int, world: int) -> str | None:
        """What may end an epoch of this stream in a short batch, as a phrase; None if no epoch can.

        Known before the first batch, from the manifests: the epoch at the position, if it is published,
        ends in one on some rank; or a later epoch may, because the epochs are dumped with
        ``drop_last = false`` (their sample counts follow the table) or read at a batch size that does not
        divide the dump's. Readers that need every batch the same size (a JAX global array) go by it.
        """
        epoch, sample, _ = self._position()
        try:
            ds = self._open(epoch, sample, rank, world, record=False, wait=False)
        except (EpochNotFoundError, EpochNotReadyError):  # not published yet: the stream waits for it when iterated
            return None
        short = ds.short_batch()
        if short is not None:
            return f"epoch {epoch} ends in a batch of {short} samples after batches of {ds.batch_size}"
        if self.end is not None and epoch + 1 >= self.end:
            return None
        if not ds.manifest.get("drop_last", True):
            return (
                f"epoch {epoch} is dumped with drop_last = false: a later epoch whose samples are not a multiple "
                f"of {ds.batch_size} ends in a short batch"
            )
        if ds.stored_batch_size % ds.batch_size:
            return (
                f"batches of {ds.batch_size} do not divide the dump's {ds.stored_batch_size}: "
                "a later epoch may end in a short batch"
            )
        return None

    def read_batch_size(self) -> int | None:
        """The batch size the stream reads: as given, else the dump's, if the epoch at the position is published."""
        if self.batch_size is not None:
            return self.batch_size
        try:
            return self._stored_size(self._position()[0])
        except (EpochNotFoundError, EpochNotReadyError):
            return None

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of epoch ``epoch``, for frameworks that call this before each pass.

        The position stays where it is if it is already in ``epoch``: a stream resumed mid-epoch goes on
        from its state, not from the epoch's start.
        """
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
            return self._live_epoch, ds.next_sample(self._done), ds.batch_size
        return self._live_epoch + 1, 0, ds.batch_size  # the next epoch may not be published yet: the size read so far

    def _move(self, epoch: int, sample: int, size: int | None, offset: int | None = None) -> None:
        """Set the position (and, in a worker, the distance to its next batch)."""
        self._epoch, self._sample, self._size, self._offset, self._live = epoch, sample, size, offset, None
        self._finished = False

    # --- state ------------------------------------------------------------------------------------------
    def _state(self, batches: int | None, world: int) -> dict[str, Any]:
        """The position after the batches handed out (and ``batches`` more of this rank's), as a state."""
        epoch, sample, size = self._position()
        if batches:
            epoch, sample, size = self._advance((epoch, sample), batches, world, self.batch_size)
        if size is None and sample:  # next_global_batch counts in the batch size read: the dump's
            size = self._stored_size(epoch)  # (mid-epoch: the epoch is published)
        return {
            "epoch": epoch,
            "next_global_batch": sample // size if size else 0,
            "next_sample": sample,
            "batch_size": size,
        }

    def _sample_of(self, state: dict[str, Any]) -> int:
        """The next sample a state stands for; an older state counts batches of its size (or the dump's)."""
        if "next_sample" in state:
            return int(state["next_sample"])
        epoch, size = int(state["epoch"]), state.get("batch_size")
        n_samples, stored = self._sizes(epoch)
        sample = int(state["next_global_batch"]) * int(size or stored)
        return min(sample, n_samples)  # at the end of an epoch with a short last batch

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
                    self._figures[epoch] = self._sizes(epoch)
                except EpochNotFoundError as e:
                    raise EpochNotFoundError(
                        f"cannot count the batches consumed through epoch {epoch}: {e}; it was deleted before the "
                        "state was saved in it (save it at least once an epoch, or raise the dump's --keep)"
                    ) from None
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
    def sources(self) -> list[str]:
        """A mixed store's sources in code order (``batch["source"]`` indexes it); empty for one source.

        Every epoch of a store has the same sources (they are part of its config), so the stream's first
        epoch tells; with none published yet it waits for it (``timeout``).
        """
        backend = self._backend()
        epochs, first = self._published(backend)
        epoch = epochs[0] if epochs else first
        manifest = backend.wait_manifest(epoch, None if epochs else self.timeout)
        return manifest_sources(manifest, f"{backend.location}/{epoch_name(epoch)}")

    @property
    def categories(self) -> dict[str, list[str]]:
        """The category list of each categorical field that decodes every published epoch of the stream.

        For sizing an embedding table. A store keeps a code's meaning in all its epochs: ``"auto"`` lists
        only grow, at the end, as new values turn up, so the epochs' lists are prefixes of one another and
        the longest (the newest vocabulary among the stream's epochs published now, including those not
        read yet) decodes them all. It is read from the store when asked, the same in every process and
        worker; an epoch dumped later may add values, so ask again at each epoch, or leave room in the
        table. With none of the stream's epochs published yet it waits for the first (``timeout``).

        Raises:
            StoreError: two of the stream's epochs code a field differently (epochs of another config
                written with ``--force``, or written before stores kept their vocabulary).
        """
        backend = self._backend()
        epochs, first = self._published(backend)
        lists: dict[str, list[str]] = {}
        source: dict[str, int] = {}  # the epoch each list comes from
        for epoch in epochs or [first]:
            try:
                manifest = backend.wait_manifest(epoch, None if epochs else self.timeout)
            except EpochNotFoundError:  # pruned since it was listed
                continue
            for name, entry in manifest_fields(manifest, f"{backend.location}/{epoch_name(epoch)}").items():
                values, known = entry.get("categories"), lists.get(name, [])
                if values is not None and values[: len(known)] != known[: len(values)]:
                    raise StoreError(
                        f"epochs {source[name]} and {epoch} of {backend.location} code field {name} with different "
                        "category lists: one model cannot be trained on both"
                    )
                if values is not None and (name not in lists or len(values) > len(known)):
                    lists[name], source[name] = values, epoch
        return lists

    def _backend(self) -> Store:
        """The store read (its split's), refused where it has splits and none is named (:func:`refuse_whole`)."""
        backend = open_store(self.store, self.split)
        if self.split is None:
            refuse_whole(backend)
        return backend

    def _published(self, backend: Store) -> tuple[list[int], int]:
        """The stream's epochs published now, and the one to wait for while there is none.

        An evaluation split's one epoch (0) is every epoch of its stream
        (:func:`~pgprefetch.store.splits.served_epoch`).
        """
        first = served_epoch(backend, self.start_epoch)
        last = None if self.end is None else served_epoch(backend, self.end - 1)
        epochs = [e for e in backend.epochs() if e >= first and (last is None or e <= last)]
        return epochs, first

    def _stored_size(self, epoch: int) -> int:
        return self._sizes(epoch)[1]

    def _sizes(self, epoch: int) -> tuple[int, int]:
        """Epoch ``epoch``'s samples and stored batch size, from its manifest, checked (the store may be anyone's)."""
        backend = self._backend()
        epoch = served_epoch(backend, epoch)
        manifest, where = backend.manifest(epoch), f"{backend.location}/{epoch_name(epoch)}"
        return manifest_int(manifest, "n_samples", where), manifest_int(manifest, "batch_size", where, least=1)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_epoch"], state["_sample"], state["_size"] = self._position()
        state["_live"] = None  # the position travels, not the epoch being read
        return state
