"""The epoch's sample order: a pure function of (seed, epoch, the set of keys).

PostgreSQL returns rows in whatever order is cheapest (heap order, a synchronized scan starting mid-table,
a parallel plan), and ``TABLESAMPLE SYSTEM`` keeps heap order, so the order is decided here, on the
client, from the key values alone: every key gets a 64-bit hash of (seed, epoch, key) and samples are
sorted by it. Nothing depends on the order rows arrived in, on the server version or on the plan, and
batch ``i`` of an epoch is the ``i``-th slice of that order, computable by any machine holding the keys.

``fraction < 1`` keeps a key when a second, independent hash falls below ``fraction * 2**64``: a uniform,
row-level subset, different every epoch and the same on every rerun.

Keys are held column-major, shape ``(n_key_columns, n)``, int64: 8 bytes per key column, no Python object.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_ORDER_STREAM = 0x6F72646572  # "order"
_SAMPLE_STREAM = 0x73616D706C65  # "sample"


def finalise(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, in place: a bijection on uint64 with full avalanche."""
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


def _salt(seed: int, epoch: int, stream: int) -> np.uint64:
    state = np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64)
    for part in (epoch, stream):
        state = finalise(state + _GOLDEN) ^ np.uint64(part & 0xFFFFFFFFFFFFFFFF)
    return np.uint64(finalise(state)[0])


def key_hash(keys: np.ndarray, *, seed: int, epoch: int, stream: int = _ORDER_STREAM) -> np.ndarray:
    """A 64-bit hash per key (column of ``keys``), independent for each (seed, epoch, stream)."""
    with np.errstate(over="ignore"):
        h = np.full(keys.shape[1], _salt(seed, epoch, stream), dtype=np.uint64)
        for column in keys:
            h ^= column.view(np.uint64)
            h += _GOLDEN
            finalise(h)
    return h


def epoch_order(keys: np.ndarray, *, seed: int, epoch: int, h: np.ndarray | None = None) -> np.ndarray:
    """Indices that put ``keys`` in the epoch's order: by hash, equal hashes broken by the key values.

    ``h``: the hashes to order by, when the caller has them (or hashes only some of the key's slots).
    """
    return _sorted(keys, seed, epoch, h=h)[0]


def _sorted(
    keys: np.ndarray, seed: int, epoch: int, index_bits: int | None = None, h: np.ndarray | None = None
) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """The epoch's order of ``keys`` and its runs of tied hashes.

    Sorting values is about twice as fast as ``argsort`` (numpy's SIMD sorts), so each key's index rides
    in the low bits of its hash: ``(hash >> b << b) | index``, with ``b`` bits for ``n`` indices. Keys
    whose hashes agree above those bits come out by index; each such run is then put in order by the whole
    hash and the key values, so the order is exactly "by hash, ties by key" at any ``n`` (``index_bits``
    larger than needed makes such runs common: the tests use it). ``h``: the keys' order hashes, when the
    caller has them already (a bucket of keys sorted on disk brings its own).
    """
    if h is None:
        h = key_hash(keys, seed=seed, epoch=epoch)
    bits = np.uint64(max(1, (h.size - 1).bit_length(), index_bits or 0))  # <= 40 below 2**40 keys (8 TiB)
    packed = h >> bits
    packed <<= bits
    for lo in range(0, h.size, 1 << 20):  # in place, a piece at a time: no third array of n
        packed[lo : lo + (1 << 20)] |= np.arange(lo, min(h.size, lo + (1 << 20)), dtype=np.uint64)
    packed.sort()
    runs = _tied_runs(packed, bits)
    packed &= (np.uint64(1) << bits) - np.uint64(1)
    order = packed.view(np.int64)
    for start, end in runs:  # rare for distinct keys (repeated keys always tie), but the order must never
        group = order[start:end]  # depend on the order the rows arrived in
        order[start:end] = group[np.lexsort((*keys[::-1, group], h[group]))]
    return order, runs


def _tied_runs(packed: np.ndarray, bits: np.uint64, chunk: int = 1 << 20) -> list[tuple[int, int]]:
    """The ``[start, end)`` runs of equal hash prefixes in the sorted ``packed``, a chunk at a time."""
    runs: list[tuple[int, int]] = []
    for lo in range(0, max(packed.size - 1, 0), chunk):
        prefix = packed[lo : lo + chunk + 1] >> bits
        for i in np.flatnonzero(prefix[1:] == prefix[:-1]) + lo:
            if runs and runs[-1][1] >= i + 1:
                runs[-1] = (runs[-1][0], int(i) + 2)
            else:
                runs.append((int(i), int(i) + 2))
    return runs


def _repeats(keys: np.ndarray, order: np.ndarray, runs: list[tuple[int, int]]) -> np.ndarray:
    """Positions in ``order`` whose key equals the one before it (equal keys hash alike, so only ties count)."""
    found = []
    for start, end in runs:
        group = keys[:, order[start:end]]
        same = np.all(group[:, 1:] == group[:, :-1], axis=0)
        found.append(np.flatnonzero(same) + start + 1)
    return np.concatenate(found) if found else np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class Repeats:
    """Repeated keys found while ordering: how many, and the first few (``(n_key_columns, <= 5)``, in key order)."""

    count: int
    examples: np.ndarray

    @classmethod
    def merged(cls, parts: list[Repeats], width: int) -> Repeats:
        """The repeats of several disjoint parts of the keys (the buckets of an external sort) as of one whole."""
        found = [p.examples for p in parts if p.count]
        examples = np.concatenate(found, axis=1) if found else np.empty((width, 0), dtype=np.int64)
        return cls(sum(p.count for p in parts), _first_in_key_order(examples))


def order_part(
    keys: np.ndarray,
    *,
    seed: int,
    epoch: int,
    fraction: float = 1.0,
    h: np.ndarray | None = None,
    keep: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, Repeats]:
    """Indices putting ``keys`` in the epoch's order, repeated keys and the keys ``fraction`` leaves out removed.

    ``keys`` may be all of an epoch's keys, or a *part* holding every key whose order hash lies in one range
    (``h``: their hashes): equal keys hash alike and ties are broken inside a part, so the parts' orders,
    one after another, are the whole's. ``keep``: which keys are the epoch's at all (a split's,
    :mod:`.splits`), a function of each key alone. Returns the order and the :class:`Repeats` found (the
    caller refuses them or not).
    """
    order, runs = _sorted(keys, seed, epoch, h=h)
    repeats = _repeats(keys, order, runs)
    found = Repeats(int(repeats.size), _first_in_key_order(keys[:, order[repeats]]))
    if repeats.size:
        order = np.delete(order, repeats)
    if keep is not None:
        order = order[keep(keys)[order]]
    if fraction < 1.0:
        kept = key_hash(keys, seed=seed, epoch=epoch, stream=_SAMPLE_STREAM)
        order = order[kept[order] < np.uint64(min(int(fraction * 2.0**64), 2**64 - 1))]
    return order, found


def _first_in_key_order(examples: np.ndarray, most: int = 5) -> np.ndarray:
    """The first ``most`` of the keys ``examples`` (``(n_key_columns, m)``) in key order."""
    return examples[:, np.lexsort(examples[::-1])[:most]]


def n_batches(n_samples: int, size: int, drop_last: bool) -> int:
    """Batches in an epoch of ``n_samples``: a short last batch is dropped or padded."""
    return n_samples // size if drop_last else -(-n_samples // size)
