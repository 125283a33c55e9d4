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


def fit(budget: int) -> None:
    """Cap the freed memory the heap keeps at a share of ``budget`` (:func:`pgprefetch.write.memory.policy.heap_bytes`).

    :func:`pgprefetch.cli.console.tune_for_dumping` keeps up to 128 MiB per arena for speed, and a thread
    that allocates gets an arena of its own: under a 64 MiB budget that alone could double the peak. Two
    arenas, and thresholds of the budget's size (a 512 MiB budget keeps the 8 MiB blocks of its batches).
    Not glibc: nothing.
    """
    from pgprefetch.write.memory.policy import mmap_threshold, trim_threshold

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold, m_arena_max = -1, -3, -8
    libc.mallopt(m_arena_max, 2)
    if libc.mallopt(m_mmap_threshold, mmap_threshold(budget)) == 1:
        libc.mallopt(m_trim_threshold, trim_threshold(budget))


def peak_rss() -> int:
    """This process's peak resident memory so far, in bytes (``VmHWM``; ``ru_maxrss`` where there is none)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # bytes on macOS, KiB elsewhere
