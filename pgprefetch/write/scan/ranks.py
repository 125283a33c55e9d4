"""Where samples are among the samples a data pass cut: by rank of their keys, in lexicographic order.

The keys pass orders the windows' keys (:mod:`.keyspill`); each data pass then finds the windows the epoch
uses among those it cut (:func:`locate`) to spool their start rows (:mod:`.multipass`).
"""

from __future__ import annotations

import numpy as np

from pgprefetch.errors import SourceError


def ranks(sorted_keys: np.ndarray, keys: np.ndarray, *, equal: bool = True) -> np.ndarray:
    """For each key (a column of ``keys``), how many columns of the sorted ``sorted_keys`` are <= it (lexicographic).

    ``equal`` False: how many are < it.
    """
    n = sorted_keys.shape[1]
    packed = (sorted_keys[0], keys[0]) if sorted_keys.shape[0] == 1 else _packed(sorted_keys, keys)
    if packed is not None:  # one column, or several packed into one: a binary search
        found: np.ndarray = np.searchsorted(packed[0], packed[1], side="right" if equal else "left")
        return found.astype(np.int64)
    if not n:
        return np.zeros(keys.shape[1], np.int64)
    both = np.concatenate([sorted_keys, keys], axis=1)
    tags = [0, 1] if equal else [1, 0]  # of equal ones, which come first
    tag = np.repeat(np.array(tags, np.int8), [n, keys.shape[1]])
    order = np.lexsort((tag, *both[::-1]))
    before = np.cumsum(order < n)
    mine = order >= n
    out = np.empty(keys.shape[1], np.int64)
    out[order[mine] - n] = before[mine]
    return out


def _packed(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Both sets of keys as one uint64 a key, in the same lexicographic order, when their ranges fit 64 bits.

    A window's key (a series and its first order value) mostly does: a binary search then finds its rank,
    where a sort of both sets together took most of a data pass.
    """
    if not sorted_keys.shape[1] or not keys.shape[1]:
        return None
    lows: list[np.uint64] = []
    bits: list[int] = []
    for i in range(sorted_keys.shape[0]):
        lo = min(int(sorted_keys[i].min()), int(keys[i].min()))
        hi = max(int(sorted_keys[i].max()), int(keys[i].max()))
        lows.append(np.uint64(lo % (1 << 64)))  # the offsets are taken modulo 2**64: exact within the range
        bits.append((hi - lo).bit_length())
    if sum(bits) > 64:
        return None
    out = []
    for array in (sorted_keys, keys):
        packed = np.zeros(array.shape[1], np.uint64)
        for i, (low, b) in enumerate(zip(lows, bits, strict=True)):
            packed <<= np.uint64(b)
            packed |= array[i].view(np.uint64) - low
        out.append(packed)
    return out[0], out[1]


def locate(pass_keys: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Where each ``wanted`` key is among a data pass's cut samples ``pass_keys`` (in key order).

    The pass must hold every wanted key: the same rows cut the same samples. A key cut twice (a repeated key,
    dropped) is found at its first row as it came.
    """
    at = ranks(pass_keys, wanted, equal=False)
    if (at >= pass_keys.shape[1]).any() or not np.array_equal(
        pass_keys[:, np.minimum(at, pass_keys.shape[1] - 1)], wanted
    ):
        raise SourceError("a data pass cut other samples than the keys pass (the table changed under the snapshot?)")
    return at
