"""Where each source of a mixed epoch stands when the epoch begins, and how many samples it gives.

Epoch N is a pure function of the config, the sources' keys and the store's records, so that ``dump
--epoch 7`` alone writes the bytes ``dump --epochs 0-7`` writes:

- **a record**: the newest published epoch E < N of this config recorded where it left each source (its
  pass, and the hash and key of the last key taken in it). Epoch N starts there, after the epochs between
  E and N counted as the current config would plan them. So weights edited between two epochs continue
  every source where the published epochs left it: nothing lost, nothing repeated (Megatron-LM #457).
- **no record** (a fresh store, or epochs written before mixing): every source starts at pass 0 at epoch
  0, and the epochs before N are counted. A gap (epochs missing between records) is counted the same way.

Counting an epoch needs only its length and weights, not its keys' orders: each source's position moves
by its quota, in whole passes of its current key count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pgprefetch.config.model import Config
from pgprefetch.errors import ConfigError, StoreError
from pgprefetch.store.base import Store
from pgprefetch.write.mix.apportion import Apportionment, Weight, first_pass_batches
from pgprefetch.write.mix.passes import PassOrder, Position

_MAX = (1 << 63) - 1
_HASH = re.compile(r"[0-9]{1,20}")  # 2**64 - 1 has 20 digits


@lru_cache(maxsize=64)
def apportionment(weights: tuple[Weight, ...]) -> Apportionment:
    """The apportionment of one set of weights (kept: every epoch of a fixed mix has the same)."""
    return Apportionment(weights)


def weights_at(cfg: Config, epoch: int) -> tuple[Weight, ...]:
    """Each source's weight at ``epoch``, in source order."""
    assert cfg.mix is not None
    return tuple(s.weight(epoch) for s in cfg.mix.sources)


def epoch_samples(cfg: Config, epoch: int, sizes: dict[str, int]) -> int:
    """The samples of epoch ``epoch``: ``[mix] samples``, or one pass of the slowest source.

    ``[mix] samples`` is cut to whole batches unless ``drop_last`` is false; without it, the length is
    :func:`~pgprefetch.write.mix.apportion.first_pass_batches`.

    Raises:
        ConfigError: ``[mix] samples`` make no full batch.
    """
    assert cfg.mix is not None
    size = cfg.batches.size
    if cfg.mix.samples is not None:
        n = cfg.mix.samples - cfg.mix.samples % size if cfg.batches.drop_last else cfg.mix.samples
        if n == 0:
            raise ConfigError(f"[mix] samples = {cfg.mix.samples} make no full batch of {size}")
        return n
    a = apportionment(weights_at(cfg, epoch))
    return first_pass_batches(a, [sizes.get(s.name, 0) for s in cfg.mix.sources], size) * size


def quotas(cfg: Config, epoch: int, sizes: dict[str, int]) -> dict[str, int]:
    """Each source's samples in epoch ``epoch``."""
    assert cfg.mix is not None
    counts = apportionment(weights_at(cfg, epoch)).counts(epoch_samples(cfg, epoch, sizes))
    return {s.name: int(c) for s, c in zip(cfg.mix.sources, counts, strict=True)}


@dataclass(frozen=True)
class Starts:
    """Each source's position at the start of an epoch, and what it was found from."""

    positions: dict[str, Position]
    record: int | None  # the epoch whose record it continues; None: counted from epoch 0
    counted: int  # the epochs counted after the record (or from epoch 0)


def find_record(cfg: Config, store: Store | None, epoch: int) -> tuple[int, dict[str, Any]] | None:
    """The newest published epoch before ``epoch`` of this config with a mix record, and that record."""
    if store is None or not store.exists():
        return None
    mine = cfg.sha256()
    for e in sorted((e for e in store.epochs() if e < epoch), reverse=True):
        manifest = store.manifest(e)
        if manifest.get("config_sha256") == mine and "mix" in manifest:
            return e, manifest["mix"]
    return None


