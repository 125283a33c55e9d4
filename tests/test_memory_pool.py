"""The memory pool (#52): named reservations that grow, shrink and free, and a checked pool that names its holders."""

from __future__ import annotations

import asyncio
import threading

import pytest

from pgprefetch.write import memory
from pgprefetch.write.memory.policy import LEAST_BUDGET, MIB, Policy, heap_bytes


def test_reservations_add_up_and_free_on_exit() -> None:
    pool = memory.MemoryPool(10 * MIB, checked=True)
    a = pool.reserve("keys", 3 * MIB)
    with pool.reserve("stretch", 5 * MIB) as b:
        assert pool.held == 8 * MIB
        b.shrink(1 * MIB)
        assert pool.holders() == [("stretch", 4 * MIB), ("keys", 3 * MIB)]
    assert pool.held == 3 * MIB  # freed on leaving the block
    a.resize(1 * MIB)
    assert pool.held == 1 * MIB
    assert pool.peak == 8 * MIB
    a.free()
    assert pool.held == 0
    assert pool.holders() == []


def test_a_checked_pool_refuses_an_over_commit_naming_every_holder() -> None:
    pool = memory.MemoryPool(16 * MIB, checked=True)
    pool.reserve("heap", 2 * MIB)
    pool.reserve("pass", 5 * MIB)
    keys = pool.reserve("keys", 1 * MIB)
    with pytest.raises(memory.MemoryExceeded) as e:
        keys.grow(9 * MIB)
    assert str(e.value) == (
        "keys asked for 9.0 MiB more: the pool's 16.0 MiB would be exceeded by 1.0 MiB "
        "(held: heap 2.0 MiB, pass 5.0 MiB, keys 1.0 MiB)"
    )
    assert pool.held == 8 * MIB  # the refused growth was not counted


def test_an_unchecked_pool_counts_past_its_budget_and_an_unbounded_one_never_refuses() -> None:
    loose = memory.MemoryPool(MIB, checked=False)
    loose.reserve("writer", 3 * MIB)
    assert loose.held == 3 * MIB
    assert loose.peak == 3 * MIB
    unbounded = memory.MemoryPool(0, checked=True)
    unbounded.reserve("table", 1 << 40)
    assert unbounded.describe() == "table 1048576.0 MiB"


def test_the_checked_pool_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(memory.pool.CHECK_VARIABLE, "1")
    assert memory.MemoryPool(MIB).checked
    monkeypatch.setenv(memory.pool.CHECK_VARIABLE, "0")
    assert not memory.MemoryPool(MIB).checked


def test_the_current_pool_reaches_tasks_and_threads_of_the_dump() -> None:
    pool = memory.MemoryPool(64 * MIB, checked=True)
    seen: list[memory.MemoryPool] = []

    async def dump() -> None:
        seen.append(memory.current())
        await asyncio.to_thread(lambda: seen.append(memory.current()))

    with memory.using(pool):
        asyncio.run(dump())
    assert seen == [pool, pool]
    assert memory.current() is not pool  # outside the dump: a pool of its own, unbounded


def test_reservations_from_many_threads_keep_an_exact_total() -> None:
    pool = memory.MemoryPool(0)

    def churn() -> None:
        r = pool.reserve("gather")
        for _ in range(2000):
            r.grow(3)
            r.shrink(1)
        r.free()

    threads = [threading.Thread(target=churn) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.held == 0
    assert pool.peak > 0


@pytest.mark.parametrize("budget", [LEAST_BUDGET, 32 * MIB, 64 * MIB, 256 * MIB, 4096 * MIB])
def test_the_policys_shares_of_one_phase_fit_the_budget(budget: int) -> None:
    """What may be held at once, phase by phase (policy.py's list), adds up within the budget."""
    p = Policy.for_scan(budget)
    heap = heap_bytes(budget)
    assert heap + p.writer + p.data <= budget or p.data == budget // 4
    assert heap + p.writer + p.keys_bytes(beside_rows=False) <= max(budget, heap + p.writer + budget // 4)
    # Reading into a partition: the keys' half, the held rows twice, the COPYs' drains (8 connections).
    reading = (
        p.keys_bytes(beside_rows=True) + 2 * p.partition_hold_bytes() + 8 * p.copy_drain_bytes(8, into_partition=True)
    )
    assert heap + reading <= budget
    assert heap + p.cutting_bytes() <= budget
