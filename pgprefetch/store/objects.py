"""What a spread dump needs of an object store beyond the :class:`~pgprefetch.store.base.Store` interface.

Parts on other nodes stage their files and upload them themselves, and leave a record of what they finished
in the bucket (:mod:`.records`); the driver keeps what the records hold on a rerun. A backend that is an
object store says so by returning itself from :attr:`~pgprefetch.store.base.Store.object_store`; code asks
that capability, never the backend's class, so a new object store (GCS, Azure) is one module implementing
this protocol and one test class running the store contract suite.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # (the lease module loads the S3 client: a local store's dump never imports it)
    from pgprefetch.store.folders import Place
    from pgprefetch.store.lease import Lease


class ObjectStore(Protocol):
    """An object store's objects (put, read, sized, listed, deleted), its staging folder and its epochs' leases."""

    location: str

    def partial_path(self, epoch: int) -> Path:
        """The local folder an epoch is staged in before its files go up."""
        ...

    def journal_path(self, epoch: int) -> Path:
        """The staged epoch's journal."""
        ...

    def place(self, path: Path) -> Place:
        """A path of the staging folder, as the place it is written at (no link followed below the anchor)."""
        ...

    def held_lease(self, epoch: int) -> Lease | None:
        """The lease this process holds on the epoch, if any."""
        ...

    def is_complete(self, epoch: int) -> bool:
        """Whether the epoch is published."""
        ...

    def remove_epoch(self, epoch: int) -> None:
        """Delete a published epoch so that no reader ever finds half of it."""
        ...

    def read(self, key: str) -> bytes | None:
        """The object at ``key``, None if there is none."""
        ...

    def size(self, key: str) -> int | None:
        """The size of the object at ``key``, None if there is none."""
        ...

    def sizes(self, prefix: str) -> dict[str, int]:
        """Every object under ``prefix`` with its size."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` at ``key``."""
        ...

    def delete(self, keys: list[str]) -> None:
        """Delete the objects ``keys``."""
        ...
