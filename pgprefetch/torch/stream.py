"""``EpochStream``: consecutive epochs of a store as one torch ``IterableDataset``, for training loops.

The order, the position, waiting for epochs and the state are the reading core's
(:class:`~pgprefetch.read.sequence.EpochSequence`, shared with the NumPy :class:`pgprefetch.ArrayStream`);
what this layer adds is torch's: epochs read by :class:`~pgprefetch.EpochDataset`, ranks from
``torch.distributed``, and the frameworks' ideas about workers, sharding and resuming:

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

import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch
import torch.utils.data

from pgprefetch.errors import ConfigError
from pgprefetch.read.sequence import EpochSequence
from pgprefetch.torch.dataset import EpochDataset, rank_and_world

_RESHARDERS = ("IterableDatasetShard", "DataLoaderDispatcher")  # accelerate's wrappers that split a dataset


class EpochStream(EpochSequence[torch.Tensor], torch.utils.data.IterableDataset[dict[str, torch.Tensor]]):
    """Consecutive published epochs of a store, batch by batch, for one rank, as torch tensors.

    Takes :class:`~pgprefetch.read.sequence.EpochSequence`'s arguments (store, start_epoch, epochs,
    batch_size, fields, rank, world_size, keys, trim, buffers, consumer, timeout); ``rank`` and
    ``world_size`` default to ``torch.distributed``'s when the stream is iterated. DataLoader workers always
    hand out file ranges (``buffers`` applies in the main process).
    """

    reader = EpochDataset
    # A worker's first position (set on its first pass). A class default, not an __init__ of this class's own:
    # EpochSequence's __init__ is then the signature `help(EpochStream)` and `inspect.signature` show.
    _worker_start: tuple[int, int, int | None, int | None] | None = None

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
        yield from self._batches(rank, world, k, w, worker=info is not None)

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
        super().set_epoch(epoch)

    # --- state ------------------------------------------------------------------------------------------
    def state_dict(self, batches: int | None = None) -> dict[str, Any]:
        """The resume state: the position (epoch, next sample) after the batches handed out.

        Args:
            batches: with a plain ``DataLoader`` whose workers iterate, the batches consumed since this
                stream's position (its state when the loader started): the main process's stream cannot count
                them itself. The position moves that many batches on, across epochs.
        """
        _, world = rank_and_world(self._rank, self._world)
        state = self._state(batches, world)
        info = torch.utils.data.get_worker_info()
        if info is not None:  # one worker's share: fits only the same split
            offset = self._offset if self._offset is not None else info.id
            state.update(num_workers=info.num_workers, worker=info.id, worker_offset=offset, world_size=world)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: this stream's or an ``ArrayStream``'s, or a ``StatefulDataLoader``'s whole state.

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
        sample = self._sample_of(state)
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

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
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
        frame: FrameType | None = sys._getframe(2)
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
    processes: Any = getattr(wrapper, "num_processes", None)
    return int(processes or getattr(getattr(wrapper, "state", None), "num_processes", 1))


def _resharding_error(wrapper: Any) -> ConfigError:
    return ConfigError(
        f"EpochStream is already split by rank, and Accelerate's {type(wrapper).__name__} would split it "
        f"again across {_processes(wrapper)} processes and drop data: do not pass its DataLoader to "
        "accelerator.prepare() (move batches with .to(accelerator.device))"
    )
