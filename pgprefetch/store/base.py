"""The store: one interface, two backends (a local folder, an object store), that own everything a store does.

Layout (plain Zarr v3; ``zarr.open_group(store)["epoch-00003"]["x"][7]`` is batch 7)::

    <store>/zarr.json                 root group, attribute pgprefetch_store = {"format_version": 1}
    <store>/epoch-00003/zarr.json     epoch group; attribute "pgprefetch" is the manifest
    <store>/epoch-00003/<field>/      (n_batches, size, *sample_shape), one batch per (inner) chunk
    <store>/epoch-00003/keys/         (n_batches, size, n_slots) int64
    <store>/.pgprefetch/locks/        one lock per epoch: one writer at a time
    <store>/.pgprefetch/consumers/    the epoch each training run's (consumer's) ranks opened last
    <store>/.pgprefetch/categories.json  the store's vocabulary of each ``categories = "auto"`` field

An epoch is always written into a local folder first (:meth:`Store.partial_path`, with its journal): the
writer (:mod:`pgprefetch.write.files.writer`) ``pwrite``-s batches there and resumes it after a crash. What differs is
how it becomes visible, and the backends own that: :class:`~pgprefetch.store.local.LocalStore` syncs and
renames the folder into place; :class:`~pgprefetch.store.s3.S3Store` uploads its files (while the dump
runs) and writes the epoch's ``zarr.json``, which holds the manifest, last, with a conditional create. In
both, an epoch whose group ``zarr.json`` exists is complete, and nothing else is.

``open_store(location)`` (:mod:`pgprefetch.store.open`, above the backends) opens the backend the location
names: ``s3://bucket/prefix`` an object store, anything else a folder. This interface knows no backend.
"""

from __future__ import annotations

import abc
import json
import logging
import re
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from pgprefetch.errors import EpochNotFoundError, EpochNotReadyError, FormatVersionError, StoreError, StoreNotFoundError
from pgprefetch.store.consumers import positions
from pgprefetch.store.folders import Place
from pgprefetch.store.layout import MISSING, ArrayLayout
from pgprefetch.store.objects import ObjectStore

log = logging.getLogger("pgprefetch")

FORMAT_VERSION = 1
WAIT_NOTICE_S = 60.0  # a reader waiting for an epoch says so this often (and at once when no store is there)
KEYS_ARRAY = "keys"
STARTS_ARRAY = "_starts"  # windows stored as starts: each sample's first row among the stored rows (int64)
# A partial epoch's spill folder, and the keys folder a dump before the one spill folder (#52) left in its place.
SPILL_SUFFIXES = (".spill", ".keys")
META_DIR = ".pgprefetch"
ROOT_ATTRIBUTES = {"pgprefetch_store": {"format_version": FORMAT_VERSION}}
VOCABULARY = f"{META_DIR}/categories.json"  # the store's category vocabularies (Store.vocabulary)
EPOCH = re.compile(r"epoch-([0-9]{5,})")  # fullmatch: "epoch-00001\n" is not an epoch


def epoch_name(epoch: int) -> str:
    """The group name of an epoch: ``epoch-00003``."""
    return f"epoch-{epoch:05d}"


@dataclass(frozen=True)
class ArraySpec:
    """One array of an epoch: a field or the keys.

    ``per_batch``: the items a chunk holds, 0 for the epoch's batch size. A windows epoch stored as starts
    keeps its rows in arrays of their own count per chunk (:mod:`pgprefetch.write.scan.starts`), so that
    every array still has a chunk per batch: one journal line, one checksum column, one resume for both.
    """

    name: str
    dtype: np.dtype
    sample_shape: tuple[int, ...]
    per_batch: int = 0


class Uploader(abc.ABC):
    """Sends the files of an epoch being written to where it will be published, while the dump runs."""

    @abc.abstractmethod
    def submit(self, path: Path) -> None:
        """``path`` (in the partial folder) is final: send it when there is room."""

    @abc.abstractmethod
    def finish(self) -> None:
        """Wait until everything submitted is sent; raise the first failure."""


