"""The epoch order is a pure function of (seed, epoch, the set of keys)."""

from __future__ import annotations

import numpy as np
import pytest

from pgprefetch.write.order import shuffle
from pgprefetch.write.order.shuffle import _tied_runs, epoch_order, n_batches, shuffle_keys, subsample


def keys_of(n: int, columns: int = 2) -> np.ndarray:
    rng = np.random.default_rng(1)
    return np.ascontiguousarray(rng.integers(-(2**40), 2**40, size=(columns, n)))


def test_order_is_a_permutation() -> None:
    order = epoch_order(keys_of(10_000), seed=0, epoch=0)
    assert sorted(order.tolist()) == list(range(10_000))


def test_same_seed_and_epoch_give_the_same_order() -> None:
    k = keys_of(5_000)
    assert np.array_equal(shuffle_keys(k.copy(), seed=7, epoch=3), shuffle_keys(k.copy(), seed=7, epoch=3))


def test_another_epoch_or_seed_gives_another_order() -> None:
    k = keys_of(5_000)
    base = shuffle_keys(k.copy(), seed=7, epoch=3)
    assert (shuffle_keys(k.copy(), seed=7, epoch=4) != base).any(axis=0).mean() > 0.99
    assert (shuffle_keys(k.copy(), seed=8, epoch=3) != base).any(axis=0).mean() > 0.99


def test_order_does_not_depend_on_the_order_keys_arrive_in() -> None:
    k = keys_of(5_000)
    reversed_keys = np.ascontiguousarray(k[:, ::-1])
    assert np.array_equal(shuffle_keys(k.copy(), seed=1, epoch=2), shuffle_keys(reversed_keys, seed=1, epoch=2))


def test_equal_hashes_are_ordered_by_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shuffle, "key_hash", lambda keys, **_: np.zeros(keys.shape[1], np.uint64))
    k = np.array([[3, 1, 2, 1], [0, 9, 5, 4]], dtype=np.int64)
    assert k[:, epoch_order(k, seed=0, epoch=0)].T.tolist() == [[1, 4], [1, 9], [2, 5], [3, 0]]


def test_tied_runs_are_found_across_chunks() -> None:
    packed = np.sort(np.array([5, 3, 3, 3, 9, 1, 1], dtype=np.uint64) << np.uint64(4))
    assert _tied_runs(packed, np.uint64(4), chunk=2) == [(0, 2), (2, 5)]


def test_hashes_tied_above_the_index_bits_still_come_out_by_whole_hash_then_key() -> None:
    k = np.ascontiguousarray(np.random.default_rng(3).integers(0, 500, size=(2, 5_000)))  # repeats too
    h = shuffle.key_hash(k, seed=4, epoch=5)
    expected = np.lexsort((k[1], k[0], h))
    for bits in (None, 58, 62):  # a 2- or 6-bit hash prefix: nearly every key ties with others
        order, _ = shuffle._sorted(k, 4, 5, index_bits=bits)
        assert np.array_equal(k[:, order], k[:, expected])
        assert np.array_equal(h[order], h[expected])


def test_subsample_is_deterministic_uniform_and_new_each_epoch() -> None:
    k = keys_of(100_000)
    a, again, other = (subsample(k, seed=0, epoch=e, fraction=0.25) for e in (0, 0, 1))
    assert np.array_equal(a, again)
    assert 0.24 < a.shape[1] / 100_000 < 0.26
    assert not np.array_equal(a, other)
    assert subsample(k, seed=0, epoch=0, fraction=1.0) is k


@pytest.mark.parametrize(
    ("n", "size", "drop_last", "expected"), [(10, 3, True, 3), (10, 3, False, 4), (9, 3, False, 3)]
)
def test_n_batches(n: int, size: int, drop_last: bool, expected: int) -> None:
    assert n_batches(n, size, drop_last) == expected


# The order is part of the store format: a change here reorders every user's epochs and makes partial
# epochs written by an older version unresumable. These figures were computed by pgprefetch 0.1.0.
GOLDEN = [
    # (seed, epoch, fraction, first keys of the epoch of keys 1..1000)
    (0, 0, 1.0, [460, 809, 464, 33, 668, 605, 600, 5, 690, 737, 31, 410]),
    (7, 3, 1.0, [406, 652, 323, 748, 365, 534, 24, 114, 722, 191, 259, 129]),
    (0, 0, 0.1, [464, 31, 789, 648, 646, 235, 550, 61, 588, 431, 2, 883]),
]


@pytest.mark.parametrize(("seed", "epoch", "fraction", "first"), GOLDEN)
def test_the_order_of_a_known_epoch_never_changes(seed: int, epoch: int, fraction: float, first: list[int]) -> None:
    keys = np.arange(1, 1001, dtype=np.int64).reshape(1, -1)
    ordered = shuffle_keys(keys, seed=seed, epoch=epoch, fraction=fraction)
    assert ordered[0, :12].tolist() == first
    assert ordered.shape == (1, 1000 if fraction == 1.0 else 107)


def test_the_order_of_known_two_column_keys_never_changes() -> None:
    keys = np.array([[s, t] for s in range(1, 11) for t in range(0, 200, 4)], dtype=np.int64).T.copy()
    first = shuffle_keys(keys, seed=0, epoch=1)[:, :6].T.tolist()
    assert first == [[10, 92], [3, 172], [8, 140], [10, 20], [9, 112], [8, 176]]
