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

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_ORDER_STREAM = 0x6F72646572  # "order"
_SAMPLE_STREAM = 0x73616D706C65  # "sample"


def _mix(x: np.ndarray) -> np.ndarray:
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
        state = _mix(state + _GOLDEN) ^ np.uint64(part & 0xFFFFFFFFFFFFFFFF)
    return _mix(state)[0]


def key_hash(keys: np.ndarray, *, seed: int, epoch: int, stream: int = _ORDER_STREAM) -> np.ndarray:
    """A 64-bit hash per key (column of ``keys``), independent for each (seed, epoch, stream)."""
    with np.errstate(over="ignore"):
        h = np.full(keys.shape[1], _salt(seed, epoch, stream), dtype=np.uint64)
        for column in keys:
            h ^= column.view(np.uint64)
            h += _GOLDEN
            _mix(h)
    return h


def epoch_order(keys: np.ndarray, *, seed: int, epoch: int) -> np.ndarray:
    """Indices that put ``keys`` in the epoch's order: by hash, equal hashes broken by the key values."""
    h = key_hash(keys, seed=seed, epoch=epoch)
    order = np.argsort(h, kind="stable")
    for start, end in _tied_runs(h, order):  # astronomically rare for distinct keys, but the order
        group = order[start:end]  # must never depend on the order the rows arrived in
        order[start:end] = group[np.lexsort(keys[::-1, group])]
    return order


def _tied_runs(h: np.ndarray, order: np.ndarray, chunk: int = 1 << 20) -> list[tuple[int, int]]:
    """The ``[start, end)`` runs of equal hashes in sorted order, looked for a chunk at a time (no full copy)."""
    runs: list[tuple[int, int]] = []
    for lo in range(0, max(h.size - 1, 0), chunk):
        sorted_h = h[order[lo : lo + chunk + 1]]
        for i in np.flatnonzero(sorted_h[1:] == sorted_h[:-1]) + lo:
            if runs and runs[-1][1] >= i + 1:
                runs[-1] = (runs[-1][0], int(i) + 2)
            else:
                runs.append((int(i), int(i) + 2))
    return runs


def subsample(keys: np.ndarray, *, seed: int, epoch: int, fraction: float) -> np.ndarray:
    """The keys kept by the epoch's deterministic ``fraction`` subset (all of them when it is 1)."""
    if fraction >= 1.0:
        return keys
    h = key_hash(keys, seed=seed, epoch=epoch, stream=_SAMPLE_STREAM)
    threshold = np.uint64(min(int(fraction * 2.0**64), 2**64 - 1))
    return np.ascontiguousarray(keys[:, h < threshold])  # column-major layout kept: each key column contiguous


def shuffle_keys(keys: np.ndarray, *, seed: int, epoch: int, fraction: float = 1.0) -> np.ndarray:
    """Subsample and order the epoch's keys, shape ``(n_key_columns, n)`` int64.

    Reorders ``keys`` in place (one key column at a time) and returns it, or the subsample: the extra
    memory is two int64 per key (hash and order), never a second copy of the keys.
    """
    keys = subsample(keys, seed=seed, epoch=epoch, fraction=fraction)
    order = epoch_order(keys, seed=seed, epoch=epoch)
    for column in keys:
        column[:] = column[order]
    return keys


def n_batches(n_samples: int, size: int, drop_last: bool) -> int:
    """Batches in an epoch of ``n_samples``: a short last batch is dropped or padded."""
    return n_samples // size if drop_last else -(-n_samples // size)
