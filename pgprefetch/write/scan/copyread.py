"""The one COPY stream every scan read uses: page ranges on one snapshot, decoded a drain at a time.

Each range's binary COPY feeds its own :class:`~.copystream.CopyDecoder`; enough bytes gathered are decoded
on a thread (the event loop keeps the other COPYs streaming), and each decoded chunk is handed on: to a
partition's files (``route``), to a keys collector (``take``, one call at a time, on a thread), or kept in
the decoder's parts for the caller to assemble. ``check`` runs on the loop after every chunk and may stop
the read by raising (a table outgrowing the budget).

One failure policy: the first error (a lost connection, a full disk, ``check``'s) is the read's; the other
COPYs stop at their next chunk from their own sink, never cancelled while their rows stream (a COPY
cancelled mid-stream can leave asyncpg a result with no waiter, logged as a traceback). A lost connection
is a transient :class:`~pgprefetch.errors.SourceError`, which the dump retries as a whole epoch.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from pgprefetch.config.model import SourceConfig
from pgprefetch.errors import PgprefetchError
from pgprefetch.pg.session import BatchReader
from pgprefetch.write.scan.copystream import Columns, CopyDecoder
from pgprefetch.write.scan.shape import ScanShape, copy_select, vocabularies


class _Stopped(PgprefetchError):
    """A COPY stopped because another one failed."""


async def copy_ranges(
    source: SourceConfig,
    snapshot: str,
    shape: ScanShape,
    ranges: list[str],
    decoders: list[CopyDecoder],
    *,
    take: Callable[[list[Columns]], None] | None = None,
    check: Callable[[], Callable[[], None] | None] | None = None,
) -> None:
    """COPY each of ``ranges`` (a ``WHERE`` clause each) of ``shape`` on ``snapshot`` into its decoder.

    ``take``: each drain's decoded parts are handed to it (on a thread, one call at a time) and not kept.
    ``check``: called on the loop after every chunk; what it raises stops the read and is raised, and what it
    returns (work too long for the loop: handing a read over to disk) is run on a thread before the next chunk.
    The decoders are finished (trailer checked, the rest decoded) before this returns.
    """
    failed: list[BaseException] = []
    lock = threading.Lock()

    def hand(parts: list[Columns]) -> None:
        if take is not None and parts:
            with lock:
                take(parts)

    def sink(decoder: CopyDecoder) -> Callable[[bytes], Any]:
        async def fed(data: bytes) -> None:
            if failed:
                raise _Stopped("another COPY of the read failed")
            if decoder.feed(data):  # decoded on a thread: the event loop keeps the other COPYs streaming
                await asyncio.to_thread(decoder.drain)
                if take is not None:
                    parts, decoder.parts = decoder.parts, []
                    await asyncio.to_thread(hand, parts)
            if check is not None and (work := check()) is not None:
                await asyncio.to_thread(work)

        return fed

    async def copy(workers: BatchReader, decoder: CopyDecoder, where: str) -> None:
        try:
            await workers.copy(f"reading {shape.relation}", copy_select(shape, where), sink(decoder))
        except _Stopped:
            pass
        except BaseException as e:
            failed.append(e)
            raise

    async with BatchReader.open(source, snapshot, None, vocabularies=vocabularies(shape)) as workers:
        await asyncio.gather(
            *(copy(workers, d, where) for d, where in zip(decoders, ranges, strict=True)), return_exceptions=True
        )
    if failed:
        raise failed[0]
    for d in decoders:
        rest = await asyncio.to_thread(d.finish)
        if take is not None:
            d.parts = []
            await asyncio.to_thread(hand, rest)


def key_chunk(parts: list[Columns], width: int, offset: int) -> list[np.ndarray]:
    """The key and order columns of ``parts`` as ``(width, m)`` int64 chunks, the order shifted by ``offset``."""
    chunks = []
    for p in parts:
        m = p["k0"].size
        if not m:
            continue
        chunk = np.empty((width, m), dtype=np.int64)
        for i in range(width):
            chunk[i] = p[f"k{i}"]
        if offset:
            chunk[-1] += offset
        chunks.append(chunk)
    return chunks
