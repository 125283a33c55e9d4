"""Free heap memory handed back to the system between the phases of a dump bounded by ``[source] memory``.

The dump keeps freed blocks in its heap for reuse: :func:`pgprefetch.cli.console.tune_for_dumping` raises
glibc's mapping threshold to 32 MiB and its trimming threshold to 128 MiB, and every thread that allocates
gets an arena of its own. Between batches that saves faulting pages in again; across the passes of a
table larger than the budget it let the peak RSS climb pass after pass, every arena keeping its high-water
mark, although the memory in use did not grow. :func:`release` trims every arena once a phase is over.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release() -> None:
    """Return the free memory of every heap arena to the system (glibc's ``malloc_trim``; elsewhere nothing)."""
    trim = _trim()
    if trim is not None:
        trim(0)
