"""Each source's own passes: an order per pass given by a keyed hash, and positions that survive change.

Pass p of a source visits its chosen keys in ascending order of ``(h_p(key), key)``, h_p a 64-bit hash
keyed by the seed, the source's name and p: a fresh order each pass, the same in every process, and a
pure function of each key alone. So a position ("pass p, every key up to this one taken") does not
depend on where the other keys are: a row inserted between epochs is taken later in this pass if its hash
comes after the position, and is otherwise seen in the next pass; a row deleted is simply not there. No key
is taken twice in a pass, whatever the weights or the table's changes, and every key is taken once per
pass when the keys stay the same.

``fraction`` chooses a subset once, by another hash of each key: the same keys in every pass, so that a
pass is a pass over the chosen ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pgprefetch.errors import SampleError
from pgprefetch.write.order.shuffle import finalise


def _salt(seed: int, name: str, what: str, n: int = 0) -> np.uint64:
    digest = hashlib.sha256(f"pgprefetch-mix/{seed}/{name}/{what}/{n}".encode()).digest()
    return np.uint64(int.from_bytes(digest[:8], "little"))


def key_hash(keys: np.ndarray, salt: np.uint64) -> np.ndarray:
    """A 64-bit hash of each key (a column of ``keys``, int64 slots), keyed by ``salt``."""
    with np.errstate(over="ignore"):
        h = np.full(keys.shape[1], salt, dtype=np.uint64)
        for slot in keys:
            h ^= slot.view(np.uint64)
            finalise(h)
            h += salt
        return finalise(h)


def pass_hash(keys: np.ndarray, seed: int, name: str, p: int) -> np.ndarray:
    """The hash that orders pass ``p`` of source ``name`` (ties by key)."""
    return key_hash(keys, _salt(seed, name, "pass", p))


def fraction_kept(keys: np.ndarray, seed: int, name: str, fraction: float) -> np.ndarray:
    """Which of ``keys`` ``fraction`` chooses: the same ones in every pass, by a hash of each key alone."""
    h = key_hash(keys, _salt(seed, name, "fraction"))
    kept: np.ndarray = (h >> np.uint64(11)) < np.uint64(int(fraction * (1 << 53)))
    return kept


def slot_hash(seed: int, name: str, epoch: int, first: int, n: int) -> np.ndarray:
    """A hash per slot ``first ... first + n - 1`` of an epoch: the order of the samples within each batch."""
    slots = np.arange(first, first + n, dtype=np.int64)[None, :]
    return key_hash(slots, _salt(seed, name, "batch", epoch))


def _lex_order(keys: np.ndarray) -> np.ndarray:
    """The order of ``keys`` by ``(slot 0, slot 1, ...)``: one stable sort for a key of one slot."""
    if keys.shape[0] == 1:
        return np.argsort(keys[0], kind="stable")
    return np.lexsort(keys[::-1])


def by_hash(h: np.ndarray) -> np.ndarray:
    """The order of ``h`` along its last axis, equal hashes in their given order (the keys': key order).

    The hash of a one-slot key (or a slot number) is a bijection of it, so equal hashes come only from keys
    of several slots: a quicksort, and the stable sort only where it found a tie (a third of the time).
    """
    order = np.argsort(h, axis=-1)
    ranked = np.take_along_axis(h, order, axis=-1)
    if (ranked[..., 1:] == ranked[..., :-1]).any():
        order = np.argsort(h, axis=-1, kind="stable")
    return order


@dataclass(frozen=True)
class Chosen:
    """A source's keys as its passes walk them: repeats dropped and ``fraction`` applied, in key order."""

    keys: np.ndarray  # (n_slots, m) int64, ascending (slot 0 first)
    index: np.ndarray  # (m,) each one's column in the keys as read (scan mode: its sample)
    n_keys: int  # keys as read, repeats included
    repeats: int

    @property
    def m(self) -> int:
        """How many keys a pass walks."""
        return int(self.keys.shape[1])


def choose(
    keys: np.ndarray,
    *,
    seed: int,
    name: str,
    fraction: float,
    drop: bool,
    where: str,
    keep: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Chosen:
    """The keys a source's passes walk, from the keys it returned (``keep``: a split's, each key alone).

    Raises:
        SampleError: a key came twice and repeats are not dropped.
    """
    order = _lex_order(keys)
    ordered = keys[:, order]
    if ordered.shape[1] > 1:
        same = np.all(ordered[:, 1:] == ordered[:, :-1], axis=0)
        repeats = int(same.sum())
    else:
        same, repeats = np.zeros(0, dtype=bool), 0
    if repeats and not drop:
        raise repeated_keys(where, repeats, ordered[:, 1:][:, same][:, 0].tolist())
    if repeats:
        first = np.concatenate([[True], ~same])
        order, ordered = order[first], ordered[:, first]
    if keep is not None:
        kept = keep(ordered)
        order, ordered = order[kept], ordered[:, kept]
    if fraction < 1.0:
        kept = fraction_kept(ordered, seed, name, fraction)
        order, ordered = order[kept], ordered[:, kept]
    return Chosen(np.ascontiguousarray(ordered), order, int(keys.shape[1]), repeats)


def repeated_keys(where: str, repeats: int, example: list[int]) -> SampleError:
    """The error of a source whose keys repeat (``example``: the first repeated one, in key order)."""
    return SampleError(
        f"{where} returned {repeats} repeated key(s), e.g. {tuple(example)}: each sample must come once per "
        'pass; fix its keys, or set duplicates = "drop" to keep one of each'
    )


@dataclass(frozen=True)
class Position:
    """Where a source stands: in pass ``pass_``, its first ``index`` keys (of the pass order) taken."""

    pass_: int
    index: int


def advance(m: int, at: Position, n: int) -> Position:
    """The position ``n`` keys on from ``at`` in passes of ``m`` keys, counting whole passes."""
    index = min(at.index, m) + n
    return Position(at.pass_ + index // m, index % m)


def segments(m: int, at: Position, n: int) -> Iterator[tuple[int, int, int]]:
    """The next ``n`` keys from ``at`` as ``(pass, first, stop)`` ranges of pass orders of ``m`` keys."""
    p, index, left = at.pass_, min(at.index, m), n
    while left:
        if index == m:
            p, index = p + 1, 0
        step = min(left, m - index)
        yield p, index, index + step
        index, left = index + step, left - step


class PassOrder(Protocol):
    """A source's passes as a mixed epoch walks them: in memory (:class:`Passes`) or on disk (:mod:`.spilled`)."""

    @property
    def m(self) -> int:
        """How many keys a pass walks."""
        ...

    def locate(self, p: int, after: tuple[int, list[int]] | None) -> Position:
        """The position of "pass ``p``, every key up to ``after`` (its hash and slots) taken"."""
        ...

    def advance(self, at: Position, n: int) -> Position:
        """The position ``n`` keys on."""
        ...

    def take(self, at: Position, n: int) -> tuple[np.ndarray, Position]:
        """The next ``n`` keys from ``at`` (the source's own handles on them, in order) and the position after."""
        ...

    def after(self, at: Position) -> tuple[int, list[int]] | None:
        """What a record says of ``at``: the hash and slots of the last key taken in its pass (None: none)."""
        ...


class Passes:
    """The pass orders of one source's chosen keys, computed as they are needed."""

    def __init__(self, chosen: Chosen, *, seed: int, name: str) -> None:
        self.chosen, self.seed, self.name = chosen, seed, name
        self._orders: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def m(self) -> int:
        """How many keys a pass walks."""
        return self.chosen.m

    def order(self, p: int) -> tuple[np.ndarray, np.ndarray]:
        """Pass ``p``: the chosen keys' columns in its order, and their hashes in that order."""
        if p not in self._orders:
            if len(self._orders) > 4:
                self._orders.clear()
            h = pass_hash(self.chosen.keys, self.seed, self.name, p)
            order = by_hash(h)
            self._orders[p] = (order, h[order])
        return self._orders[p]

    def locate(self, p: int, after: tuple[int, list[int]] | None) -> Position:
        """The position of "pass ``p``, every key up to ``after`` (its hash and slots) taken", in these keys."""
        if after is None:
            return Position(p, 0)
        order, hashes = self.order(p)
        h = np.uint64(after[0])
        index = int(np.searchsorted(hashes, h, side="left"))
        stop = int(np.searchsorted(hashes, h, side="right"))
        key = after[1]
        for i in range(index, stop):  # the same hash: by the key's slots (rare)
            if self.chosen.keys[:, order[i]].tolist() <= key:
                index = i + 1
        return Position(p, index)

    def advance(self, at: Position, n: int) -> Position:
        """The position ``n`` keys on, counting whole passes without computing their orders."""
        return advance(self.m, at, n)

    def take(self, at: Position, n: int) -> tuple[np.ndarray, Position]:
        """The next ``n`` keys from ``at`` (columns of ``chosen.keys``, in order) and the position after them."""
        out = [self.order(p)[0][first:stop] for p, first, stop in segments(self.m, at, n)]
        taken = np.concatenate(out) if out else np.empty(0, dtype=np.int64)
        return taken.astype(np.int64, copy=False), self.advance(at, n)

    def after(self, at: Position) -> tuple[int, list[int]] | None:
        """What a record says of ``at``: the hash and slots of the last key taken in its pass (None: none)."""
        if at.index == 0:
            return None
        order, hashes = self.order(at.pass_)
        return int(hashes[at.index - 1]), self.chosen.keys[:, order[at.index - 1]].tolist()
