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

A record holds its epochs until a person removes it (``pgprefetch forget RUN``): nothing ages it out. A store
shared by several runs has one cron line per run, and a run paused for a week (a holiday, a queue) must find
its next epoch still there; a record that ages out silently would let another run's ``--keep`` delete it.
``pgprefetch ls`` shows each run's records and marks one not updated for :data:`STALE_AFTER` as stale, so
that a run gone for good is seen, and forgotten on purpose.
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pgprefetch.errors import ConfigError, StoreError

_CONSUMER = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,63}")
RANK = "@"  # not allowed in a consumer's name: a rank's record can never be another consumer's
STALE_AFTER = timedelta(days=7)
"""A record not updated for this long is shown as stale by ``ls``; it still holds its epochs."""


def check_name(name: str, option: str = "--consumer") -> str:
    """``name`` if it can name a consumer (it becomes a file name in the store); ConfigError (exit 2) if not.

    Checked once where a name comes in (the command line, a reader's argument), whether or not the store
    has consumers yet, and again where a record is written.
    """
    if not _CONSUMER.fullmatch(name):
        raise ConfigError(
            f"{option} {name!r}: a consumer's name is 1-64 letters, digits, '_', '.' or '-', not starting with '.'"
        )
    return name


def record_name(name: str, rank: int = 0) -> str:
    """The record of consumer ``name``'s rank ``rank``, as a file name without ``.json``."""
    return name if rank == 0 else f"{name}{RANK}{rank}"


def run_of(record: str) -> str:
    """The consumer (training run) a record belongs to: ``train`` for ``train`` and for ``train@1``."""
    return record.partition(RANK)[0]


def consumer_record(name: str, epoch: int, rank: int = 0, world: int = 1) -> bytes:
    """The record of consumer ``name``'s rank ``rank`` opening ``epoch`` (the name checked: it becomes a file name)."""
    if not _CONSUMER.fullmatch(name):
        raise StoreError(f"consumer name {name!r}: use 1-64 letters, digits, '_', '.' or '-', not starting with '.'")
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


def _parsed(raw: bytes) -> dict[str, object] | None:
    """A record's object, or None when it is damaged: not JSON, not an object, or ``epoch``/``world`` not ints."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    epoch, world = value.get("epoch"), value.get("world", 1)
    if type(epoch) is not int or type(world) is not int or world < 1:  # 1e400, true, "3": damaged, not numbers
        return None
    return value


def _known(records: dict[str, bytes]) -> tuple[dict[str, int], list[str]]:
    """The epoch of each record that counts, and the records whose run's position is unknown (damaged).

    A rank's record whose run's rank 0 says the run has fewer ranks does not count (a later run of the
    same name runs on fewer), nor does one from before ranks recorded their world. A record that cannot be
    read says nothing of where its run is, so it is not ignored: :func:`damaged` names it, and ``--keep``
    deletes nothing while it stays (an ignored record would let another run's cron delete its epochs).
    So is a rank's record whose run's rank 0 is damaged or gone: which ranks the run has is unknown.
    """
    parsed = {name: _parsed(raw) for name, raw in records.items()}
    out: dict[str, int] = {}
    unknown: list[str] = []
    for name, value in parsed.items():
        run, _, rank = name.partition(RANK)
        if value is None:
            unknown.append(name)
            continue
        if rank:
            head = parsed.get(run)
            if not rank.isdigit() or head is None:
                unknown.append(name)
                continue
            world = head.get("world", 1)
            if "world" not in head or not isinstance(world, int) or int(rank) >= world:
                continue  # a rank the run no longer has
        epoch = value["epoch"]
        assert isinstance(epoch, int)  # checked by _parsed
        out[name] = epoch
    return out, sorted(unknown)


def positions(records: dict[str, bytes]) -> dict[str, int]:
    """The epoch of each record that counts, by record name (``train``, ``train@1``), from the records' bytes.

    Damaged records are not here: :func:`damaged` names them.
    """
    return _known(records)[0]


def damaged(records: dict[str, bytes]) -> list[str]:
    """The records that say nothing readable of where their run is (see :func:`_known`), by name."""
    return _known(records)[1]


@dataclass(frozen=True)
class ConsumerInfo:
    """One record as ``ls`` shows it: a run's rank, the epoch it opened last, when and where."""

    run: str
    rank: int
    epoch: int | None  # None: the record is damaged, and holds every epoch until it is rewritten or forgotten
    updated: datetime | None
    host: str
    counts: bool  # False: a rank the run no longer has

    def stale(self, now: datetime) -> bool:
        """Not updated for :data:`STALE_AFTER`: perhaps a run gone for good (``pgprefetch forget`` removes it)."""
        return self.updated is None or now - self.updated > STALE_AFTER

    def to_json(self, now: datetime) -> dict[str, object]:
        """The object ``ls --json`` prints for the record."""
        return {"consumer": self.run, "rank": self.rank, "epoch": self.epoch, "counts": self.counts,
                "updated": self.updated.isoformat() if self.updated else None, "host": self.host,
                "stale": self.stale(now)}  # fmt: skip


def infos(records: dict[str, bytes]) -> list[ConsumerInfo]:
    """Every record, counted or not, by run then rank."""
    counted, unknown = _known(records)
    out = []
    for name, raw in records.items():
        run, _, rank = name.partition(RANK)
        value = _parsed(raw) or {}
        out.append(
            ConsumerInfo(
                run,
                int(rank) if rank.isdigit() else 0,
                counted.get(name) if name not in unknown else None,
                _when(value.get("updated")),
                str(value.get("host", ""))[:255],
                name in counted or name in unknown,
            )
        )
    return sorted(out, key=lambda i: (i.run, i.rank))


def _when(value: object) -> datetime | None:
    """A record's ``updated`` time (UTC if it names no zone), or None when it is missing or not a time."""
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
