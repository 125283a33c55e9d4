"""Sample keys: integer and ``uuid`` key columns, all carried as int64 "slots".

The shuffle, the batch statement's bind parameters and the store's ``keys`` array all work on one int64
array, ``(n_slots, n)``. An integer key column takes one slot. A ``uuid`` column takes two: its 16 bytes
as two big-endian signed int64 (high half, low half), so the shuffle stays a pure function of the keys
and the keys still travel as ``int8[]`` arrays, with no per-key Python object on the hot path. The
server converts both ways: :meth:`KeyColumns.slot_sql` when the keys are read, :meth:`KeyColumns.value_sql`
when the per-sample query gets its ``$n`` back.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

INTEGER_TYPES = ("int2", "int4", "int8")
UUID_TYPE = "uuid"
_LOW = (1 << 64) - 1


@dataclass(frozen=True)
class KeyColumns:
    """The key columns, in order, and which of them are ``uuid``."""

    names: tuple[str, ...]
    uuids: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if not self.uuids:
            object.__setattr__(self, "uuids", (False,) * len(self.names))

    @property
    def width(self) -> int:
        """Slots in the ``keys`` array: one per integer column, two per uuid."""
        return len(self.names) + sum(self.uuids)

    @property
    def has_uuid(self) -> bool:
        """Whether any key column is a uuid."""
        return any(self.uuids)

    def column_of_slot(self, slot: int) -> str:
        """The name of the column slot ``slot`` belongs to."""
        for name, is_uuid in zip(self.names, self.uuids, strict=True):
            span = 2 if is_uuid else 1
            if slot < span:
                return name
            slot -= span
        raise IndexError(slot)

    def values(self, slots: Sequence[int]) -> tuple[int | uuid.UUID, ...]:
        """One key's column values from its slots: ints, and ``uuid.UUID`` for uuid columns."""
        out: list[int | uuid.UUID] = []
        i = 0
        for is_uuid in self.uuids:
            if is_uuid:
                out.append(uuid.UUID(int=((int(slots[i]) & _LOW) << 64) | (int(slots[i + 1]) & _LOW)))
                i += 2
            else:
                out.append(int(slots[i]))
                i += 1
        return tuple(out)

    def show(self, slots: Sequence[int]) -> str:
        """A sample's key as messages show it: ``series_id=3, start_t=120`` or ``id=4f0c...``."""
        return ", ".join(f"{name}={value}" for name, value in zip(self.names, self.values(slots), strict=True))

    def slot_sql(self, columns: Sequence[str]) -> list[str]:
        """SELECT expressions turning the key columns (``columns``: one SQL reference each) into int8 slots."""
        out = []
        for column, is_uuid in zip(columns, self.uuids, strict=True):
            if is_uuid:  # 32 hex digits; each half read as a 64-bit two's complement integer
                hexed = f"replace({column}::text, '-', '')"
                out += [f"('x' || left({hexed}, 16))::bit(64)::int8", f"('x' || right({hexed}, 16))::bit(64)::int8"]
            else:
                out.append(f"{column}::int8")
        return out

    def value_sql(self, slot_refs: Sequence[str]) -> list[str]:
        """Per column, the SQL value rebuilt from its slots (``slot_refs``, one expression per slot)."""
        out = []
        i = 0
        for is_uuid in self.uuids:
            if is_uuid:
                out.append(f"encode(int8send({slot_refs[i]}) || int8send({slot_refs[i + 1]}), 'hex')::uuid")
                i += 2
            else:
                out.append(slot_refs[i])
                i += 1
        return out

    def manifest(self) -> dict[str, object]:
        """How the ``keys`` array's slots map to columns, for the manifest."""
        return {"key_columns": list(self.names), "key_types": ["uuid" if u else "int" for u in self.uuids]}


def uuid_bytes(slots: np.ndarray) -> np.ndarray:
    """The 16 bytes of uuids from their two slots: ``(n, 2)`` int64 -> ``(n, 16)`` uint8 (big-endian)."""
    slots = np.asarray(slots, dtype=np.int64)
    return np.ascontiguousarray(slots.astype(">i8")).view(np.uint8).reshape(slots.shape[0], 16)


def uuid_slots(values: Sequence[uuid.UUID | str]) -> np.ndarray:
    """Uuids as their two slots, ``(n, 2)`` int64 (the inverse of :func:`uuid_bytes`)."""
    raw = b"".join((v if isinstance(v, uuid.UUID) else uuid.UUID(v)).bytes for v in values)
    return np.frombuffer(raw, dtype=">i8").astype(np.int64).reshape(len(values), 2)