def needed(cfg: Config, epoch: int, record: tuple[int, dict[str, Any]] | None) -> list[str]:
    """The sources to read for ``epoch``: those with a weight above 0 in it or an epoch counted before it."""
    assert cfg.mix is not None
    first = record[0] + 1 if record else 0
    return [s.name for s in cfg.mix.sources if any(s.weight(e) > 0 for e in _steps(cfg, first, epoch))]


def _steps(cfg: Config, first: int, last: int) -> list[int]:
    """The epochs ``first ... last`` at which some weight changes, with ``first`` and ``last``."""
    assert cfg.mix is not None
    changes = {e for s in cfg.mix.sources for e, _ in s.weights if first < e <= last}
    return sorted({first, last} | changes) if first <= last else [last]


def starts(
    cfg: Config, epoch: int, passes: dict[str, PassOrder], record: tuple[int, dict[str, Any]] | None, where: str
) -> Starts:
    """Each source's position at the start of ``epoch`` (see the module's rules)."""
    assert cfg.mix is not None
    positions, first = recorded(passes, record, where)
    sizes = {name: p.m for name, p in passes.items()}
    for e in range(first, epoch):
        for name, q in quotas(cfg, e, sizes).items():
            if q:
                positions[name] = passes[name].advance(positions[name], q)
    return Starts(positions, record[0] if record else None, epoch - first)


def recorded(
    passes: dict[str, PassOrder], record: tuple[int, dict[str, Any]] | None, where: str
) -> tuple[dict[str, Position], int]:
    """Each source's position after the epoch ``record`` is of (the start where there is none), and the epoch after.

    The epochs from there to the one being planned are counted by the caller, in samples or (a packed mix) in
    tokens.
    """
    positions = {name: Position(0, 0) for name in passes}
    if record is None:
        return positions, 0
    for name, end in _ends(record[1], where).items():
        if name in passes:
            positions[name] = passes[name].locate(end[0], end[1])
    return positions, record[0] + 1


def _ends(record: Any, where: str) -> dict[str, tuple[int, tuple[int, list[int]] | None]]:
    """Each source's end position in an epoch's record, checked: the store may have been written by anyone.

    Raises:
        StoreError: the record is malformed.
    """

    def bad(what: str) -> StoreError:
        return StoreError(f"{where}: its mix record is malformed ({what}); rewrite that epoch with --force")

    if not isinstance(record, dict) or not isinstance(record.get("sources"), list):
        raise bad("no list of sources")
    out: dict[str, tuple[int, tuple[int, list[int]] | None]] = {}
    for entry in record["sources"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise bad("a source without a name")
        end = entry.get("end")
        if not isinstance(end, dict) or not _count(end.get("pass")):
            raise bad(f"source {entry['name']!r}: no end pass")
        after = end.get("after")
        if after is None:
            out[entry["name"]] = (end["pass"], None)
            continue
        if not (isinstance(after, list) and len(after) == 2 and _hash(after[0])):
            raise bad(f"source {entry['name']!r}: its last key's hash")
        h, slots = int(after[0]), after[1]
        if not isinstance(slots, list) or not slots or not all(_slot(s) for s in slots):
            raise bad(f"source {entry['name']!r}: its last key")
        out[entry["name"]] = (end["pass"], (h, slots))
    return out


def _hash(value: Any) -> bool:
    """Whether ``value`` is a 64-bit hash as a record writes it: ASCII decimal digits, below 2**64.

    Checked as text before ``int()`` reads it: ``str.isdigit`` accepts ``"²"`` and other digits ``int()``
    refuses, and ``int()`` refuses thousands of digits with a ``ValueError`` of its own.
    """
    return isinstance(value, str) and _HASH.fullmatch(value) is not None and int(value) < 1 << 64


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX


def _slot(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -_MAX - 1 <= value <= _MAX
