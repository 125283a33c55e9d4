"""Batches on JAX devices ahead of the step, as global arrays when a sharding spans processes.

``jax.device_put`` (and ``jax.make_array_from_process_local_data``) return before the copy is done, so
putting batches ``i+1 .. i+prefetch`` on the devices before the step on batch ``i`` is dispatched overlaps
their copies with the step, with no thread of ours. On the CPU, JAX aliases a suitably aligned NumPy array
instead of copying it: batches that are read-only views of the reading core's private mappings then reach
the step with no copy at all, which is safe because those bytes never change. A *reused* buffer would
change under a batch already handed over, so ``ArrayStream(buffers=n)`` is refused here.

A global array needs every process's batches the same size, so a short batch is decided at open, from the
manifests (:meth:`~pgprefetch.read.view.EpochView.short_batch`): refused before the first step, naming the
fixes, or padded with ``pad_last=True`` (zeros after the real samples, ``batch["valid"]`` False over them).
Finding out at the epoch's last batch would cost a whole epoch of steps first.

The resume state is the stream's, as of the last batch handed to the consumer: the source runs
``prefetch`` batches ahead, so :meth:`DeviceBatches.state_dict` keeps each batch's position as it was read
and gives the consumed one's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from pgprefetch.errors import ConfigError
from pgprefetch.read.padding import VALID, pad_rows
from pgprefetch.read.stream import ArrayStream
from pgprefetch.read.view import EpochView

Sharding = jax.sharding.Sharding


class DeviceBatches(Iterator[dict[str, jax.Array]]):
    """The iterator :func:`device_batches` returns: batches on the devices, and the position consumed."""

    def __init__(
        self,
        batches: Iterable[Mapping[str, np.ndarray]],
        sharding: Sharding | Mapping[str, Sharding] | None,
        prefetch: int,
        pad_last: bool = False,
    ) -> None:
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ConfigError(f"prefetch must be an integer >= 0, got {prefetch!r}")
        if not isinstance(pad_last, bool):
            raise ConfigError(f"pad_last must be True or False, got {pad_last!r}")
        self.sharding = sharding
        self.prefetch = prefetch
        self.pad_last = pad_last
        self._source = batches
        state_dict = getattr(batches, "state_dict", None)  # an ArrayStream's, or any resumable source's
        self._state_dict: Callable[[], dict[str, Any]] | None = state_dict if callable(state_dict) else None
        _check_source(batches, sharding)
        # pad_last: the rows every batch is padded to (the source's batch size; else the first batch's)
        self._pad_to = _check_batch_sizes(batches, sharding, pad_last)
        self._state = self._state_dict() if self._state_dict is not None else None
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
            state = self._state_dict() if self._state_dict is not None else None
            self._pending.append((self._put(host), state))

    def _put(self, host: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        if self.pad_last:
            if self._pad_to is None:
                self._pad_to = next(iter(host.values())).shape[0] if host else 0
            try:
                host = pad_rows(host, self._pad_to)
            except ValueError as e:
                raise ConfigError(f"pad_last: {e}") from None
        if self.sharding is None:
            placed: dict[str, jax.Array] = jax.device_put(dict(host))  # typed Any: it takes and gives pytrees
            return placed
        out = {}
        for name, array in host.items():
            sharding = self.sharding if isinstance(self.sharding, Sharding) else self.sharding[name]
            if self._rows is None:
                self._rows = array.shape[0]
            elif array.shape[0] != self._rows:
                raise ConfigError(
                    f"a batch of {array.shape[0]} samples after batches of {self._rows}: a global array needs every "
                    "process's batches the same size (dump with drop_last = true, read with a batch_size that "
                    "divides the epoch, or pass pad_last=True)"
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
    *,
    pad_last: bool = False,
) -> DeviceBatches:
    """``batches`` on JAX devices, ``prefetch`` of them put ahead of the one being consumed.

    Args:
        batches: any iterable of dicts of NumPy arrays: an ``EpochArrays``, an ``ArrayStream``, a Grain loader.
            An ``ArrayStream`` given no ranks reads as rank ``jax.process_index()`` of ``jax.process_count()``.
        sharding: None puts each batch on the default device. A ``jax.sharding.Sharding`` (or one per array
            name) makes each batch a global ``jax.Array`` from every process's batch
            (``jax.make_array_from_process_local_data``): each process passes its own rank's batches.
        prefetch: batches put on the devices ahead of the one the step runs on.
        pad_last: pad a short batch (the last of an epoch dumped with ``drop_last = false``) with zeros to the
            batch size, and give every batch ``"valid"``, bool ``(batch,)``, False over the padded rows (mask
            the loss with it). Without it, a sharding over batches that end an epoch short is refused at
            once, before the first batch is read.
    """
    return DeviceBatches(batches, sharding, prefetch, pad_last)


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


def _check_batch_sizes(batches: Iterable[Any], sharding: object, pad_last: bool) -> int | None:
    """Refuse, before the first batch, a short batch a global array cannot take; the rows pad_last pads to.

    An ``EpochArrays`` knows from its manifest whether some rank's last batch is short, an ``ArrayStream``
    whether its epochs can end in one; for other iterables (a Grain loader) the size check stays per batch.
    """
    if isinstance(batches, EpochView):
        short = batches.short_batch()
        if short is not None and len(batches) * batches.world_size == 1:
            short = None  # one batch in all: nothing to be the same size as
        reason = None if short is None else f"epoch {batches.epoch} ends in a batch of {short} samples"
        reason = reason and f"{reason} after batches of {batches.batch_size}"
        size: int | None = batches.batch_size
    elif isinstance(batches, ArrayStream):
        reason = batches.short_batches(*batches.ranks())
        size = batches.read_batch_size()
    else:
        return None
    if pad_last:
        if VALID in getattr(batches, "arrays", ()):  # a stream's batches are checked as they come (pad_rows)
            raise ConfigError(f"pad_last adds an array named {VALID!r}, and the epoch has a field of that name")
        return size
    if sharding is not None and reason is not None:
        raise ConfigError(
            f"{reason}: a global array needs every process's batches the same size; pass pad_last=True (padded "
            f"rows marked False in batch[{VALID!r}]), dump with drop_last = true, or read with a batch_size that "
            "divides the epoch"
        )
    return size
