"""The soak's eye on the store, from outside every process it runs: publications, the consumer, partial epochs.

Each epoch is verified (every chunk against the checksum its dump recorded) the moment it is seen complete:
an epoch that is visible but not whole would fail right there, which is how "no half-published epoch is
ever opened" is checked beside the ranks' own reads. A failure on an epoch that is gone by then (pruned in
the meantime) is not one.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from pgprefetch.errors import PgprefetchError
from pgprefetch.store.maintenance import verify_epoch
from pgprefetch.store.open import open_store

from .bed import Bed
from .timeline import Timeline

CONSUMER = "train"


@dataclass
class Sample:
    """The store at one moment: its newest complete epoch, the consumer's epoch, how many partial epochs."""

    t: float
    newest: int | None
    consumer: int | None
    partials: int


@dataclass
class Watcher:
    """Polls the store every ``interval`` seconds on a thread of its own."""

    bed: Bed
    timeline: Timeline
    interval: float = 0.5
    samples: list[Sample] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)  # epochs seen complete
    verified: dict[int, list[str]] = field(default_factory=dict)  # each epoch seen complete: the problems found
    errors: list[str] = field(default_factory=list)  # polls that failed (the store unreadable)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-watch", daemon=True)
        self._queue: queue.Queue[int | None] = queue.Queue()  # epochs to verify, on a thread of their own
        self._verifier = threading.Thread(target=self._verify_queued, name="soak-verify", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._verifier.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.poll()  # the end state, after the last run
        self._queue.put(None)
        self._verifier.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def _verify_queued(self) -> None:
        """Verify each epoch seen complete; polling goes on meanwhile, so the times seen stay exact."""
        store = open_store(self.bed.store)
        while (epoch := self._queue.get()) is not None:
            self.verified[epoch] = self._verify(store, epoch)
            if self.verified[epoch]:
                self.timeline.add("half published", epoch=epoch, problems=self.verified[epoch])

    def poll(self) -> None:
        store = open_store(self.bed.store)
        try:
            if not store.exists():
                return
            complete = store.epochs()
            consumer = store.consumers().get(CONSUMER)
            partials = len(store.partial_epochs())
        except PgprefetchError as e:
            self.errors.append(f"{self.timeline.now():.1f}: {e}")
            return
        last = self.samples[-1] if self.samples else None
        if last is None or last.consumer != consumer:
            self.timeline.add("consumer", epoch=consumer)
        self.samples.append(Sample(self.timeline.now(), max(complete, default=None), consumer, partials))
        for epoch in complete:
            if epoch not in self.seen:
                self.seen.add(epoch)
                self.timeline.add("published", epoch=epoch)
                self._queue.put(epoch)

    def _verify(self, store: object, epoch: int, attempts: int = 3) -> list[str]:
        """The epoch's problems: none, if it verifies or was pruned meanwhile (gone whole, not half).

        A read that fails (the object store unreachable for a moment) is tried again, twice.
        """
        for attempt in range(attempts):
            try:
                problems = verify_epoch(store, epoch)  # type: ignore[arg-type]
            except (PgprefetchError, OSError) as e:
                problems = [f"could not verify it: {type(e).__name__}: {e}"]
                if attempt + 1 < attempts and store.is_complete(epoch):  # type: ignore[attr-defined]
                    time.sleep(1.0)
                    continue
            if problems and not store.is_complete(epoch):  # type: ignore[attr-defined]
                return []
            return problems
        return []  # (unreachable)

    def half_published(self) -> dict[int, list[str]]:
        """The epochs that were visible as complete but failed their checks."""
        return {e: p for e, p in self.verified.items() if p}
