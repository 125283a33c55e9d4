"""The cache of deterministic transforms' outputs: one SQLite file, entries addressed by what made them.

An entry's address is ``(fingerprint, digest)``: the fingerprint hashes the transform's code, ``version``,
options and output declarations (:func:`~pgprefetch.write.transform.loading.fingerprint`); the digest is
the server's SHA-256 of the sample's input values (``sha256(record_send(ROW(inputs)))``). So an entry is
found again whatever the epoch, the order, the worker count or the key, and an edited row, function or
``version`` addresses a new entry: exactly what changed is recomputed, nothing is invalidated by hand.

Each entry carries the CRC-32 of its bytes; an entry that does not match (a damaged disk, a hand edit) is
deleted and recomputed, never used. SQLite, from the standard library, because it gives what a cache shared
by runs needs and a hand-written file would have to earn: atomic commits (a dump killed mid-write leaves
the cache as of its last commit), readers beside a writer (WAL; two dumps on one store wait on each
other's commits, not on a lock file), and lookups by key without an index in memory. Its page cache is
capped (``CACHE_KIB``): a fixed cost within ``--memory``'s slack, as the interpreter's own are.

The file lives in the store's own folder (``<store>/.pgprefetch/transforms/``) for a local store, so that it goes
where the epochs go, a failed first dump's store goes with it, and ``pgprefetch cache --clear`` finds it; for an
object store, in ``--scratch``'s folder, else
in ``$XDG_CACHE_HOME/pgprefetch`` (``~/.cache``) under a hash of the store's URL: an object store has no
place for a file updated a row at a time.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import stat
import threading
import urllib.request
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.errors import StoreError
from pgprefetch.store.base import META_DIR, Store
from pgprefetch.write.transform.outputs import Packed

FILE = "transforms.sqlite3"
FOLDER = f"{META_DIR}/transforms"  # in a local store's own folder: it goes where the store goes
CACHE_KIB = 4096  # SQLite's page cache: what the cache holds of --memory
_SIDE_FILES = ("", "-wal", "-shm", "-journal")
SCHEMA_VERSION = 1  # the file's layout (SQLite's user_version): a file of another layout is refused
_SCHEMA = """
CREATE TABLE IF NOT EXISTS transforms (
    id INTEGER PRIMARY KEY AUTOINCREMENT, fingerprint TEXT NOT NULL UNIQUE, name TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS outputs (
    id INTEGER PRIMARY KEY, transform INTEGER NOT NULL, digest BLOB NOT NULL,
    data BLOB NOT NULL, crc INTEGER NOT NULL, error TEXT
);
CREATE UNIQUE INDEX IF NOT EXISTS outputs_by_digest ON outputs (transform, digest);
"""
_LOOKUP = 500  # digests per lookup statement (well under SQLite's bound-parameter limit)


def stored_counts(store_root: Path) -> tuple[Path, list[CacheCount]] | None:
    """The cache of the local store at ``store_root`` and its counts, if it has one (``ls``)."""
    folder = store_root / FOLDER
    if not (folder / FILE).exists():
        return None
    with TransformCache.open(folder, create=False, read_only=True) as cache:
        return cache.path, cache.counts()


def transforms_folder(cfg: Config, store: Store, *, local: bool = False) -> Path:
    """Where ``store``'s transform cache lives: in a local store (the root's, for a split), else on local disk.

    ``local``: on this machine's disk whatever the store (a Ray part on a node other than the driver's).
    """
    root = store.parent or store
    return cache_folder(None if local else root.local_root, str(root.location), cfg.source.scratch)


def cache_folder(store_root: Path | None, store_url: str, scratch: Path | None) -> Path:
    """Where a store's transform cache lives (see the module's doc)."""
    if store_root is not None:
        return store_root / FOLDER
    base = scratch if scratch is not None else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "pgprefetch" / hashlib.sha256(store_url.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class CacheCount:
    """What a transform's cache holds."""

    name: str
    fingerprint: str
    entries: int
    nbytes: int

    def to_json(self) -> dict[str, object]:
        """As ``cache --json`` and ``ls --json`` print it."""
        return {"name": self.name, "fingerprint": self.fingerprint, "entries": self.entries, "bytes": self.nbytes}