class Store(abc.ABC):
    """Where the epochs of one config live: the interface both backends implement (:func:`open_store` picks one)."""

    location: str  # as messages show it: the folder, or s3://bucket/prefix
    parent: Store | None = None  # a split's store: the store it is a split of, whose vocabulary it shares
    split_name: str | None = None  # a split's store: its split

    @abc.abstractmethod
    def sub_store(self, relative: str) -> Store:
        """The store in folder (prefix) ``relative`` of this one, a store of its own (a split's: :mod:`.splits`).

        A local folder on the way that is a link is refused: a store's folders are never reached through one.
        """

    @property
    def local_root(self) -> Path | None:
        """The folder the published epochs are in, for a store on this machine's disk; None otherwise.

        The read side maps a local epoch's files and reads an object store's with ranged requests: it asks
        this, not which backend it holds.
        """
        return None

    @property
    def object_store(self) -> ObjectStore | None:
        """This store as an object store (its epochs staged locally and uploaded, parts' records in the bucket).

        None for a folder on this machine's disk. The dump's spread over a cluster asks this capability, never
        the backend's class (:mod:`pgprefetch.store.objects`).
        """
        return None

    # --- the store as a whole ---------------------------------------------------------------------------
    @abc.abstractmethod
    def create(self, parents: bool = False) -> None:
        """Create the store (its root group) if needed; refuse a location that holds something else.

        ``parents``: a local store's missing parent folders are created too; without it they are an error
        (a mistyped path). An object store has no folders: it ignores it.
        """

    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether the store's root group is there."""

    def require(self) -> Store:
        """This store, if it exists; a one-line StoreNotFoundError (exit 2) naming the location otherwise."""
        if not self.exists():
            raise StoreNotFoundError(f"no store at {self.location} (nothing there, or not a pgprefetch store)")
        return self

    @abc.abstractmethod
    def remove_if_unused(self) -> None:
        """Remove a store a failed first dump created, if it holds no epoch and no batch of a partial one."""

    # --- epochs -------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def epochs(self) -> list[int]:
        """The published (complete) epochs, in order."""

    @abc.abstractmethod
    def partial_epochs(self) -> list[int]:
        """Epochs being written, or left by a dump that died (locally staged, or half uploaded)."""

    @abc.abstractmethod
    def read(self, key: str) -> bytes | None:
        """The object (file) ``key``, relative to the store; None if it does not exist."""

    def read_own(self, name: str) -> bytes | None:
        """A record of pgprefetch's own in the store's ``.pgprefetch`` folder; None when it is not there.

        As the consumer records are read: a link in the folder's place is not the store's, so no record.
        """
        return self.read(f"{META_DIR}/{name}")

    @abc.abstractmethod
    def read_range(self, key: str, start: int, length: int) -> Any:
        """``length`` bytes of ``key`` from ``start``, as a bytes-like buffer (numpy views it as is)."""

    @abc.abstractmethod
    def size(self, key: str) -> int | None:
        """The size of ``key`` in bytes; None if it does not exist."""

    def is_complete(self, epoch: int) -> bool:
        """True when the epoch is published (its group ``zarr.json`` is written last)."""
        return self.size(f"{epoch_name(epoch)}/zarr.json") is not None

    def manifest(self, epoch: int) -> dict[str, Any]:
        """The manifest of a published epoch.

        Raises:
            EpochNotFoundError: not published (lists the epochs that are).
            EpochNotReadyError: it exists only as a partial epoch (being written, or its dump died).
            FormatVersionError: written by a pgprefetch with a newer format.
        """
        raw = self.read(f"{epoch_name(epoch)}/zarr.json")
        if raw is None:
            if epoch in self.partial_epochs():
                raise EpochNotReadyError(f"epoch {epoch} in {self.location} is still being written (or its dump died)")
            try:  # no store at all: say so as the CLI does ("no store at ..."), not "epochs present: none"
                self.require()
            except StoreNotFoundError as e:
                raise EpochNotFoundError(str(e)) from None  # still "not found": a reader may wait for it
            present = ", ".join(map(str, self.epochs())) or "none"
            raise EpochNotFoundError(f"epoch {epoch} is not in {self.location} (epochs present: {present})")
        try:
            manifest = json.loads(raw).get("attributes", {}).get("pgprefetch")
        except ValueError:
            manifest = None
        where = f"{self.location}/{epoch_name(epoch)}"
        if not isinstance(manifest, dict):
            raise StoreError(f"{where} has no pgprefetch manifest")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise FormatVersionError(
                f"{where} has format version {manifest.get('format_version')}; "
                f"this pgprefetch reads version {FORMAT_VERSION}"
            )
        return manifest

    def wait_manifest(self, epoch: int, timeout: float | None) -> dict[str, Any]:
        """:meth:`manifest`, waiting up to ``timeout`` seconds for the epoch to be published (None: no wait).

        The wait is not silent: with no store at the location yet (a misspelt path costs the whole timeout;
        a store cron has not created yet is legitimate, the training job may start first) it warns at once,
        and every ``WAIT_NOTICE_S`` it says again what it waits for and where.
        """
        started = time.monotonic()
        deadline = started + (timeout or 0.0)
        noticed = None  # when the wait was last reported
        while True:
            try:
                return self.manifest(epoch)
            except (EpochNotFoundError, EpochNotReadyError) as e:
                if timeout is None:
                    raise
                now = time.monotonic()
                if now >= deadline:
                    raise EpochNotReadyError(f"{e}; gave up waiting after {timeout:g} s") from None
                if noticed is None or now - noticed >= WAIT_NOTICE_S:
                    self._notice_wait(epoch, now - started, timeout, first=noticed is None)
                    noticed = now
                time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def _notice_wait(self, epoch: int, waited: float, timeout: float, *, first: bool) -> None:
        """Say what a reader waits for: a warning while no store is there, otherwise a note every so often."""
        so_far = "" if first else f" (for {waited:.0f} s of {timeout:g})"
        if not self.exists():
            log.warning(
                "waiting for epoch %d of %s%s: no store is there yet (a misspelt path, or cron has not dumped yet)",
                epoch, self.location, so_far,
            )  # fmt: skip
        elif not first:
            log.info("still waiting for epoch %d of %s to be published%s", epoch, self.location, so_far)

    def array_layout(self, epoch: int, name: str) -> ArrayLayout:
        """Where array ``name`` of a published epoch keeps each batch."""
        key = f"{epoch_name(epoch)}/{name}"
        raw = self.read(f"{key}/zarr.json")
        if raw is None:
            raise StoreError(f"{self.location}/{key}: the array is missing (the epoch is damaged)")
        return ArrayLayout.from_bytes(raw, PurePosixPath(key))

    def batch_bytes(self, layout: ArrayLayout, batch: int) -> bytes | None:
        """The bytes of ``batch`` as stored (raw values, or the compressed chunk); None when missing.

        Reads the shard's index, as ``verify`` must: it checks what is there, not what should be.
        """
        path, slot = layout.file(batch)
        key = str(path)
        size = self.size(key)
        if size is None:
            return None
        if not layout.sharded:
            return bytes(self.read_range(key, 0, size))
        if size < layout.index_bytes:
            return None
        tail = np.frombuffer(self.read_range(key, size - layout.index_bytes, layout.index_bytes), dtype=np.uint8)
        offset, nbytes = (int(v) for v in layout.shard_index(tail)[slot])
        if offset == MISSING or offset + nbytes > size - layout.index_bytes:
            return None
        return bytes(self.read_range(key, offset, nbytes))

    @abc.abstractmethod
    def epoch_bytes(self, epoch: int) -> int:
        """What a published epoch takes in the store."""

    def epoch_location(self, epoch: int) -> Path | str:
        """Where a published epoch lives (a folder, or a URL)."""
        return f"{self.location}/{epoch_name(epoch)}"

    @abc.abstractmethod
    def remove_epoch(self, epoch: int) -> None:
        """Delete a published epoch so that no reader ever finds half of it."""

    @abc.abstractmethod
    def zarr_store(self) -> Any:
        """The store as zarr opens it (compressed arrays and the checksums go through zarr)."""

    # --- writing ------------------------------------------------------------------------------------------
    @abc.abstractmethod
    def partial_path(self, epoch: int) -> Path:
        """The local folder an epoch is written into before it is published."""

    def journal_path(self, epoch: int) -> Path:
        """The journal of a partial epoch: what it holds and the checksum of every batch written."""
        partial = self.partial_path(epoch)
        return partial.with_name(f"{partial.name}.journal")

    def spill_path(self, epoch: int) -> Path:
        """A dump's files beyond ``[source] memory`` (keys, rows): beside its partial epoch, removed with it."""
        partial = self.partial_path(epoch)
        return partial.with_name(f"{partial.name}.spill")

    def orphaned_spills(self) -> list[int]:
        """Epochs with a spill folder but no partial epoch: left by a dump killed before its first batch."""
        folder = self.place(self.partial_path(0).parent).find()  # a link there: not the store's, nothing found
        if folder is None:
            return []
        with folder:
            names = folder.names()
        found = epochs_in(n.rsplit(".", 1)[0] for n in names if n.endswith(SPILL_SUFFIXES))
        partial = set(self.partial_epochs()) if found else set()
        return [e for e in found if e not in partial]

    @abc.abstractmethod
    def place(self, path: Path) -> Place:
        """A local path of the store's own (a partial epoch, a journal, a spool) as the place it is written at.

        Anchored at the folder whose own path is the user's (the local store's, an object store's staging
        folder), so that nothing below it is reached through a link (:mod:`pgprefetch.store.folders`).
        """

    @abc.abstractmethod
    def partial_info(self, epoch: int) -> tuple[int, float]:
        """A partial epoch's bytes so far and when it was last written to (Unix time)."""

    @abc.abstractmethod
    def remove_partial(self, epoch: int) -> None:
        """Delete a partial epoch (its local folder and journal, and anything uploaded of it)."""

    def uploader(self, epoch: int) -> AbstractContextManager[Uploader | None]:
        """What sends an epoch's finished files on while it is written; None when publishing does it all."""
        from contextlib import nullcontext

        return nullcontext(None)

    @abc.abstractmethod
    def publish(self, epoch: int, partial: Path, replace: bool = False, elsewhere: Collection[str] = ()) -> Path | str:
        """Make the fully written epoch in ``partial`` visible, complete or not at all; return where it is.

        ``elsewhere``: files of the epoch (relative paths) that were uploaded from other machines, not staged
        in ``partial`` (the parts of :mod:`pgprefetch.write.ray`); an object store keeps them.

        ``replace``: an epoch already published there is replaced (``--force``); otherwise that is an error.
        """

    @abc.abstractmethod
    def writer_lock(self, epoch: int) -> AbstractContextManager[bool]:
        """Hold the epoch's lock while the block runs; yields False (holding nothing) if another dump has it."""

    @abc.abstractmethod
    def lock_holder(self, epoch: int) -> str:
        """Who holds (or last held) an epoch's lock: "host pid"."""

    # --- consumers ----------------------------------------------------------------------------------------
    @abc.abstractmethod
    def record_consumer(self, name: str, epoch: int, rank: int = 0, world: int = 1) -> None:
        """Note, atomically, that rank ``rank`` of ``world`` of consumer ``name`` (a training run) opened ``epoch``.

        Each rank has a record of its own (:mod:`pgprefetch.store.consumers`).
        """

    @abc.abstractmethod
    def consumer_records(self) -> dict[str, bytes]:
        """Every consumer record's bytes, by record name (``train``, ``train@1``), damaged ones included."""

    @abc.abstractmethod
    def remove_consumer_record(self, record: str) -> None:
        """Remove one consumer record (``pgprefetch forget``); one that is not there is not an error."""

    def consumers(self) -> dict[str, int]:
        """The epoch each consumer's rank opened last, by record: ``{"train": 7, "train@1": 6}``.

        See :func:`pgprefetch.store.consumers.positions` for the records that count.
        """
        return positions(self.consumer_records())

    # --- category vocabularies ----------------------------------------------------------------------------
    def vocabulary(self) -> dict[str, list[str]]:
        """The store's vocabulary of each ``categories = "auto"`` field: code ``i`` is ``vocabulary[field][i]``.

        It belongs to the store, not to an epoch, so that a code keeps its meaning in every epoch of the
        store: it outlives the epochs (``prune`` and ``--keep`` delete none of it), and it only ever grows at
        the end (:meth:`grow_vocabulary`). Empty before the first dump of a store.
        """
        owner = self.parent or self  # the splits of a store share its vocabulary: a code means one value in each
        return _parse_vocabulary(owner.read(VOCABULARY), owner.location)

    def grow_vocabulary(self, grow: Callable[[dict[str, list[str]]], dict[str, list[str]]]) -> dict[str, list[str]]:
        """Replace the vocabulary by ``grow(current)``, atomically, and return what the store now holds.

        Dumps of different epochs hold different locks and may plan at the same moment, so this is a
        compare-and-swap (:meth:`swap`): ``grow`` may run more than once, on the vocabulary another dump
        has just extended, and it must not write anything itself. What it returns for a field must begin
        with the field's current vocabulary (codes are appended, never moved or dropped): anything else is
        refused, and ``grow`` raising leaves the vocabulary as it was.
        """

        def change(raw: bytes | None) -> bytes:
            current = _parse_vocabulary(raw, self.location)
            grown = {**current, **grow(current)}
            for name, values in current.items():
                if grown[name][: len(values)] != values:
                    raise StoreError(f"{self.location}: [fields.{name}] categories: a store's codes only grow")
            if grown == current and raw is not None:
                return raw  # nothing new: nothing written
            return (json.dumps({"format_version": FORMAT_VERSION, "fields": grown}, ensure_ascii=False) + "\n").encode()

        owner = self.parent or self
        return _parse_vocabulary(owner.swap(VOCABULARY, change), owner.location)

    @abc.abstractmethod
    def swap(self, key: str, change: Callable[[bytes | None], bytes]) -> bytes:
        """Replace the small object ``key`` by ``change(its bytes, or None)`` atomically; return the bytes kept.

        A concurrent swap of ``key`` is never lost: ``change`` runs again on what that one wrote. When
        ``change`` returns the bytes unchanged, nothing is written.
        """


def _parse_vocabulary(raw: bytes | None, location: str) -> dict[str, list[str]]:
    """The vocabularies of a ``categories.json``; a damaged one is an error, never an empty vocabulary.

    Starting over from nothing would give existing codes new meanings, which is what the record prevents.
    """
    if raw is None:
        return {}
    try:
        record = json.loads(raw)
        version, fields = record["format_version"], record["fields"]
    except (ValueError, KeyError, TypeError):
        raise StoreError(f"{location}/{VOCABULARY} is damaged; restore it from a backup") from None
    if version != FORMAT_VERSION:
        raise FormatVersionError(
            f"{location}/{VOCABULARY} has format version {version}; this pgprefetch reads version {FORMAT_VERSION}"
        )
    if not isinstance(fields, dict) or not all(
        isinstance(v, list) and all(isinstance(c, str) for c in v) for v in fields.values()
    ):
        raise StoreError(f"{location}/{VOCABULARY} is damaged; restore it from a backup")
    return fields


def epochs_in(names: Iterator[str]) -> list[int]:
    """The epoch numbers among folder (prefix) names."""
    found = (EPOCH.fullmatch(n) for n in names)
    return sorted(int(m[1]) for m in found if m)
