"""What a bench report says about where it ran: the processor, the code's revision, ratios as printed."""

from __future__ import annotations

import os
import platform
import subprocess


def times(x: float) -> str:
    """A ratio as the reports print it: ``0.87x``, ``12.3x``."""
    return f"{x:.2f}x" if x < 10 else f"{x:.1f}x"


def cpu_model() -> str:
    """The processor's model name, as the reports head their figures with it."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def code_revision() -> str:
    """pgprefetch's version and the checkout's commit (``+dirty`` with uncommitted changes to the code run)."""
    from pgprefetch import __version__

    here = os.path.dirname(os.path.abspath(__file__))
    code = ["../pgprefetch", ".", ":(exclude)RESULTS.md"]  # the package and the bench, not this report
    try:
        sha = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--", *code], capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return __version__
    return f"{__version__}, commit {sha}{'+dirty' if dirty else ''}"
