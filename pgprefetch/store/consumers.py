"""Consumer records: where each training run is, rank by rank, which ``dump --ahead`` and ``--keep`` go by.

A run's ranks read their shares of each epoch on their own. Under gradient synchronisation (DDP) they move
together, but ranks without it (an Indexed Job of readers, inference), or a rank restarted alone from its
checkpoint, drift apart by epochs. One record for the whole run, written by rank 0 alone, then says where
the furthest rank is, and ``--keep`` deletes the epochs a slower rank has yet to read: in the soak a rank
restarted into an epoch that was gone, and waited for it for the rest of the run. So every rank records
the epoch it opened: rank 0 as ``<name>.json`` (the run's one record before), rank ``r`` as ``<name>@r.json``.
``--ahead`` dumps after the furthest rank, ``--keep`` keeps what the slowest still reads.

Rank 0's record also holds the world size, so the records of ranks that a later run of the same name no
longer has (it runs on fewer) do not hold the store back.
"""

from __future__ import annotations

import json
import os
import re
import socket
from datetime import UTC, datetime

from pgprefetch.errors import StoreError

_CONSUMER = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
RANK = "@"  # not allowed in a consumer's name: a rank's record can never be another consumer's


def record_name(name: str, rank: int = 0) -> str:
    """The record of consumer ``name``'s rank ``rank``, as a file name without ``.json``."""
    return name if rank == 0 else f"{name}{RANK}{rank}"


def run_of(record: str) -> str:
    """The consumer (training run) a record belongs to: ``train`` for ``train`` and for ``train@1``."""
    return record.partition(RANK)[0]


def consumer_record(name: str, epoch: int, rank: int = 0, world: int = 1) -> bytes:
    """The record of consumer ``name``'s rank ``rank`` opening ``epoch`` (the name checked: it becomes a file name)."""
    if not _CONSUMER.match(name):
        raise StoreError(f"consumer name {name!r}: use 1-64 letters, digits, '_', '.' or '-'")
    record = {
        "consumer": name,
        "epoch": epoch,
        "updated": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }
    if rank:
        record["rank"] = rank
    else:
        record["world"] = world
    return (json.dumps(record) + "\n").encode()


def positions(records: dict[str, bytes]) -> dict[str, int]:
    """The epoch of each record that counts, by record name (``train``, ``train@1``), from the records' bytes.

    A damaged record counts nothing (the next open rewrites it); so does a rank's record whose run's rank 0
    says the run has fewer ranks (or says nothing of them: a pgprefetch from before ranks recorded).
    """
    parsed = {}
    for name, raw in records.items():
        try:
            value = json.loads(raw)
            parsed[name] = (int(value["epoch"]), int(value.get("world", 1)))
        except (ValueError, KeyError, TypeError):
            continue
    out = {}
    for name, (epoch, _) in parsed.items():
        run, _, rank = name.partition(RANK)
        if rank and not (rank.isdigit() and run in parsed and int(rank) < parsed[run][1]):
            continue
        out[name] = epoch
    return out
