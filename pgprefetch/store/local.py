"""The local backend: a store in a folder, published by ``rename`` (see :mod:`pgprefetch.store.base`).

An epoch is written under ``<store>/.pgprefetch/partial/epoch-00003`` and becomes visible only through
:meth:`LocalStore.publish`: one filesystem sync, then a rename into place. A reader therefore never sees
a partial epoch under the final name. Locks are ``flock``-s, which the kernel drops when the holder dies.

Everything below the store is written through :mod:`pgprefetch.store.folders` (the store's folder opened
as named, every folder below it by descriptor with no link followed): ``.pgprefetch`` is written by every
dump and reader of the store, and a link planted there must not carry a lock, a record or an epoch out.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from pgprefetch.errors import ConfigError, StoreError, StoreNotFoundError
from pgprefetch.store.base import (
    META_DIR,
    ROOT_ATTRIBUTES,
    SPILL_SUFFIXES,
    Store,
    epoch_name,
    epochs_in,
)
from pgprefetch.store.beneath import open_below, read_below
from pgprefetch.store.consumers import consumer_record, record_name
from pgprefetch.store.durable import WriteBack, sync_dir, sync_tree
from pgprefetch.store.flock import holder, holding, open_lock
from pgprefetch.store.folders import Folder, Place
from pgprefetch.store.layout import ArrayLayout, read_batch_bytes
from pgprefetch.store.staging import folder_bytes, staged_epochs
from pgprefetch.store.zarrjson import group_json


class LocalStore(Store):
    """A folder holding epochs of one config."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()
        self.location = str(self.path)
        self._made: list[Path] = []  # the folders create() made (the store's, and parents asked for)

    def sub_store(self, relative: str) -> LocalStore:
        here = self.path
        for part in relative.split("/"):
            here = here / part
            if here.is_symlink():
                raise StoreError(f"{here} is a link: a store's folders are never reached through links")
        sub = LocalStore(here)
        return sub

    @property
    def meta(self) -> Path:
        """Pgprefetch's own folder in the store: partial epochs, locks and consumer records."""
        return self.path / META_DIR

    @property
    def local_root(self) -> Path:
        return self.path

    def epoch_path(self, epoch: int) -> Path:
        """Where a published epoch lives."""
        return self.path / epoch_name(epoch)

    def epoch_location(self, epoch: int) -> Path:
        return self.epoch_path(epoch)

    def uploader(self, epoch: int) -> WriteBack:
        """Each finished file written back to disk while the dump goes on (publication then waits for little)."""
        return WriteBack()

    def partial_path(self, epoch: int) -> Path:
        return self.meta / "partial" / epoch_name(epoch)

    def place(self, path: Path) -> Place:
        return Place.under(self.path, path)

    def _own(self, *names: str) -> Place:
        """A folder of the store's own below ``.pgprefetch``."""
        return Place(self.path, PurePosixPath(META_DIR, *names))

    def partial_epochs(self) -> list[int]:
        return staged_epochs(self._own("partial"))

    def create(self, parents: bool = False) -> None:
        """The store's own folder, and its parents only if asked: a typo is refused, not made into a store."""
        parent = self.path.absolute().parent
        if not parents and not parent.is_dir():
            raise ConfigError(
                f"cannot create store {self.path}: its parent folder {parent} does not exist (a mistyped path?); "
                "create it first, or pass --parents (parents=True) to create it with the store"
            )
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"store path {self.path} is a file, not a folder")
        root = self.path / "zarr.json"
        if self.path.is_dir() and not root.exists() and any(p.name != META_DIR for p in self.path.iterdir()):
            raise StoreError(f"store path {self.path} is a non-empty folder that is not a pgprefetch store")
        self._made = [p for p in (self.path, *self.path.absolute().parents) if not p.exists()]  # removed unused
        try:
            self.path.mkdir(parents=parents, exist_ok=True)
            with Folder.anchor(self.path) as store:
                if store.kind("zarr.json") is None:  # what zarr.open_group(attributes=...) writes
                    store.replace("zarr.json", group_json(ROOT_ATTRIBUTES))
                store.folder(META_DIR, create=True).close()
        except OSError as e:
            raise StoreError(f"cannot create store {self.path}: {e.strerror or e}") from None

    def exists(self) -> bool:
        return (self.path / "zarr.json").is_file()

    def require(self) -> Store:
        if not self.exists():
            if self.path.is_dir():
                what = "a folder that is not a pgprefetch store"
            elif self.path.exists():
                what = "a file, not a store: a store is a folder"
            else:
                what = "nothing there"
            raise StoreNotFoundError(f"no store at {self.path} ({what})")
        return self

    def remove_if_unused(self) -> None:
        """Remove the store a failed first dump created, unless it holds work: an epoch, or a batch written.

        A partial epoch whose journal records no batch (the dump failed before its first one: a Ray cluster
        it could not join, a keys query that failed) is not work to resume, and would leave a store no dump
        was ever written to. One another dump holds the lock of is never touched. The parent folders
        ``create(parents=True)`` made go too, if nothing else is in them. A training run's record (one
        waiting for the store's first epoch) keeps the store: it is in use.
        """
        if self.epochs() or self.consumer_records():
            return
        with contextlib.ExitStack() as locks, Folder.anchor(self.path) as store:
            for epoch in self.partial_epochs():
                if not locks.enter_context(self.writer_lock(epoch)) or self._holds_batches(epoch):
                    return
            store.remove(META_DIR)
            store.unlink("zarr.json")
        for folder in self._made:  # deepest first; a folder that was there before create() stays
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if nothing else is there

    def _holds_batches(self, epoch: int) -> bool:
        """Whether the partial epoch's journals (its own and its parts') record a batch written."""
        journal = self.journal_path(epoch).name
        folder = self._own("partial").find()
        if folder is None:
            return False
        with folder:
            for name in folder.names():
                if name != journal and not name.startswith(f"{journal}.part-"):
                    continue
                lines = (folder.read(name) or b"").decode(errors="replace").splitlines()[1:]
                if any(line.strip() and line[0] not in "#{" for line in lines):
                    return True
        return False

    def epochs(self) -> list[int]:
        if not self.path.is_dir():
            return []
        return [e for e in epochs_in(p.name for p in self.path.iterdir()) if self.is_complete(e)]

    def read(self, key: str) -> bytes | None:
        return read_below(self.path, self.path / key)  # a reader's read: no link followed below the store

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``key`` from ``start``, reached as readers reach files: no link followed below."""
        with os.fdopen(open_below(self.path, self.path / key), "rb") as f:
            f.seek(start)
            return f.read(length)

    def size(self, key: str) -> int | None:
        """The size of ``key``, reached as :meth:`read_range` reaches it; None when it is not there."""
        try:
            fd = open_below(self.path, self.path / key)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        try:
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def is_complete(self, epoch: int) -> bool:
        return (self.epoch_path(epoch) / "zarr.json").exists()

    def array_layout(self, epoch: int, name: str) -> ArrayLayout:
        return ArrayLayout.read(self.epoch_path(epoch) / name, self.path)  # its files: no link followed

    def batch_bytes(self, layout: ArrayLayout, batch: int) -> bytes | None:
        return read_batch_bytes(layout, batch)

    def epoch_bytes(self, epoch: int) -> int:
        return folder_bytes(self.epoch_path(epoch))

    def partial_info(self, epoch: int) -> tuple[int, float]:
        mtime = 0.0
        for path in (self.journal_path(epoch), self.partial_path(epoch)):
            with contextlib.suppress(OSError):
                mtime = max(mtime, path.stat().st_mtime)
        return folder_bytes(self.partial_path(epoch)), mtime

    def remove_epoch(self, epoch: int) -> None:
        """Rename the epoch's folder aside first, so no reader finds half of it, then delete it."""
        with Folder.anchor(self.path) as store:
            self._remove(store, epoch_name(epoch))

    def remove_partial(self, epoch: int) -> None:
        """The partial epoch, its journal, its spill folder and any epoch a ``--force`` dump moved aside and died.

        Each removed through the partial epochs' folder's descriptor: a link among them goes, never what it
        points at, and a link in that folder's own place holds no partial epoch of the store's.
        """
        partial = self._own("partial").find()
        if partial is None:
            return
        name = epoch_name(epoch)
        with partial:
            self._remove(partial, name)
            partial.unlink(f"{name}.journal")
            for suffix in SPILL_SUFFIXES:
                partial.remove(f"{name}{suffix}")
            for old in partial.names():
                if old.endswith(".replaced"):
                    partial.remove(old)

    def _remove(self, parent: Folder, name: str) -> None:
        """Remove the folder ``name`` of ``parent``: renamed into ``.pgprefetch/trash`` first, then deleted.

        A link in its place goes (the link, never what it points at); so does one planted for the trash,
        which is made a real folder (:meth:`Folder.folder`) before anything is moved into it.
        """
        kind = parent.kind(name)
        if kind != "folder":
            if kind is not None:
                parent.unlink(name)
            return
        with self._own("trash").open(create=True) as trash:
            aside = f"{name}.{datetime.now(UTC).strftime('%Y%m%d%H%M%S%f')}"
            parent.rename(name, trash, aside)
            trash.remove(aside)

    def zarr_store(self) -> Any:
        from pgprefetch.store.zarrlocal import LinklessStore  # here: only what reads through zarr loads zarr

        return LinklessStore(self.path)

    def publish(self, epoch: int, partial: Path, replace: bool = False, elsewhere: Collection[str] = ()) -> Path:
        # The epoch's flock is held, and a dump that is not --force skips a complete epoch under it.
        with self.place(partial.parent).open() as staged, Folder.anchor(self.path) as store:
            publish_epoch(staged, partial.name, store, epoch_name(epoch))
        return self.epoch_path(epoch)

    @contextmanager
    def writer_lock(self, epoch: int) -> Iterator[bool]:
        """An advisory ``flock`` on ``.pgprefetch/locks/epoch-N.lock`` (:func:`pgprefetch.store.flock.holding`).

        The kernel drops it when the holder dies, even by ``kill -9``, so there are no stale locks to clean
        up. On NFSv3 without a lock manager it does not hold: run the dumps of one store from one host there.
        """
        with self._own("locks").open(create=True) as locks, holding(locks, f"{epoch_name(epoch)}.lock") as held:
            yield held

    def lock_holder(self, epoch: int) -> str:
        folder = self._own("locks").find()
        try:
            return holder(folder, f"{epoch_name(epoch)}.lock")
        finally:
            if folder is not None:
                folder.close()

    def record_consumer(self, name: str, epoch: int, rank: int = 0, world: int = 1) -> None:
        record = consumer_record(name, epoch, rank, world)
        with self._own("consumers").open(create=True) as folder:
            folder.replace(f"{record_name(name, rank)}.json", record)

    def swap(self, key: str, change: Callable[[bytes | None], bytes]) -> bytes:
        """Read, change and replace ``key`` under a blocking ``flock`` of its own (held for one small write).

        The new bytes go to a temporary file, synced, renamed over the old: a reader (``check``, a dump
        planning) sees the old or the new, never half, and a crash leaves one of them.
        """
        place = Place(self.path, PurePosixPath(key))
        try:
            with self._own("locks").open(create=True) as locks:
                fd = open_lock(locks, f"{place.name}.lock")
        except OSError as e:
            raise StoreError(f"cannot write {place}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with place.parent.open(create=True) as folder:
                old = folder.read(place.name)
                new = change(old)
                if new != old:
                    folder.replace(place.name, new, sync=True)
                    sync_dir(folder.fd)
            return new
        except OSError as e:
            raise StoreError(f"cannot write {place}: {e.strerror or e}") from None
        finally:
            os.close(fd)

    def read_own(self, name: str) -> bytes | None:
        folder = self._own().find()  # a link in its place is not the store's: no record
        if folder is None:
            return None
        with folder:
            return folder.read(name)

    def consumer_records(self) -> dict[str, bytes]:
        folder = self._own("consumers").find()  # a link in its place is not the store's: no records
        records: dict[str, bytes] = {}
        if folder is None:
            return records
        with folder:
            for name in sorted(folder.names()):
                if name.endswith(".json") and not name.startswith("."):
                    with contextlib.suppress(OSError):
                        raw = folder.read(name)
                        if raw is not None:
                            records[name.removesuffix(".json")] = raw
        return records

    def remove_consumer_record(self, record: str) -> None:
        place = self._own("consumers", f"{record}.json")
        try:
            place.remove()
        except OSError as e:
            raise StoreError(f"cannot remove {place}: {e.strerror or e}") from None


def publish_epoch(staged: Folder, partial: str, store: Folder, final: str) -> None:
    """Make the fully written epoch ``partial`` of ``staged`` visible as ``final`` in ``store``, atomically.

    Every file and folder of the epoch made durable (:func:`sync_tree`: the dump's own files, not the
    whole filesystem), then a rename, then an fsync of the store's folder so the rename itself is durable.
    An epoch already there (``--force``) is moved aside first and removed after; a link in its place is
    moved aside and removed as a link. Both folders are open descriptors (:mod:`pgprefetch.store.folders`):
    no name on the way is looked up again.
    """
    with staged.folder(partial) as epoch:
        sync_tree(epoch)
    old = None
    if store.kind(final) is not None:
        old = f"{partial}.replaced"
        staged.remove(old)
        store.rename(final, staged, old)
    staged.rename(partial, store, final)
    sync_dir(store.fd)
    if old is not None:
        staged.remove(old)
