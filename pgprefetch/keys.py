"""Sample keys: integer, ``uuid``, ``date`` and timestamp key columns, all carried as int64 "slots".

The shuffle, the batch statement's bind parameters and the store's ``keys`` array all work on one int64
array, ``(n_slots, n)``. An integer key column takes one slot. A ``uuid`` column takes two: its 16 bytes
as two big-endian signed int64 (high half, low half), so the shuffle stays a pure function of the keys
and the keys still travel as ``int8[]`` arrays, with no per-key Python object on the hot path. The
server converts both ways: :meth:`KeyColumns.slot_sql` when the keys are read, :meth:`KeyColumns.value_sql`
when the per-sample query gets its ``$n`` back.

A ``date`` column takes one slot, its days since 1970-01-01; a ``timestamp`` or ``timestamptz`` column its
microseconds since 1970-01-01 (UTC for ``timestamptz``). Those are the values scan mode gives a window's
``order`` column, so a date-ordered scan config and its query-mode twin shuffle the same slots into the
same epoch, and :meth:`KeyColumns.values` hands them back as ``datetime.date`` / ``datetime.datetime``,
as the database has them.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import SupportsInt, TypeAlias

import numpy as np
import numpy.typing as npt

INTEGER_TYPES = ("int2", "int4", "int8")
UUID_TYPE = "uuid"
TIME_TYPES = ("date", "timestamp", "timestamptz")  # one slot: days, or microseconds, since 1970-01-01
_LOW = (1 << 64) - 1
Slots: TypeAlias = Sequence[SupportsInt] | npt.NDArray[np.integer]
"""One key's slots: a column of the ``keys`` array (int64), or a list of ints."""
_EPOCH_DAY = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# A slot back to its SQL value, and to its Python value (days, or microseconds, since 1970-01-01).
_TIME_SQL = {
    "date": ("({} - date '1970-01-01')::int8", "(date '1970-01-01' + {}::int4)"),
    "timestamp": (
        "(extract(epoch from {}) * 1000000)::int8",
        "(timestamp '1970-01-01' + {} * interval '1 microsecond')",
    ),
    "timestamptz": (
        "(extract(epoch from {}) * 1000000)::int8",
        "(timestamptz '1970-01-01 00:00:00+00' + {} * interval '1 microsecond')",
    ),
}


KeyValue = int | uuid.UUID | dt.date | dt.datetime