class TransformCache:
    """One open cache file; safe to call from the dump's threads (one statement at a time).

    A transform's entries are rows of a plain table keyed by an index on (its number, the digest): the rows hold
    kilobytes each, and SQLite finds them through a small index much faster than in a table clustered on a
    text fingerprint (42 ms against 110 ms for 9,134 lookups of 1.3 kB entries, docs/benchmarks.md).
    """

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self._ids: dict[str, int] = {}  # each fingerprint's number in the file
        self.path = path
        self.damaged = 0  # entries found damaged (and deleted) since it was opened

    @classmethod
    @contextmanager
    def open(cls, folder: Path, *, create: bool = True, read_only: bool = False) -> Iterator[TransformCache]:
        """The cache in ``folder`` (made if ``create``); a link where the folder or its files are is refused.

        ``read_only``: for counting (``ls``), on a store this user may not write.
        """
        _refuse_links(folder, create and not read_only)
        path = folder / FILE
        try:
            where = f"file:{urllib.request.pathname2url(str(path))}?mode=ro" if read_only else str(path)
            conn = sqlite3.connect(where, timeout=60, check_same_thread=False, isolation_level=None, uri=read_only)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open the transform cache {path}: {e}") from None
        try:
            conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
            conn.execute("PRAGMA mmap_size = 0")
            _layout(conn, path, read_only)
            cache = cls(conn, path)
        except sqlite3.DatabaseError as e:
            conn.close()
            raise StoreError(
                f"the transform cache {path} is not readable ({e}); remove it: pgprefetch cache --clear"
            ) from None
        try:
            yield cache
        finally:
            with cache._lock:  # a thread still in a call (a unit of a failed dump) finishes it first
                conn.close()

    def get(self, fingerprint: str, digests: Sequence[bytes]) -> dict[bytes, bytes]:
        """The entries of ``digests`` that are there and whole; a damaged one is deleted and left out."""
        return self.lookup(fingerprint, digests)[0]

    def lookup(self, fingerprint: str, digests: Sequence[bytes]) -> tuple[dict[bytes, bytes], dict[bytes, str]]:
        """The outputs of ``digests`` that are there and whole, and the inputs recorded as failing (their errors).

        A failure is recorded by an ``on_error = "skip"`` transform (:meth:`put_failures`), so that later epochs
        leave the sample out without running the function on it again. A damaged entry is deleted, left out.
        """
        found: dict[bytes, bytes] = {}
        failed: dict[bytes, str] = {}
        damaged = []
        with self._lock:
            number = self._number(fingerprint, None)
            if number is None:
                return found, failed
            for i in range(0, len(digests), _LOOKUP):
                chunk = list(dict.fromkeys(digests[i : i + _LOOKUP]))
                marks = ",".join("?" * len(chunk))
                sql = f"SELECT digest, data, crc, error FROM outputs WHERE transform = ? AND digest IN ({marks})"
                for digest, data, crc, error in self._conn.execute(sql, (number, *chunk)):
                    if zlib.crc32(data) != crc or (error is not None and data):
                        damaged.append(digest)
                    elif error is not None:
                        failed[digest] = error
                    else:
                        found[digest] = data
            if damaged:
                forget = "DELETE FROM outputs WHERE transform = ? AND digest = ?"
                self._conn.executemany(forget, [(number, d) for d in damaged])
                self.damaged += len(damaged)
        return found, failed

    def put(self, name: str, fingerprint: str, entries: Sequence[tuple[bytes, bytes]]) -> None:
        """Add ``(digest, data)`` entries in one commit (an entry already there is kept)."""
        self._insert(name, fingerprint, [(digest, data, zlib.crc32(data), None) for digest, data in entries])

    def put_failures(self, name: str, fingerprint: str, failures: Sequence[tuple[bytes, str]]) -> None:
        """Record ``(digest, error)``: inputs the transform fails on (no output; its error, for the record)."""
        self._insert(name, fingerprint, [(digest, b"", zlib.crc32(b""), e) for digest, e in failures])

    def _insert(self, name: str, fingerprint: str, rows: Sequence[tuple[object, ...]]) -> None:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._ids.pop(fingerprint, None)  # looked up again in this transaction: a clear may have run since
                number = self._number(fingerprint, name)
                self._conn.executemany(
                    "INSERT OR IGNORE INTO outputs (transform, digest, data, crc, error) VALUES (?, ?, ?, ?, ?)",
                    [(number, *row) for row in rows],
                )
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _number(self, fingerprint: str, name: str | None) -> int | None:
        """The fingerprint's number in the file; with ``name``, made if it has none (in the caller's transaction)."""
        if fingerprint in self._ids:
            return self._ids[fingerprint]
        row = self._conn.execute("SELECT id FROM transforms WHERE fingerprint = ?", (fingerprint,)).fetchone()
        if row is None and name is not None:
            row = self._conn.execute(
                "INSERT INTO transforms (fingerprint, name) VALUES (?, ?) RETURNING id", (fingerprint, name)
            ).fetchone()
        if row is not None:
            self._ids[fingerprint] = int(row[0])
        return None if row is None else int(row[0])

    def counts(self) -> list[CacheCount]:
        """Each transform's entries and bytes (a transform edited since holds one count per fingerprint)."""
        sql = (
            "SELECT t.name, t.fingerprint, count(o.id), coalesce(sum(length(o.data)), 0) FROM transforms t "
            "LEFT JOIN outputs o ON o.transform = t.id GROUP BY t.id ORDER BY t.name, t.id"
        )
        with self._lock:
            return [CacheCount(*row) for row in self._conn.execute(sql)]

    def clear(self, names: Sequence[str] = ()) -> int:
        """Remove the entries of transforms ``names`` (all if empty); returns how many went."""
        where, args = (f"WHERE name IN ({','.join('?' * len(names))})", tuple(names)) if names else ("", ())
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            numbers = [r[0] for r in self._conn.execute(f"SELECT id FROM transforms {where}", args)]
            removed = 0
            for number in numbers:
                removed += self._conn.execute("DELETE FROM outputs WHERE transform = ?", (number,)).rowcount
                self._conn.execute("DELETE FROM transforms WHERE id = ?", (number,))
            self._conn.execute("COMMIT")
            self._ids.clear()
            self._conn.execute("VACUUM")
        return removed


