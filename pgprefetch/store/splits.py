"""A store's splits: each a store of its own in ``splits/NAME``, sharing the store's vocabulary and split rule.

A config with ``[splits]`` writes one store: the root holds the split rule (``.pgprefetch/splits.json``: the
shares and the seed, or a time cut's points) and the ``"auto"`` vocabulary; each split's epochs, partial
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
SPLITS_RECORD = "splits.json"
SPLITS = f"{META_DIR}/{SPLITS_RECORD}"


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
    raw = root.read_own(SPLITS_RECORD)
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
    """The store of split ``name`` of ``root``, for reading.

    A store not there yet is the split's to come (a reader may wait for cron's first dump); one that is
    there must record the split, or hold nothing yet.

    Raises:
        StoreError: ``root`` is a store without splits, or without one of that name.
    """
    if root.exists():
        rule = split_rule(root)
        if rule is None and root.epochs():  # (none yet: a first dump is making it, its rule comes next)
            raise StoreError(f"{root.location} has no splits: open it without split=")
        if rule is not None and name not in rule.names:
            raise StoreError(f"{root.location} has no split {name!r}; its splits: {', '.join(rule.names)}")
    return split_store(root, name)


def refuse_whole(root: Store) -> None:
    """Refuse to read a store with splits as one: its epochs are its splits' (a reader names one).

    Raises:
        StoreError: naming the splits.
    """
    rule = split_rule(root)  # (one small read; none where no store is there yet)
    if rule is not None:
        raise StoreError(f"{root.location} has splits ({', '.join(rule.names)}): open one with split=NAME")


def dump_store(root: Store, rule: SplitsConfig | None, split: str | None) -> Store:
    """The store a config's epochs go in: ``root``, or the store of its split ``split`` in it.

    Raises:
        ConfigError: the config has splits and no split was named (``--split``), or ``root`` records another
            split rule.
    """
    if rule is None:
        return root
    if split is None:
        raise ConfigError(f"--split is required (split= in Python): the config's [splits] are {', '.join(rule.names)}")
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


def remove_unused(store: Store, root_made: bool) -> None:
    """Remove the store a failed first dump made (:meth:`~.base.Store.remove_if_unused`).

    A split's goes, and the store it is in where this dump made that too and no split of it is there now
    (another dump's may be: its store and rule stay).
    """
    store.remove_if_unused()
    root = store.parent
    if root is None or not root_made:
        return
    rule = split_rule(root)
    if rule is None or not any(split_store(root, name).exists() for name in rule.names):
        root.remove_if_unused()


def served_epoch(store: Store, epoch: int) -> int:
    """The epoch that serves epoch ``epoch`` of ``store``: an evaluation split's one epoch (0) serves them all."""
    name = store.split_name
    return 0 if name is not None and SplitsConfig.evaluation(name) else epoch


def _written(rule: SplitsConfig) -> bytes:
    return (json.dumps({"format_version": FORMAT_VERSION, **rule.content()}) + "\n").encode()


def _parse(raw: bytes, location: str) -> SplitsConfig:
    damaged = StoreError(f"{location}/{SPLITS} is damaged; restore it from a backup")
    try:
        record: Any = json.loads(raw)
        if record["format_version"] != FORMAT_VERSION:
            raise damaged
        by = record.get("by", "key")
        entries = record["shares"] if by == "key" else record["starts"]
    except (ValueError, KeyError, TypeError, AttributeError):
        raise damaged from None
    if by not in ("key", "order") or not isinstance(entries, list) or not entries:
        raise damaged
    parsed: list[tuple[str, Any]] = []
    for entry in entries:
        if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)):
            raise damaged
        name, value = entry
        if not SPLIT_NAME.match(name) or not _value_ok(by, value):
            raise damaged
        parsed.append((name, float(value) if by == "key" else value))
    if by == "order":
        return SplitsConfig(by="order", starts=tuple(parsed))
    seed = record.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise damaged
    return SplitsConfig(shares=tuple(parsed), seed=seed)


def _value_ok(by: str, value: Any) -> bool:
    """Whether a recorded share (by key) or ``from`` (by order) is one a config could give."""
    if by == "key":
        return not isinstance(value, bool) and isinstance(value, int | float)
    return value is None or (not isinstance(value, bool) and isinstance(value, int | str))


def _check_same(stored: SplitsConfig, rule: SplitsConfig, location: str) -> None:
    """Refuse ``rule`` unless it is ``stored``, naming what differs: a key would move between splits.

    A config error (exit 2), as a store holding another config's epochs is: the config is what must change.
    """
    prefix = f"{location} was split by another rule, and a sample's split must never move:"
    if stored.by != rule.by:
        raise ConfigError(f'{prefix} [splits] by is "{stored.by}" there, "{rule.by}" in the config')
    if stored.seed != rule.seed:
        raise ConfigError(f"{prefix} [splits] seed is {stored.seed} there, {rule.seed} in the config")
    theirs = dict(stored.shares or stored.starts)
    mine = dict(rule.shares or rule.starts)
    for name in dict.fromkeys([*stored.names, *rule.names]):
        if theirs.get(name, "absent") != mine.get(name, "absent"):
            there, here = theirs.get(name, "absent"), mine.get(name, "absent")
            what = "" if stored.by == "key" else " from"
            raise ConfigError(f"{prefix} [splits] {name}{what} is {there} there, {here} in the config")
    if stored.names != rule.names:
        raise ConfigError(f"{prefix} [splits] are in the order {', '.join(stored.names)} there")
