"""What happened during a soak, and when: faults, publications, consumer records, as events in time order.

Times are seconds since the soak began (``time.monotonic``), one clock for every thread of the harness;
the training ranks write wall-clock times, which :meth:`Timeline.since_start` converts.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Event:
    """One thing that happened: ``kind`` (a fault's name, ``published``, ...) and what there is to say about it."""

    t: float
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)


class Timeline:
    """Events from every thread of the soak, in the order they were added."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        self._wall0 = time.time()
        self._lock = threading.Lock()
        self.events: list[Event] = []

    def now(self) -> float:
        """Seconds since the soak began."""
        return time.monotonic() - self._t0

    def since_start(self, wall: float) -> float:
        """A wall-clock time (``time.time()``, as another process wrote it) in seconds since the soak began."""
        return wall - self._wall0

    def add(self, kind: str, **detail: Any) -> Event:
        event = Event(self.now(), kind, detail)
        with self._lock:
            self.events.append(event)
        return event

    def of(self, *kinds: str) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e.kind in kinds]
