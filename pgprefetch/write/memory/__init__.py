"""``--memory`` as one pool of named reservations, sized by one policy.

- :mod:`.pool`: :class:`~.pool.MemoryPool`, the budget, and the :class:`~.pool.Reservation` every large
  allocation of a dump holds while it lives (DataFusion's habit: a named consumer grows, shrinks and frees
  its reservation; in the tests and under ``--debug`` a reservation past the budget is an error naming the
  holders).
- :mod:`.policy`: :class:`~.policy.Policy`, who may hold what, when: the sizing rules of every phase.
- :mod:`.heap`: the heap's kept memory fitted to the budget, and given back between phases.
"""

from pgprefetch.write.memory.pool import MemoryExceeded, MemoryPool, Reservation, current, using

__all__ = ["MemoryExceeded", "MemoryPool", "Reservation", "current", "using"]
