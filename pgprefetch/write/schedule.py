"""Units: runs of consecutive batches that the dump fetches, produces and writes together.

Each step of a dump has a fixed cost per call: a round trip and a statement, a hand-off to the writer's
thread, a ``pwrite`` per array and a journal line. At 1,000 samples a batch it does not matter; at 10 it
was nine tenths of the dump (batches of 10 dumped at 0.07x the rate of batches of 1,000). So small
batches travel together: the keys of a unit go in one statement, decode into one buffer, and are written
with one ``pwrite`` per shard file. The bytes are the same whatever the unit size: each batch is still its
own chunk with its own checksum.

:func:`write_batches` is the dump's scheduler: ``concurrency`` units in flight, each fetched on the event
loop, then produced and written on the dump's own threads.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from pgprefetch.store.base import KEYS_ARRAY
from pgprefetch.write import memory
from pgprefetch.write.batches import UNIT_SECONDS, Advances, BatchSource
from pgprefetch.write.files.writer import EpochWriter
from pgprefetch.write.tasks import first_error


class Units:
    """Hands out the pending batches as units, runs of consecutive batches, sized by how long a fetch takes.

    Units start at one batch and double while a fetch takes under half the source's ``unit_seconds`` (50 ms:
    a statement's round trip), up to ``most`` batches (:func:`unit_batches`); they halve when one takes over
    twice that. A source whose fetch also runs transforms aims higher: its units carry a second of work to
    worker processes, or the hand-offs would cost what the workers save. Small,
    fast batches so travel about a thousand samples at a time, while a slow per-sample query keeps units of
    one batch: a statement stays short, and a killed dump loses little work. Only speed depends on the
    unit size, never the bytes written.
    """

    def __init__(self, batches: list[int], most: int, seconds: float = UNIT_SECONDS) -> None:
        self._batches = batches  # ascending; with gaps where a resumed epoch already has batches
        self._at = 0
        self.most = most
        self.count = 1
        self.seconds = seconds

    def next(self) -> tuple[int, int] | None:
        """The next unit, ``(first batch, count)``, or None when every batch was handed out."""
        if self._at >= len(self._batches):
            return None
        first, count, at = self._batches[self._at], 1, self._at
        while count < self.count and at + count < len(self._batches) and self._batches[at + count] == first + count:
            count += 1
        self._at += count
        return first, count

    def took(self, count: int, seconds: float) -> None:
        """Note that fetching a unit of ``count`` batches took ``seconds``."""
        if seconds < self.seconds / 2 and count == self.count:
            self.count = min(self.most, self.count * 2)
        elif seconds > self.seconds * 2:
            self.count = max(1, min(self.count, count) // 2)


async def write_batches(
    source: BatchSource, writer: EpochWriter, batches: list[int], size: int, progress: Advances | None
) -> int:
    """Fetch, produce and write ``batches`` a unit at a time, ``source.concurrency`` units in flight."""
    total = 0
    keys = source.plan.keys
    samples = [KEYS_ARRAY, *(name for name, _, _ in source.arrays)]
    todo = Units(batches, source.unit, source.unit_seconds)  # shared by the workers: each takes the next unit
    # The dump's own threads (one in query mode: on a few cores more only fight over the GIL while the
    # event loop decodes; see BatchSource.threads); an executor of its own cannot outlive the dump.
    with ThreadPoolExecutor(max_workers=source.threads, thread_name_prefix="pgprefetch-write") as pool:
        loop = asyncio.get_running_loop()

        def produce_and_write(first: int, count: int, fetched: object, buffers: dict[str, np.ndarray]) -> int:
            unit_keys = source.plan.batch_keys(first, size, count)
            n = unit_keys.shape[1]
            source.produce(first, count, fetched, buffers)
            buffers[KEYS_ARRAY][:n] = unit_keys.T
            if n < count * size:  # the padded last batch (drop_last = false): zeros after the real samples
                for name in samples:  # (the rows of windows stored as starts are produce's own)
                    buffers[name][n : count * size] = 0
            return writer.write_batches(first, count, buffers)

        async def worker() -> None:
            nonlocal total
            reservation = memory.current().reserve("writer")  # a unit's buffers, each worker's own
            reservation.grow(
                source.buffer_bytes(size * source.unit, source.unit) + size * source.unit * 8 * keys.shape[0]
            )
            buffers = source.allocate(size * source.unit, source.unit)
            buffers[KEYS_ARRAY] = np.zeros((size * source.unit, keys.shape[0]), dtype=np.int64)
            with reservation:
                await work(buffers)

        async def work(buffers: dict[str, np.ndarray]) -> None:
            nonlocal total
            while unit := todo.next():
                first, count = unit
                started = time.monotonic()
                fetched = await source.fetch(first, count)
                todo.took(count, time.monotonic() - started)
                nbytes = await loop.run_in_executor(pool, produce_and_write, first, count, fetched, buffers)
                total += nbytes
                if progress:
                    progress.advance(min(count * size, keys.shape[1] - first * size), nbytes)

        await first_error([worker() for _ in range(source.concurrency)])
    return total
