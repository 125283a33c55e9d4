"""The dump's memory pool: ``--memory`` as named reservations, each large allocation holding one while it lives.

A user sets ``--memory`` beside a container's limit, so it is the process's memory, and every allocation
that grows with the data (keys, a table read whole, a stretch, a partition's held rows, the COPYs'
undecoded bytes, a group of windows, the writer's buffers, the heap's kept memory) takes a named
:class:`Reservation` from the one :class:`MemoryPool` of the dump. How much each may ask for is the
policy's (:mod:`.policy`); the pool keeps the live total and who holds it.

Checked (the tests, ``--debug``, ``PGPREFETCH_CHECK_MEMORY=1``): a reservation that would take the live
total past the budget is an error naming every holder and its bytes, where the over-commit happened rather
than in a peak measured afterwards. Unchecked (a user's dump), the pool only counts: the sizes were chosen
to fit, and a dump is not failed for a estimate a few bytes off. A pool of budget 0 is unbounded (no
``--memory``), and still names its holders.

The dump's pool is the current one (:func:`current`), set for the dump by :func:`using`: a context
variable, so the tasks and the threads started with ``asyncio.to_thread`` see it; an object that takes
reservations from its own threads asks for the pool when it is made.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Iterator

MIB = 1 << 20
CHECK_VARIABLE = "PGPREFETCH_CHECK_MEMORY"


class MemoryExceeded(AssertionError):
    """A reservation would take the pool past its budget (raised only when the pool is checked)."""


class MemoryPool:
    """``budget`` bytes (0: unbounded) shared out as named reservations; ``checked``: refuse an over-commit."""

    def __init__(self, budget: int, *, checked: bool | None = None) -> None:
        self.budget = budget
        self.checked = os.environ.get(CHECK_VARIABLE) == "1" if checked is None else checked
        self.held = 0
        self.peak = 0
        self._holders: dict[int, Reservation] = {}
        self._lock = threading.Lock()

    def reserve(self, name: str, nbytes: int = 0) -> Reservation:
        """A new reservation named ``name`` (what holds it: ``"keys"``, ``"stretch"``), of ``nbytes``."""
        reservation = Reservation(self, name)
        if nbytes:
            reservation.grow(nbytes)
        return reservation

    def holders(self) -> list[tuple[str, int]]:
        """Every live reservation's name and bytes, the largest first."""
        with self._lock:
            found = [(r.name, r.size) for r in self._holders.values() if r.size]
        return sorted(found, key=lambda holder: -holder[1])

    def describe(self) -> str:
        """The holders, for a message: ``keys 12.0 MiB, writer 6.0 MiB``."""
        return ", ".join(f"{name} {size / MIB:.1f} MiB" for name, size in self.holders()) or "nothing"

    def _change(self, reservation: Reservation, delta: int) -> None:
        with self._lock:
            delta = max(delta, -reservation.size)  # a shrink past what is held frees it, once
            total = self.held + delta
            if delta > 0 and self.checked and self.budget and total > self.budget:
                holders = ", ".join(f"{r.name} {r.size / MIB:.1f} MiB" for r in self._holders.values() if r.size)
                raise MemoryExceeded(
                    f"{reservation.name} asked for {delta / MIB:.1f} MiB more: the pool's {self.budget / MIB:.1f} "
                    f"MiB would be exceeded by {(total - self.budget) / MIB:.1f} MiB (held: {holders or 'nothing'})"
                )
            self.held = total
            self.peak = max(self.peak, total)
            reservation.size += delta
            if reservation.size:
                self._holders[id(reservation)] = reservation
            else:
                self._holders.pop(id(reservation), None)

    def __repr__(self) -> str:
        return f"MemoryPool(budget={self.budget}, held={self.held}, peak={self.peak})"


class Reservation:
    """A named share of the pool: grown, shrunk and freed by its holder (a context manager frees it on exit)."""

    def __init__(self, pool: MemoryPool, name: str) -> None:
        self.pool, self.name, self.size = pool, name, 0

    def grow(self, nbytes: int) -> None:
        """Hold ``nbytes`` more (checked pools: :class:`MemoryExceeded` past the budget)."""
        if nbytes > 0:
            self.pool._change(self, nbytes)

    def shrink(self, nbytes: int) -> None:
        """Hold ``nbytes`` less (at most what is held)."""
        if nbytes > 0:
            self.pool._change(self, -nbytes)

    def resize(self, nbytes: int) -> None:
        """Hold exactly ``nbytes``."""
        if nbytes > self.size:
            self.grow(nbytes - self.size)
        else:
            self.shrink(self.size - nbytes)

    def free(self) -> None:
        """Hold nothing (the allocation is gone)."""
        self.shrink(1 << 62)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, *_: object) -> None:
        self.free()

    def __repr__(self) -> str:
        return f"Reservation({self.name!r}, {self.size})"


_CURRENT: contextvars.ContextVar[MemoryPool | None] = contextvars.ContextVar("pgprefetch_memory_pool", default=None)


def current() -> MemoryPool:
    """The pool of the dump running here (an unbounded, unchecked one outside a dump: a test of a part)."""
    pool = _CURRENT.get()
    return pool if pool is not None else MemoryPool(0, checked=False)


@contextlib.contextmanager
def using(pool: MemoryPool) -> Iterator[MemoryPool]:
    """Make ``pool`` the current one for the block (a dump's epoch)."""
    token = _CURRENT.set(pool)
    try:
        yield pool
    finally:
        _CURRENT.reset(token)
