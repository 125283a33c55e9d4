"""Uploading a staged epoch to an object store: a few threads, resumable, bounded in memory.

Used by :class:`pgprefetch.store.s3.S3Store`: while a dump runs, each file the writer finishes is
submitted here; at publication, whatever is left. Every upload is logged beside the journal (size,
CRC32C, mtime), so a rerun after ``kill -9`` does not send unchanged files again.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import google_crc32c

from pgprefetch.store.base import Uploader, epoch_name
from pgprefetch.store.objects import ObjectStore

UPLOAD_THREADS = 4  # files in flight; each is read whole (a shard, about 64 MiB) before its PUT


def upload_log(partial: Path) -> Path:
    """The upload log beside a staged epoch: each uploaded file with its size, CRC32C and mtime."""
    return partial.with_name(f"{partial.name}.uploads")


class Uploads(Uploader):
    """Uploads the files of a staged epoch from a few threads, skipping those already uploaded unchanged.

    ``submit`` waits while ``UPLOAD_THREADS`` uploads are in flight, so memory stays bounded (each reads its
    file whole). Leaving the block waits for every upload and raises the first failure.
    """

    def __init__(self, store: ObjectStore, epoch: int) -> None:
        self.store = store
        self.epoch = epoch
        self.partial = store.partial_path(epoch)
        self.prefix = epoch_name(epoch)
        self.log_path = upload_log(self.partial)
        self._done: dict[str, tuple[int, int, int]] = {}  # relative path -> (size, CRC32C, mtime in ns)
        with contextlib.suppress(OSError, UnicodeDecodeError):
            for line in self._read_log().splitlines():
                parts = line.rsplit(" ", 3)
                if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
                    self._done[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]))
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(UPLOAD_THREADS)
        self._pool = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="pgprefetch-upload")
        self._futures: list[Future[None]] = []

    def _read_log(self) -> str:
        """The upload log, read through the staging folder's descriptors (no link followed); empty if none."""
        staged = self.store.place(self.log_path.parent).find()
        if staged is None:
            return ""
        with staged:
            return (staged.read(self.log_path.name) or b"").decode()

    def __enter__(self) -> Uploads:
        return self

    def __exit__(self, kind: object, error: object, tb: object) -> None:
        if kind is not None:  # the dump failed: what is in flight may finish, nothing new starts
            self._pool.shutdown(wait=True, cancel_futures=True)
            return
        self.finish()

    def finish(self) -> None:
        """Wait for every upload; raise the first failure."""
        self._pool.shutdown(wait=True)
        for future in self._futures:
            future.result()

    def submit(self, path: Path) -> None:
        """Upload ``path`` on a pool thread, once fewer than ``UPLOAD_THREADS`` are in flight."""
        for future in self._futures:
            if future.done() and future.exception() is not None:
                future.result()  # fail the dump early
        self._slots.acquire()
        future = self._pool.submit(self._upload, path)
        future.add_done_callback(lambda _: self._slots.release())
        self._futures = [f for f in self._futures if not f.done() or f.exception() is not None] + [future]

    def _upload(self, path: Path) -> None:
        lease = self.store.held_lease(self.epoch)
        if lease is not None:
            lease.check()  # a dump that lost its lease must not write into the epoch another dump now owns
        relative = path.relative_to(self.partial).as_posix()
        key = f"{self.prefix}/{relative}"
        # Through the staged epoch's descriptors, no link followed: a link (or FIFO) planted for a staged
        # file, or for a folder on the way, is refused in one line, never uploaded as the epoch's bytes.
        with self.store.place(self.partial).open() as epoch, os.fdopen(epoch.open(relative, os.O_RDONLY), "rb") as f:
            stat = os.fstat(f.fileno())
            done = self._done.get(relative)
            if done and (done[0], done[2]) == (stat.st_size, stat.st_mtime_ns) and self.store.size(key) == done[0]:
                return  # uploaded earlier (by this dump, or one that was killed), untouched since: not read again
            data = f.read()
        crc = google_crc32c.value(data)
        if done and done[:2] == (len(data), crc) and self.store.size(key) == len(data):
            return  # rewritten with the same bytes (a resumed dump's journal check)
        self.store.put(key, data)
        line = f"{relative} {len(data)} {crc} {stat.st_mtime_ns}\n".encode()
        with self._lock, self.store.place(self.log_path.parent).open(create=True) as staged:
            fd = staged.open(self.log_path.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            with os.fdopen(fd, "ab") as log:
                log.write(line)
