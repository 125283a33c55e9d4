"""A store's splits: each a store of its own in ``splits/NAME``, sharing the store's vocabulary and split rule.

A config with ``[splits]`` writes one store: the root holds the split rule (``.pgprefetch/splits.json``:
each split's share and the seed) and the ``"auto"`` categories' vocabulary; each split's epochs, partial
epochs, locks and consumers live in its own store below (:meth:`~.base.Store.sub_store`), so every command and
reader that works on a store works on a split unchanged. The rule is written by the first dump and compared by
every later one: a changed share or seed would move keys between splits (a validation key trained on), so a
store refuses it, naming the split that differs, as it refuses another config.

An evaluation split (any split but ``train``) is written once, in a fixed order: its epoch 0 serves every
epoch number (:func:`served_epoch`).
"""

from __future__ import annotations

import json
from typing import Any

from pgprefetch.config.model import SPLIT_NAME, SplitsConfig
from pgprefetch.errors import ConfigError, StoreError
from pgprefetch.store.base import FORMAT_VERSION, META_DIR, Store

SPLITS_DIR = "splits"
SPLITS = f"{META_DIR}/splits.json"


def split_store(root: Store, name: str) -> Store:
    """The store of split ``name`` in ``root`` (nothing read or created).

    Raises:
        StoreError: ``name`` is not a split's name (it would name a folder elsewhere).
    """
    if not SPLIT_NAME.match(name):
        raise StoreError(f"split {name!r}: a split's name is lower-case letters, digits and _")
    store = root.sub_store(f"{SPLITS_DIR}/{name}")
    store.parent, store.split_name = root, name
    return store


def split_rule(root: Store) -> SplitsConfig | None:
    """The split rule ``root`` records (None: no split was ever dumped into it).

    Raises:
        StoreError: the record is damaged (a store may be written by anyone: it is checked, not trusted).
    """
    raw = root.read(SPLITS)
    return None if raw is None else _parse(raw, root.location)


def record_split_rule(root: Store, rule: SplitsConfig) -> None:
    """Record ``rule`` in ``root``, or check it against the one recorded.

    Raises:
        ConfigError: the store records another rule (naming the split or the seed that differs).
    """

    def change(raw: bytes | None) -> bytes:
        if raw is None:
            return _written(rule)
        _check_same(_parse(raw, root.location), rule, root.location)
        return raw

    root.swap(SPLITS, change)


def open_split(root: Store, name: str) -> Store:
    """The store of split ``name`` of an existing store ``root``, for reading.

    Raises:
        StoreError: ``root`` has no splits, or none of that name.
    """
    rule = split_rule(root.require())
    if rule is None:
        raise StoreError(f"{root.location} has no splits: open it without split=")
    if name not in rule.names:
        raise StoreError(f"{root.location} has no split {name!r}; its splits: {', '.join(rule.names)}")
    return split_store(root, name)


def config_store(root: Store, rule: SplitsConfig | None, split: str | None) -> Store:
    """The store a config's epochs go in: ``root``, or the store of its split ``split`` in it.

    Raises:
        ConfigError: the config has splits and no split was named (``--split``), or ``root`` records another
            split rule.
    """
    if rule is None:
        return root
    if split is None:
        raise ConfigError(f"--split is required: the config's [splits] are {', '.join(rule.names)}")
    if root.exists():
        recorded = split_rule(root)
        if recorded is not None:
            _check_same(recorded, rule, root.location)
    return split_store(root, split)


def create_store(store: Store, rule: SplitsConfig | None, parents: bool) -> None:
    """Create ``store``; a split's, with the store it is in, whose split rule is recorded (or checked) first."""
    if store.parent is None:
        store.create(parents=parents)
        return
    assert rule is not None, "a split's store is made for a config with [splits]"
    store.parent.create(parents=parents)
    record_split_rule(store.parent, rule)
    store.create(parents=True)  # the splits' folder in the store, and the split's own


def served_epoch(store: Store, epoch: int) -> int:
    """The epoch that serves epoch ``epoch`` of ``store``: an evaluation split's one epoch (0) serves them all."""
    name = store.split_name
    return 0 if name is not None and SplitsConfig.evaluation(name) else epoch


def _written(rule: SplitsConfig) -> bytes:
    record = {"format_version": FORMAT_VERSION, "seed": rule.seed, "shares": [list(s) for s in rule.shares]}
    return (json.dumps(record) + "\n").encode()


def _parse(raw: bytes, location: str) -> SplitsConfig:
    damaged = StoreError(f"{location}/{SPLITS} is damaged; restore it from a backup")
    try:
        record: Any = json.loads(raw)
        version, seed, shares = record["format_version"], record["seed"], record["shares"]
    except (ValueError, KeyError, TypeError):
        raise damaged from None
    if version != FORMAT_VERSION or isinstance(seed, bool) or not isinstance(seed, int) or not isinstance(shares, list):
        raise damaged
    parsed = []
    for entry in shares:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            raise damaged
        name, share = entry
        if not SPLIT_NAME.match(name) or isinstance(share, bool) or not isinstance(share, int | float):
            raise damaged
        parsed.append((name, float(share)))
    if not parsed:
        raise damaged
    return SplitsConfig(shares=tuple(parsed), seed=seed)


def _check_same(stored: SplitsConfig, rule: SplitsConfig, location: str) -> None:
    """Refuse ``rule`` unless it is ``stored``, naming what differs: a key would move between splits.

    A config error (exit 2), as a store holding another config's epochs is: the config is what must change.
    """
    prefix = f"{location} was split by another rule, and a key's split must never move:"
    if stored.seed != rule.seed:
        raise ConfigError(f"{prefix} [splits] seed is {stored.seed} there, {rule.seed} in the config")
    theirs, mine = dict(stored.shares), dict(rule.shares)
    for name in dict.fromkeys([*stored.names, *rule.names]):
        if theirs.get(name) != mine.get(name):
            there = theirs.get(name, "absent")
            here = mine.get(name, "absent")
            raise ConfigError(f"{prefix} [splits] {name} is {there} there, {here} in the config")
    if stored.names != rule.names:
        raise ConfigError(f"{prefix} [splits] are in the order {', '.join(stored.names)} there")
