"""Units: runs of consecutive batches that the dump fetches, produces and writes together.

Each step of a dump has a fixed cost per call: a round trip and a statement, a hand-off to the writer's
thread, a ``pwrite`` per array and a journal line. At 1,000 samples a batch it does not matter; at 10 it
was nine tenths of the dump (batches of 10 dumped at 0.07x the rate of batches of 1,000). So small
batches travel together: the keys of a unit go in one statement, decode into one buffer, and are written
with one ``pwrite`` per shard file. The bytes are the same whatever the unit size: each batch is still its
own chunk with its own checksum.
"""

from __future__ import annotations

UNIT_SAMPLES = 1024  # the most samples a unit of small batches holds
UNIT_SECONDS = 0.05  # the fetch time units aim at


def unit_batches(size: int) -> int:
    """The most consecutive batches of ``size`` samples in one unit: about ``UNIT_SAMPLES`` samples."""
    return max(1, UNIT_SAMPLES // size)


class Units:
    """Hands out the pending batches as units, runs of consecutive batches, sized by how long a fetch takes.

    Units start at one batch and double while a fetch takes under ``UNIT_SECONDS / 2``, up to ``most``
    batches (:func:`unit_batches`); they halve when one takes over twice that. Small,
    fast batches so travel about a thousand samples at a time, while a slow per-sample query keeps units of
    one batch: a statement stays short, and a killed dump loses little work. Only speed depends on the
    unit size, never the bytes written.
    """

    def __init__(self, batches: list[int], most: int) -> None:
        self._batches = batches  # ascending; with gaps where a resumed epoch already has batches
        self._at = 0
        self.most = most
        self.count = 1

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
        if seconds < UNIT_SECONDS / 2 and count == self.count:
            self.count = min(self.most, self.count * 2)
        elif seconds > UNIT_SECONDS * 2:
            self.count = max(1, min(self.count, count) // 2)