def remove_cache(folder: Path) -> bool:
    """Remove the cache file in ``folder`` whole, whatever it holds (``cache --clear``); whether there was one."""
    _refuse_links(folder, create=False)
    there = (folder / FILE).exists()
    for side in _SIDE_FILES:
        with contextlib.suppress(FileNotFoundError):
            (folder / f"{FILE}{side}").unlink()
    return there


def _layout(conn: sqlite3.Connection, path: Path, read_only: bool) -> None:
    """Make a new file's tables (WAL), or check an existing file is of this layout."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == SCHEMA_VERSION or (read_only and version == 0):
        return
    if version != 0:
        raise StoreError(
            f"the transform cache {path} has another layout ({version}, this pgprefetch writes {SCHEMA_VERSION}); "
            "remove it: pgprefetch cache --clear"
        )
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript(f"BEGIN; {_SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;")


def _refuse_links(folder: Path, create: bool) -> None:
    """The cache's folder made (0700) if need be; neither it, the folder it is in, nor its files a link.

    A link planted where the cache is (or where a local store's ``.pgprefetch`` is) would have SQLite write
    wherever it points; it is refused instead.
    """
    for path in (folder.parent, folder):
        if path.is_symlink():
            raise StoreError(f"refusing the transform cache: {path} is a link")
    if create:
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot make the transform cache's folder {folder}: {e.strerror or e}") from None
    for path in (folder.parent, folder, *(folder / f"{FILE}{side}" for side in _SIDE_FILES)):
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise StoreError(f"refusing the transform cache: {path} is a link")
        if path != folder.parent and (st.st_uid != os.geteuid() or st.st_mode & 0o002):
            # (in a shared --scratch such as /tmp, a file another user made could hold outputs of their choosing)
            raise StoreError(
                f"refusing the transform cache: {path} belongs to uid {st.st_uid} or anyone may write it; "
                "remove it, or give --scratch a folder of your own"
            )


def encode_entries(fields: Sequence[str], outputs: dict[str, Packed], positions: np.ndarray) -> list[bytes]:
    """Each sample at ``positions`` of ``outputs`` as one entry: its lengths (int64 per field), then its values."""
    starts = {f: outputs[f].starts for f in fields}
    out = []
    for i in positions.tolist():
        lengths = [int(outputs[f].lengths[i]) for f in fields]
        parts = [np.asarray(lengths, np.int64).tobytes()]
        for f, n in zip(fields, lengths, strict=True):
            s = int(starts[f][i])
            parts.append(outputs[f].values[s : s + n].tobytes())
        out.append(b"".join(parts))
    return out


def decode_entries(fields: Sequence[str], dtypes: Sequence[np.dtype], entries: Sequence[bytes]) -> dict[str, Packed]:
    """The entries' outputs packed per field (the inverse of :func:`encode_entries`), in a few array operations.

    The entries are joined once; each one's lengths header and each field's values are gathered by index
    arrays, not sliced an entry at a time: a cached epoch decodes every sample it writes.
    """
    k = len(fields)
    if not entries:
        return {f: Packed(np.zeros(0, dtypes[j]), np.zeros(0, np.int64)) for j, f in enumerate(fields)}
    raw = np.frombuffer(b"".join(entries), np.uint8)
    sizes = np.fromiter(map(len, entries), np.int64, len(entries))
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    header = raw[starts[:, None] + np.arange(8 * k)].copy().view(np.int64)  # (n, k): each field's length
    at = starts + 8 * k  # where each entry's first field's values begin
    out = {}
    for j, (f, dtype) in enumerate(zip(fields, dtypes, strict=True)):
        nbytes = header[:, j] * dtype.itemsize
        index = np.repeat(at - np.concatenate(([0], np.cumsum(nbytes)[:-1])), nbytes) + np.arange(nbytes.sum())
        out[f] = Packed(raw[index].view(dtype), header[:, j].copy())
        at = at + nbytes
    return out
