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
from typing import Any

import obstore
from obstore.exceptions import AlreadyExistsError, NotFoundError, PreconditionError

from .errors import StoreError

# obstore raises the built-in FileNotFoundError for a missing object (its NotFoundError exists too).
NOT_FOUND = (NotFoundError, FileNotFoundError)
LEASE_SECONDS = float(os.environ.get("PGPREFETCH_LEASE_SECONDS", "60"))


class Lease:
    """The lease on one epoch's writing; :meth:`acquire` it, then :meth:`release` it (it renews itself)."""

    def __init__(self, client: Any, key: str, where: str, seconds: float = LEASE_SECONDS) -> None:
        self._client = client
        self.key = key
        self.where = where  # the epoch, as messages name it
        self.seconds = seconds
        self.holder = f"{socket.gethostname()} {os.getpid()}"
        self._version: dict[str, Any] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None  # why the lease is no longer ours

    def _body(self) -> bytes:
        return json.dumps({"holder": self.holder, "expires": time.time() + self.seconds}).encode()

    def acquire(self) -> bool:
        """Take the lease: create it, or take over one that expired. False if someone else holds it."""
        try:
            self._version = _version(obstore.put(self._client, self.key, self._body(), mode="create"))
        except AlreadyExistsError:
            try:
                current = obstore.get(self._client, self.key)
            except NOT_FOUND:  # released in between: try once more from the start
                return self.acquire()
            info = _parse(bytes(current.bytes()))
            if info.get("expires", 0) > time.time() and not self._dead_here(str(info.get("holder", ""))):
                return False
            try:  # expired: its holder died; take it over unless another dump just did
                version = _version(current.meta)
                self._version = _version(obstore.put(self._client, self.key, self._body(), mode=version))
            except (PreconditionError, AlreadyExistsError):
                return False
        self._thread = threading.Thread(target=self._renew, name="pgprefetch-lease", daemon=True)
        self._thread.start()
        return True

    @staticmethod
    def _dead_here(holder: str) -> bool:
        """Whether ``holder`` ("host pid") is a process of this host that no longer runs (``kill -9``).

        Its lease need not be waited out: a rerun on the same host takes over at once.
        """
        host, _, pid = holder.rpartition(" ")
        if host != socket.gethostname() or not pid.isdigit():
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
            if not self._renew_once():
                return

    def _renew_once(self) -> bool:
        """Extend the lease if it is still ours; False once it is lost."""
        try:
            mode = self._version or "create"
            self._version = _version(obstore.put(self._client, self.key, self._body(), mode=mode))
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
        """Raise if the lease is no longer ours: publishing now could race another dump."""
        if self.lost:
            raise StoreError(f"lost the lease on {self.where}: {self.lost}; run the dump again")

    def release(self) -> None:
        """Stop renewing and delete the lease (if it is still ours)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._thread is not None and not self.lost:
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


def _version(meta: Any) -> dict[str, Any]:
    """The ``If-Match`` precondition for the object version ``meta`` (a put result or an object's metadata)."""
    return {k: meta[k] for k in ("e_tag", "version") if meta.get(k) is not None}
