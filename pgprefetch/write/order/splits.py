"""Which split each sample belongs to: a pure function of its key (its series' key, windows) and the split seed.

Every key gets a 53-bit hash of (split seed, key), independent of the shuffle's seed and of the epoch, and
the splits' shares are cut points on it in the config's order: ``train = 0.9, val = 0.05, test = 0.05``
puts the hashes below 0.9 * 2**53 in train, the next 0.05 * 2**53 in val, the rest in test. So the splits
are disjoint and cover every key by construction, a key's split depends on no other key (a row added later
lands in one split for good, a row deleted moves none), and the shares hold to a binomial's accuracy.

A window's split is its series' (every key slot but the order value): no series is in two splits, so no
window of a validation series is ever trained on (:func:`windowed` says which samples are windows).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from pgprefetch.config.model import Config, SplitsConfig
from pgprefetch.keys import KeyColumns
from pgprefetch.write.order.shuffle import key_hash

_SPLIT_STREAM = 0x73706C697473  # "splits"
_BITS = 53


def cut_points(rule: SplitsConfig) -> np.ndarray:
    """The upper end of each split's hash range (53-bit values, in the config's order; the last is 2**53)."""
    ends = np.cumsum([share for _, share in rule.shares])
    points: np.ndarray = np.floor(ends * (1 << _BITS)).astype(np.uint64)
    points[-1] = np.uint64(1 << _BITS)  # the shares sum to 1 within rounding: the last split takes the rest
    return points


def split_codes(keys: np.ndarray, rule: SplitsConfig) -> np.ndarray:
    """Each key's split (a column of ``keys``, int64 slots): its position in ``rule.shares``."""
    h = key_hash(keys, seed=rule.seed, epoch=0, stream=_SPLIT_STREAM) >> np.uint64(64 - _BITS)
    codes: np.ndarray = np.searchsorted(cut_points(rule), h, side="right").astype(np.int8)
    return codes


@dataclass(frozen=True)
class SplitFilter:
    """The samples of one split: those whose first ``slots`` key slots (a window's: its series') hash into it."""

    rule: SplitsConfig
    name: str
    slots: int  # the key slots that decide: all of a row's; a window's but its order value

    def keeps(self, keys: np.ndarray) -> np.ndarray:
        """Which of ``keys`` (columns, int64 slots) are of this split."""
        code = self.rule.names.index(self.name)
        kept: np.ndarray = split_codes(keys[: self.slots], self.rule) == code
        return kept


def split_filter(cfg: Config, width: int, key_columns: KeyColumns | None = None) -> SplitFilter | None:
    """The filter of ``cfg``'s split over sample keys of ``width`` slots.

    None: the config has no splits, or cuts them in time, which the windows' cut applies
    (:func:`~pgprefetch.write.scan.table.cut`): a window's split is its rows' times, not its key.
    """
    if cfg.splits is None or cfg.splits.by != "key":
        return None
    assert cfg.split is not None, "a config with [splits] is dumped or checked one split at a time"
    return SplitFilter(cfg.splits, cfg.split, width - 1 if windowed(cfg, width, key_columns) else width)


def windowed(cfg: Config, width: int, key_columns: KeyColumns | None = None) -> bool:
    """Whether ``cfg``'s samples are windows, split by their series: every key slot but the last (a start).

    Scan mode says so (``window``). In query mode a sample of several rows keyed by more than one column is
    taken as one: its key's last column is where it starts (an order value: one slot, never a ``uuid``), the
    rest its series, as in the scan-mode twin whose epochs it writes byte for byte; so the twins split alike.
    """
    if cfg.mode == "scan":
        return cfg.scan_samples.window is not None
    if key_columns is not None and (len(key_columns.names) < 2 or key_columns.uuids[-1]):
        return False
    return cfg.samples.rows > 1 and width > 1


def split_keep(cfg: Config, key_columns: KeyColumns | None = None) -> Callable[[np.ndarray], np.ndarray] | None:
    """Which sample keys the epoch keeps (the ``keep`` of :func:`~.shuffle.order_part`); None: all of them.

    Its split's (``[splits]`` by key), less the keys an ``on_error = "skip"`` transform failed on
    (``cfg.left_out``). Both are a pure function of the key, applied wherever the keys are chosen, before the
    shuffle: so a mixed source's share, drawn from its kept keys, stays exact.
    """
    by_key = cfg.splits is not None and cfg.splits.by == "key"
    left_out = cfg.left_out
    if not by_key and (left_out is None or not left_out.size):
        return None

    def keeps(keys: np.ndarray) -> np.ndarray:
        kept = np.ones(keys.shape[1], dtype=bool)
        if by_key:
            rule = split_filter(cfg, keys.shape[0], key_columns)
            assert rule is not None
            kept &= rule.keeps(keys)
        if left_out is not None and left_out.size:
            kept &= ~among(keys, left_out)
        return kept

    return keeps


def among(keys: np.ndarray, these: np.ndarray) -> np.ndarray:
    """Which keys (``(width, n)``) are among ``these`` (``(width, m)``): whole keys compared, every slot."""
    if keys.shape[0] == 1:
        return np.isin(keys[0], these[0])
    row = np.dtype((np.void, 8 * keys.shape[0]))  # a key's slots as one opaque value
    return np.isin(np.ascontiguousarray(keys.T).view(row).ravel(), np.ascontiguousarray(these.T).view(row).ravel())
