"""The in-process contenders: the blog post's query per sample, and two binary-COPY ceilings.

*Row ceiling*: the per-sample query joined to the batch's keys, one row per tuple, as ``COPY``.
*Statement ceiling*: the dump's own batch statement (:func:`pgprefetch.pg.statement.batch_statement`, per-sample
aggregated binary arrays) as ``COPY``, its bind parameters pasted in as literals (COPY takes none). Both send
every batch of the dump's epoch, in its order, and throw the bytes away: what is left between the statement
ceiling and the dump is the client's work (decoding, checks, writing) and the dump's own start-up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import asyncpg
import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.pg.session import Snapshot
from pgprefetch.sqltext import replace_params
from pgprefetch.write.query import plan_epoch

from .datasets import EPOCH, Dataset


@dataclass(frozen=True)
class Run:
    """Samples read in ``seconds``."""

    samples: int
    seconds: float

    @property
    def rate(self) -> float:
        """Samples per second."""
        return self.samples / self.seconds if self.seconds else 0.0


async def blog(dsn: str, ds: Dataset, *, connections: int, budget_s: float) -> Run:
    """The blog post's loop, stopped after the first batch that ends past ``budget_s`` seconds.

    Start points stream from ``TABLESAMPLE SYSTEM (100)`` through an asyncpg cursor (default prefetch) in a
    transaction; each batch of them is ``asyncio.gather``-ed over a pool of ``connections`` connections, one
    query per sample with the values pasted into its text, and the records turned into numpy arrays. The
    cursor has a connection of its own, so all ``connections`` pool connections serve samples. Pool and
    cursor connections are opened before the clock starts (their set-up is not timed).

    Per sample, asyncpg 0.32 makes four round trips (counted with a message-counting proxy): Parse and
    Describe of the new SQL text (every text is unique, so its statement cache never hits); from a
    connection's 101st sample on, Close of the statement its 100-entry cache evicted; Bind and Execute;
    and, on release to the pool, ``SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL;``.
    The rate is measured on the samples read within the budget (``Run.samples``), not on the whole epoch.
    """
    pool = await asyncpg.create_pool(dsn, min_size=connections, max_size=connections)
    con = await asyncpg.connect(dsn)

    async def get_sample(record: asyncpg.Record) -> np.ndarray:
        async with pool.acquire() as c:
            rows = await c.fetch(ds.blog_query(record))
        return ds.blog_array(rows)

    samples = 0
    try:
        started = time.perf_counter()
        async with con.transaction():
            batch: list[asyncpg.Record] = []
            async for record in con.cursor(ds.blog_keys):
                batch.append(record)
                if len(batch) == ds.batch_size:
                    arrays = await asyncio.gather(*map(get_sample, batch))
                    np.stack(arrays)  # the batch the training loop would get
                    samples += len(batch)
                    batch = []
                    if time.perf_counter() - started > budget_s:
                        break
        seconds = time.perf_counter() - started
    finally:
        await con.close()
        await pool.close()
    return Run(samples, seconds)


async def ceiling(dsn: str, ds: Dataset, keys: np.ndarray, *, connections: int) -> Run:
    """Every batch of ``keys`` as one binary ``COPY (query) TO STDOUT``, bytes discarded, ``connections`` in flight.

    One row per tuple (the per-sample query joined to the batch's keys). The same batches as the dump
    (``keys`` is its epoch order), with the same session settings as its workers.
    """
    return await _copy_batches(dsn, keys, ds.batch_size, ds.copy_statement, connections=connections)


async def statement_ceiling(cfg: Config, *, connections: int) -> tuple[Run, np.ndarray]:
    """The dump's own batch statement for every batch, as binary ``COPY (statement) TO STDOUT``, bytes discarded.

    The statement and the epoch's keys come from pgprefetch's planning (:func:`pgprefetch.write.query.plan_epoch`,
    outside the clock), so they are the dump's; the key arrays it binds as parameters are pasted in as
    ``'{...}'::int8[]`` literals, because COPY takes no parameters (so each batch is planned afresh, where the
    dump's prepared statement may reuse a plan). Returns the run and the keys it sent, ``(n_key_columns, n)``.
    """
    async with Snapshot.open(cfg.source) as snap:
        plan = await plan_epoch(cfg, snap, EPOCH)
    if plan.params:
        raise NotImplementedError("the statement ceiling pastes key arrays only: no category lists")
    keys = np.ascontiguousarray(plan.keys[:, : plan.used])

    def statement(batch: np.ndarray) -> str:
        return replace_params(plan.sql, lambda n: "'{" + ",".join(map(str, batch[n - 1].tolist())) + "}'")

    run = await _copy_batches(cfg.source.dsn, keys, cfg.batches.size, statement, connections=connections)
    return run, keys


async def _copy_batches(
    dsn: str | None, keys: np.ndarray, size: int, statement: Callable[[np.ndarray], str], *, connections: int
) -> Run:
    """``COPY (statement(batch's keys)) TO STDOUT`` (binary) per batch, ``connections`` in flight, bytes discarded."""
    nb = -(-keys.shape[1] // size)
    conns = await asyncio.gather(
        *(asyncpg.connect(dsn, server_settings={"max_parallel_workers_per_gather": "0"}) for _ in range(connections))
    )
    todo = iter(range(nb))

    async def sink(data: bytes) -> None:
        pass

    async def worker(con: asyncpg.Connection) -> None:
        for b in todo:
            sql = statement(keys[:, b * size : (b + 1) * size])
            await con.copy_from_query(sql, output=sink, format="binary")

    try:
        started = time.perf_counter()
        await asyncio.gather(*map(worker, conns))
        seconds = time.perf_counter() - started
    finally:
        await asyncio.gather(*(c.close() for c in conns), return_exceptions=True)
    return Run(keys.shape[1], seconds)


async def round_trip_ms(dsn: str, n: int = 200) -> float:
    """Median milliseconds of a prepared ``SELECT 1`` round trip."""
    con = await asyncpg.connect(dsn)
    try:
        stmt = await con.prepare("SELECT 1")
        times = []
        for _ in range(n):
            t = time.perf_counter()
            await stmt.fetchval()
            times.append(time.perf_counter() - t)
    finally:
        await con.close()
    return float(np.median(times) * 1e3)
