"""The plan of a mixed epoch, without a database: the apportionment's exactness, the passes' invariants.

Guarantee 1 (exact in every batch prefix) over random weights and batch sizes, against exact fractions;
guarantee 2 and 5 on the pass orders (a permutation per pass, positions that survive inserted and
deleted keys); the epoch-length rule of guarantee 6.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pgprefetch.write.mix.apportion import Apportionment, first_pass_batches, shares
from pgprefetch.write.mix.passes import Passes, Position, choose

weights = st.lists(
    st.one_of(st.integers(0, 1000), st.floats(0.001, 10, allow_nan=False).map(lambda x: round(x, 3))),
    min_size=1,
    max_size=8,
).filter(lambda w: sum(w) > 0)


@given(weights=weights, size=st.integers(1, 300), n_batches=st.integers(1, 60), short=st.integers(0, 299))
def test_every_batch_prefix_holds_each_source_within_one_sample_of_its_share(
    weights: list[float], size: int, n_batches: int, short: int
) -> None:
    n = n_batches * size - min(short, size - 1)  # a short last batch too
    per_batch = Apportionment(weights).per_batch(n, size)
    assert per_batch.shape == (-(-n // size), len(weights))
    assert (per_batch >= 0).all()
    assert per_batch.sum(axis=1)[:-1].tolist() == [size] * (per_batch.shape[0] - 1)
    assert per_batch.sum() == n
    exact = shares(weights)
    prefix = np.cumsum(per_batch, axis=0)
    for b in range(prefix.shape[0]):
        h = min((b + 1) * size, n)
        for i, w in enumerate(exact):
            assert abs(Fraction(int(prefix[b, i])) - w * h) < 1, (b, i)


def test_weights_are_taken_as_the_decimals_the_config_wrote() -> None:
    # 0.7 : 0.3 is 7 : 3 exactly, so every 10 samples hold 7 and 3; a binary 0.7 would drift by 1 in 2**50
    counts = Apportionment([0.7, 0.3]).counts(np.array([10, 10_000_000]))
    assert counts.tolist() == [[7, 3], [7_000_000, 3_000_000]]


def test_a_source_of_weight_zero_gets_nothing() -> None:
    per_batch = Apportionment([1, 0, 2]).per_batch(3000, 30)
    assert per_batch[:, 1].sum() == 0
    assert per_batch[:, 0].tolist() == [10] * 100


def test_the_default_epoch_is_one_pass_of_the_source_with_the_fewest_samples_per_weight() -> None:
    # 100 samples at a quarter of 32 = 8 a batch: 13 batches (12.5 rounded up); the other source is slower
    # per sample of its own, not per unit of weight
    a = Apportionment([3, 1])
    assert first_pass_batches(a, [1000, 100], 32) == 13
    assert a.counts(13 * 32)[1] >= 100 > a.counts(12 * 32)[1]
    assert first_pass_batches(Apportionment([1, 1]), [10, 1000], 4) == 5


def _passes(keys: list[int], seed: int = 0, name: str = "s") -> Passes:
    chosen = choose(np.array([keys], dtype=np.int64), seed=seed, name=name, fraction=1.0, drop=False, where="[s]")
    return Passes(chosen, seed=seed, name=name)


def _keys(p: Passes, columns: np.ndarray) -> list[int]:
    return p.chosen.keys[0, columns].tolist()


@given(n=st.integers(1, 200), takes=st.lists(st.integers(0, 450), min_size=1, max_size=12), seed=st.integers(0, 9))
def test_each_pass_is_a_permutation_whatever_the_steps_it_is_taken_in(n: int, takes: list[int], seed: int) -> None:
    p = _passes(list(range(100, 100 + n)), seed)
    at, taken = Position(0, 0), []
    for q in takes:
        got, at = p.take(at, q)
        taken += _keys(p, got)
    whole = [taken[i : i + n] for i in range(0, len(taken) - len(taken) % n, n)]
    assert all(sorted(chunk) == list(range(100, 100 + n)) for chunk in whole)
    assert at == p.advance(Position(0, 0), sum(takes))  # counting passes = taking them
    if n > 3 and len(whole) >= 2:
        assert whole[0] != whole[1]  # a new order each pass


def test_a_position_survives_keys_inserted_and_deleted_without_repeating_any() -> None:
    before = _passes(list(range(0, 200, 2)))  # 100 even keys
    got, at = before.take(Position(0, 0), 40)
    first = set(_keys(before, got))
    after_key = before.after(at)
    # the table changes: 20 of the keys not yet taken are deleted, 50 odd keys are inserted
    untaken = sorted(set(range(0, 200, 2)) - first)
    now = sorted((set(range(0, 200, 2)) - set(untaken[:20])) | set(range(1, 100, 2)))
    later = _passes(now)
    resumed = later.locate(0, after_key)
    rest, end = later.take(resumed, later.chosen.m - resumed.index)
    second = _keys(later, rest)
    assert not first & set(second)  # no key twice in the pass
    assert set(untaken[20:]) <= set(second)  # every key still there and not taken is taken in this pass
    new_seen = set(second) & set(range(1, 100, 2))
    next_pass, _ = later.take(end, later.chosen.m)
    assert set(_keys(later, next_pass)) == set(now)  # the next pass sees every key, the inserted ones too
    assert 0 < len(new_seen) < 50  # some inserted keys came after the position in this pass, some before


def test_fraction_chooses_the_same_keys_in_every_pass_and_epoch() -> None:
    keys = np.arange(1000, dtype=np.int64)[None, :]
    a = choose(keys, seed=1, name="web", fraction=0.3, drop=False, where="[samples.web]")
    b = choose(keys[:, ::-1].copy(), seed=1, name="web", fraction=0.3, drop=False, where="[samples.web]")
    assert a.keys.tolist() == b.keys.tolist()
    assert 250 < a.m < 350
