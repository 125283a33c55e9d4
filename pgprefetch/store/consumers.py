"""Consumer records: the epoch each training run (consumer) opened last, one small JSON file a consumer.

``dump --ahead`` and ``prune`` decide from them; each backend stores them its own way
(``<store>/.pgprefetch/consumers/<name>.json``), and this module says what one holds.
"""

from __future__ import annotations

import json
import os
import re
import socket
from datetime import UTC, datetime

from pgprefetch.errors import StoreError

_CONSUMER = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def consumer_record(name: str, epoch: int) -> bytes:
    """The record of consumer ``name`` opening ``epoch`` (the name checked: it becomes a file name)."""
    if not _CONSUMER.match(name):
        raise StoreError(f"consumer name {name!r}: use 1-64 letters, digits, '_', '.' or '-'")
    record = {
        "consumer": name,
        "epoch": epoch,
        "updated": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    return (json.dumps(record) + "\n").encode()


def consumer_epoch(raw: bytes) -> int | None:
    """The epoch of a consumer record; None for one damaged (the next open rewrites it)."""
    try:
        return int(json.loads(raw)["epoch"])
    except (ValueError, KeyError, TypeError):
        return None
