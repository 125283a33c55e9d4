"""The benchmark ``make bench`` runs: blog post vs. COPY ceiling vs. ``pgprefetch dump``, as ratios."""

from __future__ import annotations

import subprocess
from typing import Any


def stop_child(p: subprocess.Popen[Any], timeout: float) -> None:
    """Stop a helper process that exits when its stdin closes (the proxy, moto); kill it if it does not."""
    if p.stdin:
        p.stdin.close()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
