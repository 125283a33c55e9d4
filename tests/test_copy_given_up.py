"""A COPY given up midway (its sink raised: a read outgrew ``--memory``) drops its connection at once.

The stream still runs on the server, so the connection cannot serve another call, and closing it politely
would wait up to ``io_timeout`` for a stream's end that nobody reads: a check or a dump that gives up a read
of a table beyond its budget must go on at once, not after the timeout.
"""

from __future__ import annotations

import asyncio

import pytest

from pgprefetch.config.model import SourceConfig
from pgprefetch.pg.session import BatchReader, Snapshot
from pgprefetch.write.scan.table import TableTooLarge

from .harness.db import execute


async def give_up_a_copy(dsn: str) -> bool:
    """COPY a large table and raise from the first chunk: (the connection closed, seconds to close the reader)."""
    # An hour: a close that waited for it would outlast the test's own timeout (pytest-timeout), a failure.
    source = SourceConfig(dsn=dsn, connections=1, io_timeout_ms=3_600_000)
    async with Snapshot.open(source) as snap:
        reader_cm = BatchReader.open(source, snap.id, None)
        reader = await reader_cm.__aenter__()

        async def sink(data: bytes) -> None:
            raise TableTooLarge(8.0, 1)  # as a read's budget check raises it

        with pytest.raises(TableTooLarge):
            await reader.copy("reading big", "SELECT * FROM big", sink)
        conn, _ = await reader._idle.get()
        closed = conn.is_closed()
        reader._idle.put_nowait((conn, _))
        await reader_cm.__aexit__(None, None, None)
        return closed


def test_a_copy_whose_sink_raised_drops_its_connection_and_the_reader_closes_at_once(db: str) -> None:
    execute(db, "CREATE TABLE big AS SELECT i, repeat('x', 100) AS pad FROM generate_series(1, 300000) i")
    closed = asyncio.run(give_up_a_copy(db))  # returns: the reader did not wait for the stream's io_timeout
    assert closed, "the connection of a COPY given up midway was kept for another call"
