"""How many samples of each source go into each batch: exact in every prefix of the epoch.

With normalised weights w_i, batch size B and C_i(h) the samples of source i among the epoch's first h
samples, the quota method of Balinski and Young (1975) keeps ``floor(w_i h) <= C_i(h) <= ceil(w_i h)`` for
*every* h, hence |C_i(b B) - w_i b B| < 1 after every batch b, while C_i never decreases. (Largest
remainders recomputed at each prefix can take a sample back, the "Alabama paradox"; largest remainders of
each batch with a carried error can be forced outside the quota when several small sources are ahead.)
Seat h goes to the source with the largest w_i / (C_i + 1) among those still below their upper quota
w_i h. The weights are taken exactly, as fractions of the numbers in the config (0.7 is 7/10), so the
sequence repeats every W seats, W the weights' common denominator: it is computed for one period at most.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache

import numpy as np

Weight = int | float


def exact(weights: Sequence[Weight]) -> tuple[tuple[int, ...], int]:
    """The normalised weights as integers over one denominator: ``(p, W)`` with w_i = p_i / W.

    A float is taken as the decimal it prints as (``0.7`` is 7/10, not the nearest binary fraction).
    """
    fractions = [Fraction(repr(float(w))) if isinstance(w, float) else Fraction(w) for w in weights]
    total = sum(fractions, Fraction(0))
    if total <= 0:
        raise ValueError("the weights must not all be 0")
    shares = [f / total for f in fractions]
    denominator = math.lcm(*(s.denominator for s in shares))
    return tuple(int(s * denominator) for s in shares), denominator


def shares(weights: Sequence[Weight]) -> list[Fraction]:
    """The normalised weights, exactly."""
    p, denominator = exact(weights)
    return [Fraction(x, denominator) for x in p]


@lru_cache(maxsize=64)
def _seats(p: tuple[int, ...], denominator: int, n: int) -> np.ndarray:
    """The first ``n`` seats' sources (int8), by the quota method; ``n`` at most one period."""
    counts = [0] * len(p)
    out = np.empty(n, dtype=np.int8)
    for h in range(1, n + 1):
        best = -1
        for i, share in enumerate(p):
            # eligible: below the upper quota at h (C_i < w_i h); best: the largest w_i / (C_i + 1)
            if counts[i] * denominator < share * h and (
                best < 0 or (counts[i] + 1) * p[best] < (counts[best] + 1) * share
            ):
                best = i
        counts[best] += 1
        out[h - 1] = best
    return out


class Apportionment:
    """The quota method's counts for one set of weights: C_i(h) for any h, in O(1) after one period."""

    def __init__(self, weights: Sequence[Weight]) -> None:
        self.p, self.denominator = exact(weights)
        self._period: np.ndarray | None = None  # cumulative counts over one period, (n + 1, sources)

    def _cumulative(self, upto: int) -> np.ndarray:
        n = min(upto, self.denominator)
        if self._period is None or self._period.shape[0] - 1 < n:
            seats = _seats(self.p, self.denominator, n)
            one_hot = np.zeros((n + 1, len(self.p)), dtype=np.int64)
            one_hot[np.arange(1, n + 1), seats] = 1
            self._period = np.cumsum(one_hot, axis=0)
        return self._period

    def counts(self, h: np.ndarray | int) -> np.ndarray:
        """C_i(h): each source's samples among the first ``h`` (``h`` an array: one row per value)."""
        hs = np.atleast_1d(np.asarray(h, dtype=np.int64))
        table = self._cumulative(int(hs.max(initial=0)))
        whole, rest = np.divmod(hs, self.denominator)
        out: np.ndarray = whole[:, None] * np.asarray(self.p, dtype=np.int64)[None, :] + table[rest]
        return out if np.ndim(h) else out[0]

    def per_batch(self, n_samples: int, size: int) -> np.ndarray:
        """Each batch's samples of each source, ``(n_batches, sources)``; the last batch may be short."""
        bounds = np.minimum(np.arange(0, n_samples + size, size, dtype=np.int64), n_samples)
        bounds = bounds[: -(-n_samples // size) + 1]
        return np.diff(self.counts(bounds), axis=0)


def first_pass_batches(a: Apportionment, sizes: Sequence[int], size: int) -> int:
    """The default epoch length in batches: one pass of the source with the fewest samples per weight.

    The fewest batches in which the source with the fewest samples per unit of weight takes ``sizes[i]``
    samples (one pass; Hugging Face's "first exhausted").

    Sources of weight 0 are left out. At batch ``ceil(m W / (p B))`` its count is at least m (the count
    stays within 1 of its target); it may get there a batch or more sooner, which the counts tell.
    """
    candidates = [i for i, share in enumerate(a.p) if share > 0]
    slowest = min(candidates, key=lambda i: (Fraction(sizes[i] * a.denominator, a.p[i]), i))
    m = sizes[slowest]
    last = -(-m * a.denominator // (a.p[slowest] * size))  # ceil
    counts = a.counts(np.arange(1, last + 1, dtype=np.int64) * size)[:, slowest]
    return int(np.argmax(counts >= m)) + 1
