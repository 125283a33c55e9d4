"""Batches on JAX devices ahead of the step, as global arrays when a sharding spans processes.

``jax.device_put`` (and ``jax.make_array_from_process_local_data``) return before the copy is done, so
putting batches ``i+1 .. i+prefetch`` on the devices before the step on batch ``i`` is dispatched overlaps
their copies with the step, with no thread of ours. On the CPU, JAX aliases a suitably aligned NumPy array
instead of copying it: batches that are read-only views of the reading core's private mappings then reach
the step with no copy at all, which is safe because those bytes never change. A *reused* buffer would
change under a batch already handed over, so ``ArrayStream(buffers=n)`` is refused here.

The resume state is the stream's, as of the last batch handed to the consumer: the source runs
``prefetch`` batches ahead, so :meth:`DeviceBatches.state_dict` keeps each batch's position as it was read
and gives the consumed one's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from pgprefetch.errors import ConfigError
from pgprefetch.read.stream import ArrayStream

Sharding = jax.sharding.Sharding


class DeviceBatches(Iterator[dict[str, jax.Array]]):
    """The iterator :func:`device_batches` returns: batches on the devices, and the position consumed."""

    def __init__(
        self,
        batches: Iterable[Mapping[str, np.ndarray]],
        sharding: Sharding | Mapping[str, Sharding] | None,
        prefetch: int,
    ) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ConfigError(f"prefetch must be an integer >= 0, got {prefetch!r}")
        self.sharding = sharding
        self.prefetch = prefetch
        self._source = batches
        self._stateful = callable(getattr(batches, "state_dict", None))
        _check_source(batches, sharding)
        self._state: dict[str, Any] | None = batches.state_dict() if self._stateful else None  # type: ignore[attr-defined]
        self._batches = iter(batches)
        self._pending: deque[tuple[dict[str, jax.Array], dict[str, Any] | None]] = deque()
        self._rows: int | None = None  # with a sharding: the local batch size every batch must have
        self._done = False

    def __next__(self) -> dict[str, jax.Array]:
        if not self._pending:
            self._fill(1)
        if not self._pending:
            raise StopIteration
        batch, self._state = self._pending.popleft()
        self._fill(self.prefetch)  # batches i+1 .. i+prefetch go to the devices before the step on i
        return batch

    def _fill(self, depth: int) -> None:
        while not self._done and len(self._pending) < depth:
            host = next(self._batches, None)
            if host is None:
                self._done = True
                return
            state = self._source.state_dict() if self._stateful else None  # type: ignore[attr-defined]
            self._pending.append((self._put(host), state))

    def _put(self, host: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        if self.sharding is None:
            return jax.device_put(dict(host))
        out = {}
        for name, array in host.items():
            sharding = self.sharding if isinstance(self.sharding, Sharding) else self.sharding[name]
            if self._rows is None:
                self._rows = array.shape[0]
            elif array.shape[0] != self._rows:
                raise ConfigError(
                    f"a batch of {array.shape[0]} samples after batches of {self._rows}: a global array needs every "
                    "process's batches the same size (dump with drop_last = true, or read with a batch_size that "
                    "divides the epoch)"
                )
            out[name] = jax.make_array_from_process_local_data(sharding, array)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The source's resume state after the last batch this iterator handed out (not the ones ahead)."""
        if self._state is None:
            raise ConfigError(f"{type(self._source).__name__} has no state_dict(): nothing to resume from")
        return dict(self._state)


def device_batches(
    batches: Iterable[Mapping[str, np.ndarray]],
    sharding: Sharding | Mapping[str, Sharding] | None = None,
    prefetch: int = 2,
) -> DeviceBatches:
    """``batches`` on JAX devices, ``prefetch`` of them put ahead of the one being consumed.

    Args:
        batches: any iterable of dicts of NumPy arrays: an ``EpochArrays``, an ``ArrayStream``, a Grain loader.
            An ``ArrayStream`` given no ranks reads as rank ``jax.process_index()`` of ``jax.process_count()``.
        sharding: None puts each batch on the default device. A ``jax.sharding.Sharding`` (or one per array
            name) makes each batch a global ``jax.Array`` from every process's batch
            (``jax.make_array_from_process_local_data``): each process passes its own rank's batches.
        prefetch: batches put on the devices ahead of the one the step runs on.
    """
    return DeviceBatches(batches, sharding, prefetch)


def _check_source(batches: Iterable[Any], sharding: object) -> None:
    """Refuse what would silently go wrong: reused buffers, or batches split for another number of processes."""
    if isinstance(batches, ArrayStream):
        if batches.buffers:
            raise ConfigError(
                "device_batches needs the stream's views (buffers=0): JAX keeps a reference to a host array "
                "(on the CPU it uses its memory), so a buffer reused for a later batch would change this one"
            )
        if not batches.ranks_given:
            batches.use_ranks(jax.process_index(), jax.process_count())
    world = batches.ranks()[1] if isinstance(batches, ArrayStream) else getattr(batches, "world_size", None)
    processes = jax.process_count()
    if sharding is not None and world is not None and world != processes:
        raise ConfigError(
            f"the batches are split for {world} ranks but JAX runs {processes} processes: read with "
            "rank=jax.process_index(), world_size=jax.process_count()"
        )
