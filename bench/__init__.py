"""The benchmark ``make bench`` runs: blog post vs. COPY ceiling vs. ``pgprefetch dump``, as ratios."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any


def log(message: str, tag: str = "bench") -> None:
    """One progress line on stderr, timed: ``[bench 12:34:56] message``."""
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def stop_child(p: subprocess.Popen[Any], timeout: float) -> None:
    """Stop a helper process that exits when its stdin closes (the proxy, moto); kill it if it does not."""
    if p.stdin:
        p.stdin.close()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