@dataclass(frozen=True)
class KeyColumns:
    """The key columns, in order, which of them are ``uuid``, and which are dates or timestamps.

    ``times`` holds, per column, ``"date"``, ``"timestamp"``, ``"timestamptz"`` or ``""`` (not a time).
    """

    names: tuple[str, ...]
    uuids: tuple[bool, ...] = ()
    times: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.uuids:
            object.__setattr__(self, "uuids", (False,) * len(self.names))
        if not self.times:
            object.__setattr__(self, "times", ("",) * len(self.names))

    @classmethod
    def of_types(cls, names: Sequence[str], types: Sequence[str]) -> KeyColumns:
        """Key columns from their PostgreSQL type names (``int4``, ``uuid``, ``date``, ...) or manifest types."""
        return cls(
            tuple(names), tuple(t == UUID_TYPE for t in types), tuple(t if t in TIME_TYPES else "" for t in types)
        )

    @property
    def types(self) -> tuple[str, ...]:
        """Each column's kind, as the manifest records it: ``int``, ``uuid``, ``date``, ``timestamp(tz)``."""
        return tuple("uuid" if u else (t or "int") for u, t in zip(self.uuids, self.times, strict=True))

    @property
    def converted(self) -> bool:
        """Whether any column is not an integer: the keys query's values are turned into slots by the server."""
        return any(self.uuids) or any(self.times)

    @property
    def width(self) -> int:
        """Slots in the ``keys`` array: one per integer column, two per uuid."""
        return len(self.names) + sum(self.uuids)

    def column_of_slot(self, slot: int) -> str:
        """The name of the column slot ``slot`` belongs to."""
        for name, is_uuid in zip(self.names, self.uuids, strict=True):
            span = 2 if is_uuid else 1
            if slot < span:
                return name
            slot -= span
        raise IndexError(slot)

    def values(self, slots: Slots) -> tuple[KeyValue, ...]:
        """One key's column values from its slots: ints, ``uuid.UUID``, ``datetime.date`` and ``datetime.datetime``."""
        out: list[KeyValue] = []
        i = 0
        for is_uuid, time in zip(self.uuids, self.times, strict=True):
            if is_uuid:
                out.append(uuid.UUID(int=((int(slots[i]) & _LOW) << 64) | (int(slots[i + 1]) & _LOW)))
                i += 2
                continue
            value = int(slots[i])
            if time == "date":
                out.append(_EPOCH_DAY + dt.timedelta(days=value))
            elif time:
                out.append((_EPOCH if time == "timestamp" else _EPOCH_UTC) + dt.timedelta(microseconds=value))
            else:
                out.append(value)
            i += 1
        return tuple(out)

    def show(self, slots: Slots) -> str:
        """A sample's key as messages show it: ``series_id=3, start_t=120`` or ``id=4f0c...``."""
        return ", ".join(f"{name}={value}" for name, value in zip(self.names, self.values(slots), strict=True))

    def slot_sql(self, columns: Sequence[str]) -> list[str]:
        """SELECT expressions turning the key columns (``columns``: one SQL reference each) into int8 slots."""
        out = []
        for column, is_uuid, time in zip(columns, self.uuids, self.times, strict=True):
            if is_uuid:  # 32 hex digits; each half read as a 64-bit two's complement integer
                hexed = f"replace({column}::text, '-', '')"
                out += [f"('x' || left({hexed}, 16))::bit(64)::int8", f"('x' || right({hexed}, 16))::bit(64)::int8"]
            elif time:  # extract(epoch) is numeric (PostgreSQL 14 on): exact to the microsecond
                out.append(_TIME_SQL[time][0].format(column))
            else:
                out.append(f"{column}::int8")
        return out

    def value_sql(self, slot_refs: Sequence[str]) -> list[str]:
        """Per column, the SQL value rebuilt from its slots (``slot_refs``, one expression per slot)."""
        out = []
        i = 0
        for is_uuid, time in zip(self.uuids, self.times, strict=True):
            if is_uuid:
                out.append(f"encode(int8send({slot_refs[i]}) || int8send({slot_refs[i + 1]}), 'hex')::uuid")
                i += 2
            else:
                out.append(_TIME_SQL[time][1].format(slot_refs[i]) if time else slot_refs[i])
                i += 1
        return out

    def manifest(self) -> dict[str, object]:
        """How the ``keys`` array's slots map to columns, for the manifest."""
        return {"key_columns": list(self.names), "key_types": list(self.types)}


def uuid_bytes(slots: np.ndarray) -> np.ndarray:
    """The 16 bytes of uuids from their two slots: ``(n, 2)`` int64 -> ``(n, 16)`` uint8 (big-endian)."""
    slots = np.asarray(slots, dtype=np.int64)
    return np.ascontiguousarray(slots.astype(">i8")).view(np.uint8).reshape(slots.shape[0], 16)


def uuid_slots(values: Sequence[uuid.UUID | str]) -> np.ndarray:
    """Uuids as their two slots, ``(n, 2)`` int64 (the inverse of :func:`uuid_bytes`)."""
    raw = b"".join((v if isinstance(v, uuid.UUID) else uuid.UUID(v)).bytes for v in values)
    return np.frombuffer(raw, dtype=">i8").astype(np.int64).reshape(len(values), 2)


def order_slot(kind: str, value: str | int) -> int | None:
    """A value given for an order column of type ``kind`` as its slot (None: not a value of that kind).

    An integer column's is the integer; a ``date``'s an ISO date, its days since 1970-01-01; a ``timestamp``'s
    an ISO date or date-time, its microseconds since 1970-01-01 (``timestamptz``: UTC where no offset is given).
    """
    if kind in INTEGER_TYPES:
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind not in TIME_TYPES or not isinstance(value, str):
        return None
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    if kind == "date":
        if len(value) != 10:
            return None  # a date column is cut at a date, not a time of day
        return (when.date() - _EPOCH_DAY).days
    if when.tzinfo is not None:
        if kind == "timestamp":
            return None  # a timestamp without time zone has no offset: PostgreSQL would drop the one given
        when = when.astimezone(dt.UTC).replace(tzinfo=None)
    return (when - _EPOCH) // dt.timedelta(microseconds=1)
