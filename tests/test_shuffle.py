"""The epoch order is a pure function of (seed, epoch, the set of keys)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pgprefetch.write.order import shuffle
from pgprefetch.write.order.shuffle import _tied_runs, epoch_order, n_batches, order_part

from .harness.properties import epochs, key_arrays, seeds


def shuffle_keys(keys: np.ndarray, *, seed: int, epoch: int, fraction: float = 1.0) -> np.ndarray:
    """``keys`` in the epoch's order by the dump's one ordering (:func:`order_part`): repeats once, ``fraction``."""
    order, _ = order_part(keys, seed=seed, epoch=epoch, fraction=fraction)
    return keys[:, order]


def subsample(keys: np.ndarray, *, seed: int, epoch: int, fraction: float) -> np.ndarray:
    """The keys ``fraction`` keeps in an epoch, in key order as given (the set :func:`order_part` orders)."""
    kept = order_part(keys, seed=seed, epoch=epoch, fraction=fraction)[0]
    return np.ascontiguousarray(keys[:, np.sort(kept)])


def keys_of(n: int, columns: int = 2, rng_seed: int = 1) -> np.ndarray:
    """``n`` keys of ``columns`` int64 slots, spread over 2**41 values each (a repeat is about never drawn)."""
    rng = np.random.default_rng(rng_seed)
    return np.ascontiguousarray(rng.integers(-(2**40), 2**40, size=(columns, n)))


@given(keys=key_arrays(), seed=seeds, epoch=epochs)
def test_order_is_a_permutation(keys: np.ndarray, seed: int, epoch: int) -> None:
    order = epoch_order(keys, seed=seed, epoch=epoch)
    assert sorted(order.tolist()) == list(range(keys.shape[1]))


@given(keys=key_arrays(repeats=False), seed=seeds, epoch=epochs)
def test_same_seed_and_epoch_give_the_same_order(keys: np.ndarray, seed: int, epoch: int) -> None:
    once = shuffle_keys(keys.copy(), seed=seed, epoch=epoch)
    assert np.array_equal(once, shuffle_keys(keys.copy(), seed=seed, epoch=epoch))
    assert np.array_equal(np.unique(once, axis=1), np.unique(keys, axis=1))  # the same keys, each once


@given(seed=seeds, epoch=epochs, other_seed=seeds, other_epoch=epochs, rng_seed=st.integers(0, 2**32 - 1))
def test_another_epoch_or_seed_gives_another_order(
    seed: int, epoch: int, other_seed: int, other_epoch: int, rng_seed: int
) -> None:
    assume(other_seed != seed and other_epoch != epoch)
    k = keys_of(5_000, rng_seed=rng_seed)  # enough keys that two orders agree on about one place in 5,000
    base = shuffle_keys(k.copy(), seed=seed, epoch=epoch)
    assert (shuffle_keys(k.copy(), seed=seed, epoch=other_epoch) != base).any(axis=0).mean() > 0.99
    assert (shuffle_keys(k.copy(), seed=other_seed, epoch=epoch) != base).any(axis=0).mean() > 0.99


@given(data=st.data(), keys=key_arrays(), seed=seeds, epoch=epochs)
def test_order_does_not_depend_on_the_order_keys_arrive_in(
    data: st.DataObject, keys: np.ndarray, seed: int, epoch: int
) -> None:
    arrived = np.ascontiguousarray(keys[:, data.draw(st.permutations(range(keys.shape[1])))])
    expected = keys[:, epoch_order(keys, seed=seed, epoch=epoch)]
    assert np.array_equal(arrived[:, epoch_order(arrived, seed=seed, epoch=epoch)], expected)
    dropped = shuffle_keys(keys.copy(), seed=seed, epoch=epoch)  # repeats dropped alike too
    assert np.array_equal(dropped, shuffle_keys(arrived, seed=seed, epoch=epoch))


def test_equal_hashes_are_ordered_by_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shuffle, "key_hash", lambda keys, **_: np.zeros(keys.shape[1], np.uint64))
    k = np.array([[3, 1, 2, 1], [0, 9, 5, 4]], dtype=np.int64)
    assert k[:, epoch_order(k, seed=0, epoch=0)].T.tolist() == [[1, 4], [1, 9], [2, 5], [3, 0]]


def test_tied_runs_are_found_across_chunks() -> None:
    packed = np.sort(np.array([5, 3, 3, 3, 9, 1, 1], dtype=np.uint64) << np.uint64(4))
    assert _tied_runs(packed, np.uint64(4), chunk=2) == [(0, 2), (2, 5)]


@given(keys=key_arrays(widths=(1, 2, 3), min_keys=2), seed=seeds, epoch=epochs, bits=st.integers(48, 63))
def test_hashes_tied_above_the_index_bits_still_come_out_by_whole_hash_then_key(
    keys: np.ndarray, seed: int, epoch: int, bits: int
) -> None:
    h = shuffle.key_hash(keys, seed=seed, epoch=epoch)
    expected = np.lexsort((*keys[::-1], h))
    for index_bits in (None, 58, 62, bits):  # a 2- or 6-bit hash prefix: nearly every key ties with others
        order, _ = shuffle._sorted(keys, seed, epoch, index_bits=index_bits)  # (fewer bits than n needs: as None)
        assert np.array_equal(keys[:, order], keys[:, expected])
        assert np.array_equal(h[order], h[expected])


@given(
    seed=seeds,
    epoch=epochs,
    fraction=st.one_of(st.just(0.25), st.floats(0.05, 0.95)),
    rng_seed=st.integers(0, 2**32 - 1),
)
def test_subsample_is_deterministic_uniform_and_new_each_epoch(
    seed: int, epoch: int, fraction: float, rng_seed: int
) -> None:
    k = keys_of(100_000, rng_seed=rng_seed)
    a, again, other = (subsample(k, seed=seed, epoch=e, fraction=fraction) for e in (epoch, epoch, epoch + 1))
    assert np.array_equal(a, again)
    assert abs(a.shape[1] / 100_000 - fraction) < 0.01  # 6 standard deviations or more
    assert not np.array_equal(a, other)
    assert np.array_equal(subsample(k, seed=seed, epoch=epoch, fraction=1.0), k)


@given(keys=key_arrays(repeats=False), seed=seeds, epoch=epochs, fraction=st.floats(0.0, 1.0))
def test_the_order_of_a_subsample_is_the_whole_order_restricted_to_it(
    keys: np.ndarray, seed: int, epoch: int, fraction: float
) -> None:
    kept = subsample(keys, seed=seed, epoch=epoch, fraction=fraction)
    assert kept.shape[0] == keys.shape[0]
    assert kept.flags.c_contiguous
    whole = shuffle_keys(keys.copy(), seed=seed, epoch=epoch)
    chosen = {tuple(c) for c in kept.T}
    restricted = np.array([c for c in whole.T if tuple(c) in chosen], dtype=np.int64).reshape(-1, keys.shape[0]).T
    assert np.array_equal(shuffle_keys(keys.copy(), seed=seed, epoch=epoch, fraction=fraction), restricted)
    assert np.array_equal(shuffle_keys(kept.copy(), seed=seed, epoch=epoch), restricted)  # the subset alone


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
