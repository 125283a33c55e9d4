"""A sample's split (#53): a pure function of its key and the split seed, so a partition that never moves.

The fast tier: no server. The dumps that apply it are tested against PostgreSQL in ``test_splits.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgprefetch.config.load import load_config
from pgprefetch.config.model import SplitsConfig
from pgprefetch.errors import ConfigError
from pgprefetch.write.order.splits import SplitFilter, cut_points, split_codes


@st.composite
def rules(draw: st.DrawFn) -> SplitsConfig:
    """Any 1 to 5 splits with positive shares summing to 1 (as the config requires), any seed."""
    weights = draw(st.lists(st.integers(1, 1000), min_size=1, max_size=5))
    shares = [w / sum(weights) for w in weights]
    shares[-1] = 1.0 - sum(shares[:-1])
    names = [f"s{i}" for i in range(len(shares))]
    return SplitsConfig(shares=tuple(zip(names, shares, strict=True)), seed=draw(st.integers(0, 2**32)))


keys_strategy = st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=300, unique=True)


@settings(max_examples=150, deadline=None)
@given(rule=rules(), old=keys_strategy, new=keys_strategy)
def test_the_splits_partition_any_keys_and_a_key_never_moves_when_others_come(
    rule: SplitsConfig, old: list[int], new: list[int]
) -> None:
    before = np.array(old, dtype=np.int64)[None, :]
    codes = split_codes(before, rule)
    assert ((codes >= 0) & (codes < len(rule.shares))).all()  # every key in exactly one split
    after = np.array(old + [k for k in new if k not in set(old)], dtype=np.int64)[None, :]
    np.testing.assert_array_equal(split_codes(after, rule)[: len(old)], codes)  # inserted keys move none
    alone = np.array(old[::2], dtype=np.int64)[None, :]
    np.testing.assert_array_equal(split_codes(alone, rule), codes[::2])  # nor do deleted ones


def test_the_shares_hold_on_100k_keys_and_the_last_split_takes_the_rest() -> None:
    rule = SplitsConfig(shares=(("train", 0.9), ("val", 0.05), ("test", 0.05)), seed=3)
    codes = split_codes(np.arange(100_000, dtype=np.int64)[None, :], rule)
    counts = np.bincount(codes, minlength=3) / 100_000
    np.testing.assert_allclose(counts, [0.9, 0.05, 0.05], atol=0.01)
    assert cut_points(rule)[-1] == 1 << 53


def test_another_seed_is_another_split_and_the_shuffle_seed_plays_no_part() -> None:
    keys = np.arange(10_000, dtype=np.int64)[None, :]
    a = split_codes(keys, SplitsConfig(shares=(("train", 0.5), ("val", 0.5)), seed=0))
    b = split_codes(keys, SplitsConfig(shares=(("train", 0.5), ("val", 0.5)), seed=1))
    assert 0.4 < (a != b).mean() < 0.6


def test_a_window_is_split_by_its_series_whatever_its_order_value() -> None:
    rule = SplitsConfig(shares=(("train", 0.5), ("val", 0.5)))
    series = np.repeat(np.arange(200, dtype=np.int64), 10)
    starts = np.tile(np.arange(10, dtype=np.int64), 200)
    kept = SplitFilter(rule, "val", slots=1).keeps(np.stack([series, starts]))
    per_series = kept.reshape(200, 10)
    assert (per_series.all(axis=1) | ~per_series.any(axis=1)).all()  # each series wholly in or out
    assert 0 < per_series[:, 0].sum() < 200


def _config(tmp_path: Path, splits: str, name: str = "c.toml") -> Path:
    path = tmp_path / name
    path.write_text(
        '[samples]\nkeys = "SELECT id FROM t"\nquery = "SELECT v FROM t WHERE id = $1"\n'
        '[fields.v]\ncolumns = ["v"]\ndtype = "float32"\n[batches]\nsize = 8\n[store]\npath = "s.zarr"\n' + splits
    )
    return path


@pytest.mark.parametrize(
    ("splits", "said"),
    [
        ("[splits]\ntrain = 0.9\nval = 0.2\n", "[splits]: the shares must sum to 1, not 1.1 (train 0.9 + val 0.2)"),
        ('[splits]\ntrain = 0.9\n"../x" = 0.1\n', "[splits] ../x: a split's name is lower-case letters"),
        ("[splits]\ntrain = 1.0\nval = 0\n", "[splits] val: expected a share with 0 < share <= 1, got 0"),
        ("[splits]\nseed = 3\n", "[splits]: names no split"),
    ],
)
def test_a_split_rule_that_is_no_partition_is_one_line(tmp_path: Path, splits: str, said: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(_config(tmp_path, splits))
    assert said in str(e.value)


def test_a_split_named_on_the_command_line_must_be_the_configs(tmp_path: Path) -> None:
    path = _config(tmp_path, "[splits]\ntrain = 0.9\nval = 0.1\nseed = 4\n")
    cfg = load_config(path, split="val")
    assert cfg.splits == SplitsConfig(shares=(("train", 0.9), ("val", 0.1)), seed=4)
    assert cfg.evaluation
    assert not cfg.batches.drop_last  # an evaluation split keeps every sample
    assert load_config(path, split="train").batches.drop_last
    assert load_config(path, split="train").sha256() != load_config(_config(tmp_path, "", "plain.toml")).sha256()
    with pytest.raises(ConfigError, match=r"--split test: .*\[splits\] names train, val"):
        load_config(path, split="test")


def test_a_query_sample_keyed_by_a_uuid_last_is_no_window_and_is_split_by_its_whole_key(tmp_path: Path) -> None:
    """A window's last key column is where it starts, an order value: a uuid there means the key is no window."""
    from pgprefetch.keys import KeyColumns
    from pgprefetch.write.order.splits import windowed

    path = _config(tmp_path, "[splits]\ntrain = 0.5\nval = 0.5\n")
    path.write_text(path.read_text().replace('query = "SELECT v', 'rows = 8\nquery = "SELECT v'))
    cfg = load_config(path, split="val")
    assert windowed(cfg, 2, KeyColumns.of_types(["station", "week"], ["int4", "date"]))
    assert not windowed(cfg, 2, KeyColumns.of_types(["user"], ["uuid"]))  # one column, two slots
    assert not windowed(cfg, 3, KeyColumns.of_types(["shop", "user"], ["int4", "uuid"]))
