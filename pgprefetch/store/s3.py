"""The object-store backend: a store under ``s3://bucket/prefix``, through obstore (see :mod:`pgprefetch.store.base`).

- **Configuration** comes from the standard AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
  ``AWS_SESSION_TOKEN``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL``), which obstore reads;
  an ``http://`` endpoint (a local S3 server, MinIO) is allowed when that is what the variable names.
- **Writing.** An epoch is written into a local staging folder (``PGPREFETCH_STAGING``, by default
  ``~/.cache/pgprefetch/staging``), as for a local store, so a killed dump resumes from its journal. Each
  shard file is uploaded as soon as its last batch is written, while the dump goes on (:class:`Uploads`);
  publishing uploads what is left and then the epoch's ``zarr.json``, which holds the manifest, last and
  with ``If-None-Match: *``. Objects are the files' bytes, unchanged, each sent in one PUT (a shard is
  about 64 MiB), so no multipart upload is ever left behind. Staging takes one epoch of local disk.
- **Resuming.** Every upload is logged beside the journal with the file's size and CRC32C; a rerun skips
  files whose bytes are unchanged and whose object is there with that size.
- **Deleting** (``prune``) removes the epoch's ``zarr.json`` first: a reader never sees half an epoch.
- **Locks** are leases (:mod:`pgprefetch.store.lease`), and a ``flock`` on the staging folder.
- **Errors** are mapped here, once, to one line that names the store and never a secret.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import obstore
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    PreconditionError,
)

from pgprefetch.config.values import store_location
from pgprefetch.errors import StoreError, StoreNotFoundError
from pgprefetch.store.base import (
    META_DIR,
    ROOT_ATTRIBUTES,
    SPILL_SUFFIXES,
    Store,
    Uploader,
    epoch_name,
    epochs_in,
)
from pgprefetch.store.consumers import consumer_record, record_name
from pgprefetch.store.flock import holding
from pgprefetch.store.folders import Place
from pgprefetch.store.lease import NOT_FOUND, Lease, lease_holder, object_version
from pgprefetch.store.s3errors import allows_http, checked_endpoint, is_panic, s3_error
from pgprefetch.store.staging import folder_bytes, staged_epochs
from pgprefetch.store.uploads import Uploads, upload_log
from pgprefetch.store.zarrjson import group_json

if TYPE_CHECKING:
    from obstore import ObjectMeta
    from obstore.store import BackoffConfig

_RUNTIME_PID: int | None = None  # the process whose obstore runtime is in use (see S3Store.client)
SWAP_ATTEMPTS = 20  # a store-level record changed by that many other dumps in a row: something is wrong


def staging_name(location: str) -> str:
    """The staging folder's name for the store at ``location`` (normalised): readable, and one per store.

    The prefix with "/" spelt "__" alone would give ``s3://b/coll/a`` and ``s3://b/coll__a`` one folder,
    and a dump of one would then be skipped as "another dump is writing it"; a hash of the whole location
    tells them apart.
    """
    prefix = location.removeprefix("s3://").partition("/")[2]
    digest = hashlib.sha256(location.encode()).hexdigest()[:12]
    return f"{prefix.replace('/', '__') or '_'}-{digest}"


class S3Store(Store):
    """Epochs under ``s3://bucket/prefix``."""

    @property
    def object_store(self) -> S3Store:
        """An object store: itself."""
        return self

    def __init__(self, location: str) -> None:
        self.location = str(store_location(location, "store"))  # s3://bucket/prefix, normalised
        self.bucket, _, self.prefix = self.location.removeprefix("s3://").partition("/")
        self._client: Any = None
        self._leases: dict[int, Lease] = {}

    def sub_store(self, relative: str) -> S3Store:
        return S3Store(f"{self.location}/{relative}")

    def __getstate__(self) -> dict[str, Any]:  # DataLoader workers open their own client
        state = {"location": self.location, "bucket": self.bucket, "prefix": self.prefix, "_client": None}
        return state | {"_leases": {}, "parent": self.parent, "split_name": self.split_name}

    @property
    def client(self) -> Any:
        """The obstore client, made on first use.

        obstore runs its requests on one runtime per process, whose threads a ``fork`` does not copy: a
        forked process (a DataLoader worker under the default start method) whose parent used obstore
        would hang on its first request. That is refused with the way out instead.
        """
        global _RUNTIME_PID
        if _RUNTIME_PID not in (None, os.getpid()):
            raise StoreError(
                f"{self.location}: this process was forked from one that had used the object store, which "
                "obstore cannot do; for DataLoader workers pass multiprocessing_context='spawn'"
            )
        if self._client is None:
            endpoint = checked_endpoint(self.location)
            _RUNTIME_PID = os.getpid()
            # Long enough to wait out seconds of throttling (503 SlowDown) or a restarting server, which a
            # training run must survive: each wait is drawn between 0.1 s and 3x the last (at most 8 s), so
            # 10 retries take about 10 s (3-35 s); 6 at base 2 took about 1 s, which the soak's throttling outlasted.
            retries = int(os.environ.get("PGPREFETCH_S3_RETRIES", "10"))
            backoff: BackoffConfig = {
                "init_backoff": timedelta(milliseconds=100),
                "max_backoff": timedelta(seconds=8),
                "base": 3,
            }
            with self._errors("making the S3 client"):
                self._client = obstore.store.S3Store(
                    self.bucket,
                    prefix=self.prefix or None,
                    client_options={"allow_http": allows_http(endpoint),
                                    "connect_timeout": "5s", "timeout": "120s"},
                    retry_config={"max_retries": retries, "backoff": backoff, "retry_timeout": timedelta(minutes=2)},
                )  # fmt: skip
        return self._client

    # --- errors, mapped once --------------------------------------------------------------------------
    def _fail(self, e: BaseException, what: str) -> NoReturn:
        raise s3_error(e, what, self.location, self.bucket) from None

    @contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        try:
            yield
        except (BaseError, OSError) as e:
            if isinstance(e, NOT_FOUND) and "NoSuchBucket" not in str(e):
                raise
            self._fail(e, what)
        except BaseException as e:  # a Rust panic is a BaseException: one line too, not a traceback
            if not is_panic(e):
                raise
            self._fail(e, what)

    def _head(self, key: str) -> ObjectMeta | None:
        with self._errors(f"looking up {key}"):
            try:
                return obstore.head(self.client, key)
            except NOT_FOUND:
                return None

    def _list(self, prefix: str) -> list[ObjectMeta]:
        with self._errors(f"listing {prefix}"):
            return [meta for chunk in obstore.list(self.client, prefix) for meta in chunk]

    def _delete(self, keys: list[str]) -> None:
        with self._errors("deleting"):
            for i in range(0, len(keys), 1000):  # S3's DeleteObjects takes 1,000 keys a request
                obstore.delete(self.client, keys[i : i + 1000])

    # --- the store as a whole ---------------------------------------------------------------------------
    def exists(self) -> bool:
        return self._head("zarr.json") is not None

    def require(self) -> Store:
        if not self.exists():
            with self._errors("listing the store"):  # a missing bucket says so (a HEAD's 404 does not)
                obstore.list_with_delimiter(self.client, None)
            raise StoreNotFoundError(f"no store at {self.location} (nothing there, or not a pgprefetch store)")
        return self

    def create(self, parents: bool = False) -> None:
        if self.exists():
            return
        with self._errors("listing the store"):
            top = obstore.list_with_delimiter(self.client, None)
        if top["objects"] or any(p.rstrip("/") != META_DIR for p in top["common_prefixes"]):
            raise StoreError(f"{self.location} holds objects but is not a pgprefetch store")
        root = group_json(ROOT_ATTRIBUTES)  # zarr's own bytes for the root group
        with self._errors("creating the store"), contextlib.suppress(AlreadyExistsError):
            obstore.put(self.client, "zarr.json", root, mode="create")

    def remove_if_unused(self) -> None:
        """Nothing: a dump on another host may be starting in this store (its lease not taken yet).

        An empty store is a single small object; deleting it could pull the root from under that dump.
        """

    # --- epochs -------------------------------------------------------------------------------------------
    def _remote_epochs(self) -> list[int]:
        with self._errors("listing epochs"):
            top = obstore.list_with_delimiter(self.client, None)
        return epochs_in(p.rstrip("/").rsplit("/", 1)[-1] for p in top["common_prefixes"])

    def epochs(self) -> list[int]:
        return [e for e in self._remote_epochs() if self.is_complete(e)]

    def partial_epochs(self) -> list[int]:
        local = set(staged_epochs(self.place(self.staging / "partial")))
        remote = {e for e in self._remote_epochs() if not self.is_complete(e)}
        return sorted(local | remote)

    def read(self, key: str) -> bytes | None:
        with self._errors(f"reading {key}"):
            try:
                return bytes(obstore.get(self.client, key).bytes())
            except NOT_FOUND:
                return None

    def read_range(self, key: str, start: int, length: int) -> Any:
        """The range as obstore's ``Bytes`` (a buffer numpy views without a copy)."""
        with self._errors(f"reading {key}"):
            try:
                return obstore.get_range(self.client, key, start=start, length=length)
            except NOT_FOUND:
                raise StoreError(f"{self.location}/{key}: the object is missing (the epoch is damaged)") from None

    def size(self, key: str) -> int | None:
        meta = self._head(key)
        return None if meta is None else int(meta["size"])

    def epoch_bytes(self, epoch: int) -> int:
        return sum(int(m["size"]) for m in self._list(epoch_name(epoch)))

    def remove_epoch(self, epoch: int) -> None:
        """The manifest (``zarr.json``) first, so a reader that finds the epoch finds all of it."""
        name = epoch_name(epoch)
        self._delete([f"{name}/zarr.json"])
        self._delete([m["path"] for m in self._list(name)])

    def zarr_store(self) -> Any:
        import zarr.storage  # here: a dump of an uncompressed epoch never opens an array through zarr

        return zarr.storage.ObjectStore(self.client, read_only=True)

    # --- writing ------------------------------------------------------------------------------------------
    @property
    def staging(self) -> Path:
        """The local folder this store's epochs are written into before they are uploaded."""
        root = Path(os.environ.get("PGPREFETCH_STAGING") or Path.home() / ".cache" / "pgprefetch" / "staging")
        return root / self.bucket / staging_name(self.location)

    def partial_path(self, epoch: int) -> Path:
        return self.staging / "partial" / epoch_name(epoch)

    def place(self, path: Path) -> Place:
        return Place.under(self.staging, path, make_anchor=True)

    def partial_info(self, epoch: int) -> tuple[int, float]:
        remote = self._list(epoch_name(epoch))
        mtime = max((m["last_modified"].timestamp() for m in remote), default=0.0)
        for path in (self.journal_path(epoch), self.partial_path(epoch)):
            with contextlib.suppress(OSError):
                mtime = max(mtime, path.stat().st_mtime)
        return folder_bytes(self.partial_path(epoch)) + sum(int(m["size"]) for m in remote), mtime

    def remove_partial(self, epoch: int) -> None:
        spills = [self.partial_path(epoch).with_name(f"{epoch_name(epoch)}{suffix}") for suffix in SPILL_SUFFIXES]
        for path in (*spills, self.journal_path(epoch)):
            self.place(path).remove()  # no link followed below the staging folder (store.folders)
        self.remove_partial_staging(epoch)
        if not self.is_complete(epoch):
            self._delete([m["path"] for m in self._list(epoch_name(epoch))])

    @contextmanager
    def uploader(self, epoch: int) -> Iterator[Uploader | None]:
        if self.is_complete(epoch):  # --force: uploading now would change a published epoch under its readers
            yield None
            return
        with Uploads(self, epoch) as uploads:
            yield uploads

    def publish(self, epoch: int, partial: Path, replace: bool = False, elsewhere: Collection[str] = ()) -> str:
        """Upload what is left, drop objects that are not the epoch's, then write the manifest, last.

        An epoch already complete is replaced only when asked (``--force``), and its manifest goes first.
        """
        lease = self.held_lease(epoch)
        if lease is not None:
            lease.check()
        name = epoch_name(epoch)
        if self.is_complete(epoch):
            if not replace:
                raise StoreError(f"{self.location}/{name} was published by another dump meanwhile")
            self.remove_epoch(epoch)
        with Uploads(self, epoch) as uploads:
            for path in sorted(partial.rglob("*")):
                if path.is_file() and path != partial / "zarr.json":
                    uploads.submit(path)
        # Objects of an earlier, abandoned attempt at this epoch (another config, a restarted partial epoch)
        # must not end up inside it.
        mine = {f"{name}/{p.relative_to(partial).as_posix()}" for p in partial.rglob("*") if p.is_file()}
        mine.update(f"{name}/{relative}" for relative in elsewhere)
        self._delete([m["path"] for m in self._list(name) if m["path"] not in mine])
        if lease is not None and not lease.renew():  # the lease is ours now, and for the next seconds
            lease.check()
        with self._errors(f"publishing {name}"):
            try:
                obstore.put(self.client, f"{name}/zarr.json", (partial / "zarr.json").read_bytes(), mode="create")
            except AlreadyExistsError:
                raise StoreError(f"{self.location}/{name} was published by another dump meanwhile") from None
        self.remove_partial_staging(epoch)
        return str(self.epoch_location(epoch))  # a URL: only a local store's is a Path

    def remove_partial_staging(self, epoch: int) -> None:
        """Delete the local staging of an epoch that is published."""
        self.place(self.partial_path(epoch)).remove()
        self.place(upload_log(self.partial_path(epoch))).remove()

    def sizes(self, prefix: str) -> dict[str, int]:
        """Every object under ``prefix`` (one listing), its key relative to the store, with its size."""
        return {m["path"]: int(m["size"]) for m in self._list(prefix)}

    def delete(self, keys: list[str]) -> None:
        """Delete ``keys`` (absent ones too: S3 deletes are idempotent)."""
        if keys:
            self._delete(keys)

    def put(self, key: str, data: bytes) -> None:
        """Upload ``data`` to ``key`` in one request (the shards are about 64 MiB: no multipart)."""
        with self._errors(f"uploading {key}"):
            obstore.put(self.client, key, data, use_multipart=False)

    def held_lease(self, epoch: int) -> Lease | None:
        """The lease this process holds on ``epoch`` while it writes it, if any."""
        return self._leases.get(epoch)

    def _lease_key(self, epoch: int) -> str:
        return f"{META_DIR}/locks/{epoch_name(epoch)}.lease"

    @contextmanager
    def writer_lock(self, epoch: int) -> Iterator[bool]:
        """The epoch's staging folder on this machine (a ``flock``), then the epoch's lease in the store.

        The lease keeps dumps on different machines apart, and a dead holder's is taken over once it
        expires. On one machine the staging folder is shared, and a holder that only stalled past its lease
        (stopped, swapping) would go on writing into it under the dump that took over: the ``flock`` keeps
        it, as it keeps a local store's epoch, until its holder ends.
        """
        with (
            self.place(self.staging / "locks").open(create=True) as locks,
            holding(locks, f"{epoch_name(epoch)}.lock") as mine,
        ):
            if not mine:
                yield False
                return
            lease = Lease(self.client, self._lease_key(epoch), f"{self.location}/{epoch_name(epoch)}")
            with self._errors("taking the epoch's lease"):
                held = lease.acquire()
            if not held:
                yield False
                return
            self._leases[epoch] = lease
            try:
                yield True
            finally:
                del self._leases[epoch]
                lease.release()

    def lock_holder(self, epoch: int) -> str:
        return lease_holder(self.client, self._lease_key(epoch))

    # --- consumers ----------------------------------------------------------------------------------------
    def record_consumer(self, name: str, epoch: int, rank: int = 0, world: int = 1) -> None:
        record = consumer_record(name, epoch, rank, world)
        with self._errors("recording the consumer"):
            obstore.put(self.client, f"{META_DIR}/consumers/{record_name(name, rank)}.json", record)

    def swap(self, key: str, change: Callable[[bytes | None], bytes]) -> bytes:
        """Read ``key`` and its version, put the change ``If-Match`` it; if another swap came first, redo it.

        A key not there yet is created with ``If-None-Match: *``, so two first writers cannot both succeed.
        """
        for _ in range(SWAP_ATTEMPTS):
            with self._errors(f"reading {key}"):
                try:
                    current = obstore.get(self.client, key)
                    old: bytes | None = bytes(current.bytes())
                    mode: Any = object_version(current.meta)
                except NOT_FOUND:
                    old, mode = None, "create"
            if not mode:  # no ETag: a conditional put could not protect a concurrent swap
                raise StoreError(f"{self.location}: the object store gives {key} no ETag; cannot update it safely")
            new = change(old)
            if new == old:
                return new
            with self._errors(f"writing {key}"):
                try:
                    obstore.put(self.client, key, new, mode=mode)
                    return new
                except (PreconditionError, AlreadyExistsError):
                    pass  # another dump swapped it meanwhile: change what it wrote
        raise StoreError(f"{self.location}: {key} kept changing under {SWAP_ATTEMPTS} attempts to update it")

    def consumer_records(self) -> dict[str, bytes]:
        records = {}
        for meta in self._list(f"{META_DIR}/consumers"):
            path = meta["path"]
            raw = self.read(path) if path.endswith(".json") else None
            if raw is not None:
                records[path.rsplit("/", 1)[-1].removesuffix(".json")] = raw
        return records

    def remove_consumer_record(self, record: str) -> None:
        with self._errors("removing the consumer's record"):
            obstore.delete(self.client, f"{META_DIR}/consumers/{record}.json")
