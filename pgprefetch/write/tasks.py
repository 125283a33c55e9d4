"""Running the dump's work on the event loop and its threads, so that nothing is left running behind it.

Two rules the dump relies on: a group of tasks fails as a whole, at its first error, with the others
cancelled and awaited (:func:`first_error`); and work handed to a thread is waited for even when the dump
is cancelled (:func:`finish_in_thread`), so nothing outlives the epoch's lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any


async def first_error(coros: Iterable[Awaitable[None]]) -> None:
    """Run ``coros`` concurrently; on the first failure cancel the rest and raise it (no ExceptionGroup)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for t in done:
        if not t.cancelled() and (error := t.exception()) is not None:
            raise error


async def finish_in_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``fn`` on a thread and wait for it even if cancelled (Ctrl-C).

    So it cannot outlive the epoch's lock: a publish or a resume check half done by a thread nobody waits
    for could race the next dump.
    """
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise
