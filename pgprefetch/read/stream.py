"""``ArrayStream``: consecutive epochs of a store as one iterable of NumPy batches, for JAX and plain loops.

The NumPy counterpart of :class:`pgprefetch.EpochStream`, with its semantics (consecutive epochs, waiting
for each, the consumer recorded, ``set_epoch``, the same state) and none of torch's machinery: there are no
DataLoader workers to share batches with. :func:`pgprefetch.jax.device_batches` puts its batches on devices.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from pgprefetch.errors import ConfigError
from pgprefetch.read.epoch import EpochArrays
from pgprefetch.read.sequence import EpochSequence
from pgprefetch.read.view import Batch, check_ranks


class ArrayStream(EpochSequence[np.ndarray]):
    """Consecutive published epochs of a store, batch by batch, for one rank, as read-only NumPy arrays.

    Takes :class:`~pgprefetch.read.sequence.EpochSequence`'s arguments. ``rank`` and ``world_size`` default
    to 0 and 1 when the stream is iterated, unless :meth:`use_ranks` gave others first
    (:func:`pgprefetch.jax.device_batches` gives JAX's process index and count).
    """

    reader = EpochArrays

    def __iter__(self) -> Iterator[Batch[np.ndarray]]:
        """This rank's batches from the position on, across epochs; a finished stream starts over."""
        if self._finished:
            self._move(self.start_epoch, 0, self.batch_size)
        return self._batches(*self.ranks())

    def ranks(self) -> tuple[int, int]:
        """(rank, world size) the stream is read with: as given, else 0 and 1."""
        return check_ranks(0 if self._rank is None else self._rank, 1 if self._world is None else self._world)

    @property
    def ranks_given(self) -> bool:
        """Whether rank and world size were given (to the constructor or :meth:`use_ranks`)."""
        return self._rank is not None and self._world is not None

    def use_ranks(self, rank: int, world_size: int) -> None:
        """Read as rank ``rank`` of ``world_size`` from now on (the position, in samples, stays)."""
        self._rank, self._world = check_ranks(rank, world_size)
        if self._live is not None:  # the epoch being read is re-sliced from the position on
            self._move(*self._position())

    def state_dict(self, batches: int | None = None) -> dict[str, Any]:
        """The resume state: the position (epoch, next sample) after the batches handed out.

        The same as :meth:`pgprefetch.EpochStream.state_dict`'s: either stream loads the other's.

        Args:
            batches: batches of this rank consumed beyond those the stream handed out (a loader ahead of
                the consumer, say); the position moves that many batches on, across epochs.
        """
        return self._state(batches, self.ranks()[1])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (this stream's, or an ``EpochStream``'s), for any world size or batch size."""
        if "num_workers" in state:
            raise ConfigError(
                "this is one DataLoader worker's state: load the loader's whole state_dict() into an EpochStream"
            )
        self._move(int(state["epoch"]), self._sample_of(state), self.batch_size)
