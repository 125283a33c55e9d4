"""The local backend: a store in a folder, published by ``rename`` (see :mod:`pgprefetch.store.base`).

An epoch is written under ``<store>/.pgprefetch/partial/epoch-00003`` and becomes visible only through
:meth:`LocalStore.publish`: one filesystem sync, then a rename into place. A reader therefore never sees
a partial epoch under the final name. Locks are ``flock``-s, which the kernel drops when the holder dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from pathlib import Path

from pgprefetch.errors import ConfigError, StoreError, StoreNotFoundError
from pgprefetch.store.base import (
    META_DIR,
    ROOT_ATTRIBUTES,
    Store,
    epoch_name,
    epochs_in,
)
from pgprefetch.store.consumers import consumer_record, record_name
from pgprefetch.store.durable import WriteBack, sync_dir, sync_tree
from pgprefetch.store.flock import holder, holding, open_lock
from pgprefetch.store.layout import ArrayLayout, read_batch_bytes
from pgprefetch.store.staging import folder_bytes, staged_epochs
from pgprefetch.store.zarrjson import group_json, replace_file, write_json


class LocalStore(Store):
    """A folder holding epochs of one config."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()
        self.location = str(self.path)
        self._made: list[Path] = []  # the folders create() made (the store's, and parents asked for)

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

    def scratch(self, name: str) -> Path:
        return self.meta / name

    def partial_epochs(self) -> list[int]:
        return staged_epochs(self.meta / "partial")

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
            if not root.exists():
                write_json(root, group_json(ROOT_ATTRIBUTES))  # what zarr.open_group(attributes=...) writes
            self.meta.mkdir(exist_ok=True)
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
        if self.epochs() or any((self.meta / "consumers").glob("*.json")):
            return
        with contextlib.ExitStack() as locks:
            for epoch in self.partial_epochs():
                if not locks.enter_context(self.writer_lock(epoch)) or self._holds_batches(epoch):
                    return
            shutil.rmtree(self.meta, ignore_errors=True)
        (self.path / "zarr.json").unlink(missing_ok=True)
        for folder in self._made:  # deepest first; a folder that was there before create() stays
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if nothing else is there

    def _holds_batches(self, epoch: int) -> bool:
        """Whether the partial epoch's journals (its own and its parts') record a batch written."""
        journal = self.journal_path(epoch)
        for path in (journal, *journal.parent.glob(f"{journal.name}.part-*")):
            try:
                lines = path.read_text(errors="replace").splitlines()[1:]
            except OSError:
                continue
            if any(line.strip() and line[0] not in "#{" for line in lines):
                return True
        return False

    def epochs(self) -> list[int]:
        if not self.path.is_dir():
            return []
        return [e for e in epochs_in(p.name for p in self.path.iterdir()) if self.is_complete(e)]

    def read(self, key: str) -> bytes | None:
        try:
            return (self.path / key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def read_range(self, key: str, start: int, length: int) -> bytes:
        with open(self.path / key, "rb") as f:
            f.seek(start)
            return f.read(length)

    def size(self, key: str) -> int | None:
        try:
            return (self.path / key).stat().st_size
        except (FileNotFoundError, NotADirectoryError):
            return None

    def is_complete(self, epoch: int) -> bool:
        return (self.epoch_path(epoch) / "zarr.json").exists()

    def array_layout(self, epoch: int, name: str) -> ArrayLayout:
        return ArrayLayout.read(self.epoch_path(epoch) / name)

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
        self._remove(self.epoch_path(epoch))

    def remove_partial(self, epoch: int) -> None:
        self._remove(self.partial_path(epoch))
        self.journal_path(epoch).unlink(missing_ok=True)
        _delete(self.keys_path(epoch))
        for old in (self.meta / "partial").glob("*.replaced"):  # epochs a --force dump moved aside and died
            _delete(old)

    def _remove(self, folder: Path) -> None:
        if folder.is_symlink():  # a link someone put in the store: the link goes, never what it points at
            folder.unlink()
            return
        if not folder.exists():
            return
        trash = self.meta / "trash"
        if trash.is_symlink() or (trash.exists() and not trash.is_dir()):
            trash.unlink()  # a link planted there would carry the epoch off to wherever it points
        trash.mkdir(parents=True, exist_ok=True)
        aside = trash / f"{folder.name}.{datetime.now(UTC).strftime('%Y%m%d%H%M%S%f')}"
        folder.rename(aside)
        shutil.rmtree(aside, ignore_errors=True)

    def zarr_store(self) -> str:
        return str(self.path)

    def publish(self, epoch: int, partial: Path, replace: bool = False, elsewhere: Collection[str] = ()) -> Path:
        # The epoch's flock is held, and a dump that is not --force skips a complete epoch under it.
        return publish_epoch(partial, self.epoch_path(epoch))

    def writer_lock(self, epoch: int) -> AbstractContextManager[bool]:
        """An advisory ``flock`` on ``.pgprefetch/locks/epoch-N.lock`` (:func:`pgprefetch.store.flock.holding`).

        The kernel drops it when the holder dies, even by ``kill -9``, so there are no stale locks to clean
        up. On NFSv3 without a lock manager it does not hold: run the dumps of one store from one host there.
        """
        return holding(self.meta / "locks" / f"{epoch_name(epoch)}.lock")

    def lock_holder(self, epoch: int) -> str:
        return holder(self.meta / "locks" / f"{epoch_name(epoch)}.lock")

    def record_consumer(self, name: str, epoch: int, rank: int = 0, world: int = 1) -> None:
        record = consumer_record(name, epoch, rank, world)
        folder = self.meta / "consumers"
        folder.mkdir(parents=True, exist_ok=True)
        replace_file(folder / f"{record_name(name, rank)}.json", record)

    def swap(self, key: str, change: Callable[[bytes | None], bytes]) -> bytes:
        """Read, change and replace ``key`` under a blocking ``flock`` of its own (held for one small write).

        The new bytes go to a temporary file, synced, renamed over the old: a reader (``check``, a dump
        planning) sees the old or the new, never half, and a crash leaves one of them.
        """
        path = self.path / key
        lock = self.meta / "locks" / f"{path.name}.lock"
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = open_lock(lock)
        except OSError as e:
            raise StoreError(f"cannot write {path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            old = self.read(key)
            new = change(old)
            if new != old:
                try:
                    replace_file(path, new, sync=True)
                    sync_dir(path.parent)
                except OSError as e:
                    raise StoreError(f"cannot write {path}: {e.strerror or e}") from None
            return new
        finally:
            os.close(fd)

    def consumer_records(self) -> dict[str, bytes]:
        folder = self.meta / "consumers"
        records = {}
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
            with contextlib.suppress(OSError):
                records[path.stem] = path.read_bytes()
        return records

    def remove_consumer_record(self, record: str) -> None:
        path = self.meta / "consumers" / f"{record}.json"
        try:
            path.unlink(missing_ok=True)
        except OSError as e:
            raise StoreError(f"cannot remove {path}: {e.strerror or e}") from None


def _delete(path: Path) -> None:
    """Delete a folder of the store's own, or the link standing in its place (never what a link points at).

    ``rmtree`` refuses a link (and ``ignore_errors`` would hide that), so a linked ``*.keys`` folder used to
    stay while prune said it was deleted.
    """
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def publish_epoch(partial: Path, final: Path) -> Path:
    """Make a fully written epoch visible under its final name, atomically.

    Every file and folder of the epoch made durable (:func:`sync_tree`: the dump's own files, not the
    whole filesystem), then a rename, then an fsync of the parent folder so the rename itself is durable.
    An epoch already there (``--force``) is moved aside first and removed after.
    """
    sync_tree(partial)
    old = None
    if final.exists():
        old = partial.with_name(partial.name + ".replaced")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
    os.rename(partial, final)
    sync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final
