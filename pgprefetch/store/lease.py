"""One writer per epoch on object storage: a lease object, taken with a conditional put and kept renewed.

A bucket has no ``flock``, and nothing a crashed holder leaves behind goes away by itself, so the lock is
a lease: ``.pgprefetch/locks/epoch-00003.lease`` names its holder (host, pid) and an expiry time. It is
created with ``If-None-Match: *``, so of two dumps only one gets it; the holder rewrites it every third of
its lifetime with ``If-Match`` on the version it wrote last, so nobody can renew a lease they do not hold;
and a lease past its expiry (its holder died), or held by a process of this host that is gone, is taken
over, again with ``If-Match``, so two dumps cannot both take over the same dead lease. The holder checks
the lease is still its own before publishing.

Expiry times are compared with this host's clock: the hosts dumping to one store must agree on the time
to within a fraction of the lease's lifetime (NTP does far better).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import obstore
from obstore.exceptions import AlreadyExistsError, NotFoundError, PreconditionError

from pgprefetch.errors import StoreError

# obstore raises the built-in FileNotFoundError for a missing object (its NotFoundError exists too).
NOT_FOUND = (NotFoundError, FileNotFoundError)
LEASE_SECONDS = float(os.environ.get("PGPREFETCH_LEASE_SECONDS", "60"))


def _node() -> str:
    """This machine's boot and PID namespace.

    Two processes with the same host name and pid are the same only if these match too: containers on the
    host network share the host name, not the PID namespace.
    """
    parts = []
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        try:
            parts.append(Path(path).read_text().strip() if "boot" in path else str(os.stat(path).st_ino))
        except OSError:
            return ""
    return ":".join(parts)


class Lease:
    """The lease on one epoch's writing; :meth:`acquire` it, then :meth:`release` it (it renews itself).

    The holder counts the lease as its own only until ``seconds`` (less a margin) after the start of its
    last successful write of it: a renewal that fails for that long (a stalled process, a network outage)
    means another dump may have taken it over, and :meth:`check` says so before anything is published.
    """

    def __init__(self, client: Any, key: str, where: str, seconds: float = LEASE_SECONDS) -> None:
        self._client = client
        self.key = key
        self.where = where  # the epoch, as messages name it
        self.seconds = seconds
        self.holder = f"{socket.gethostname()} {os.getpid()}"
        self._node = _node()
        self._version: dict[str, Any] | None = None
        self._valid_until = 0.0  # time.monotonic() until which the lease is surely ours
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None  # why the lease is no longer ours

    def _put(self, mode: Any) -> None:
        """Write the lease (``mode``: create, or If-Match on a version) and extend how long it is ours."""
        started = time.monotonic()
        body = json.dumps({"holder": self.holder, "node": self._node, "expires": time.time() + self.seconds})
        result = obstore.put(self._client, self.key, body.encode(), mode=mode)
        self._version = object_version(result)
        self._valid_until = started + self.seconds * 0.8

    def acquire(self) -> bool:
        """Take the lease: create it, or take over one that expired. False if someone else holds it."""
        try:
            self._put("create")
        except AlreadyExistsError:
            try:
                current = obstore.get(self._client, self.key)
            except NOT_FOUND:  # released in between: try once more from the start
                return self.acquire()
            info = _parse(bytes(current.bytes()))
            if info.get("expires", 0) > time.time() and not self._dead_here(info):
                return False
            try:  # expired: its holder died; take it over unless another dump just did
                self._put(object_version(current.meta))
            except (PreconditionError, AlreadyExistsError):
                return False
        self._thread = threading.Thread(target=self._renew, name="pgprefetch-lease", daemon=True)
        self._thread.start()
        return True

    def _dead_here(self, info: dict[str, Any]) -> bool:
        """Whether the holder is a process of this very machine and PID namespace that no longer runs.

        Its lease need not be waited out: a rerun after ``kill -9`` on the same host takes over at once.
        """
        host, _, pid = str(info.get("holder", "")).rpartition(" ")
        if host != socket.gethostname() or not pid.isdigit() or not self._node or info.get("node") != self._node:
            return False
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, someone else's
            return False
        return False

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            if not self.renew():
                return

    def renew(self) -> bool:
        """Extend the lease if it is still ours (If-Match on the version written last); False once lost."""
        with self._lock:
            if self.lost:
                return False
            try:
                self._put(self._version or "create")
            except PreconditionError:
                self.lost = "another dump took it over (this one stalled past its expiry)"
                return False
            except NOT_FOUND:
                self.lost = "it was deleted"
                return False
            except Exception:  # a network error: try again at the next renewal, while the lease lasts
                pass
            return True

    def check(self) -> None:
        """Raise if the lease may no longer be ours: writing on could race another dump."""
        if not self.lost and time.monotonic() > self._valid_until:
            self.lost = f"it could not be renewed for {self.seconds * 0.8:g} s"
        if self.lost:
            raise StoreError(f"lost the lease on {self.where}: {self.lost}; run the dump again")

    def release(self) -> None:
        """Stop renewing and delete the lease, if a last renewal shows it is still ours."""
        self._stop.set()
        if self._thread is None:
            return
        self._thread.join()
        if self.renew():  # S3 has no conditional delete: this narrows the window to one round trip
            with contextlib.suppress(Exception):  # if this fails, it expires by itself
                obstore.delete(self._client, self.key)


def lease_holder(client: Any, key: str) -> str:
    """Who holds (or last held) a lease: "host pid"."""
    try:
        return str(_parse(bytes(obstore.get(client, key).bytes())).get("holder", "unknown"))
    except Exception:
        return "unknown"


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def object_version(meta: Any) -> dict[str, Any]:
    """The ``If-Match`` precondition for the object version ``meta`` (a put result or an object's metadata)."""
    return {k: meta[k] for k in ("e_tag", "version") if meta.get(k) is not None}
