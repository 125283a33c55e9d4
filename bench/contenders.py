"""The two in-process contenders: the blog post's query per sample, and the binary-COPY ceiling."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import asyncpg
import numpy as np

from .datasets import Dataset


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
    cursor connections are opened before the clock starts.
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

    The same batches as the dump (``keys`` is its epoch order), with the same session settings as its workers.
    """
    size = ds.batch_size
    nb = -(-keys.shape[1] // size)
    conns = await asyncio.gather(
        *(asyncpg.connect(dsn, server_settings={"max_parallel_workers_per_gather": "0"}) for _ in range(connections))
    )
    todo = iter(range(nb))

    async def sink(data: bytes) -> None:
        pass

    async def worker(con: asyncpg.Connection) -> None:
        for b in todo:
            sql = ds.copy_statement(keys[:, b * size : (b + 1) * size])
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
