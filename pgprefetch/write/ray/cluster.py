"""Joining a Ray cluster (or starting one on this host) for a dump, and the tracker parts report progress to.

A dump that started the cluster stops it when it ends; one that joined a running cluster (``RAY_ADDRESS``,
``ray job submit``, a notebook's ``ray.init``) leaves it as it was.
"""

from __future__ import annotations

import logging
import os
import socket

import ray

from pgprefetch.decode.layout import UnknownCategoryError
from pgprefetch.errors import ExecutorError, PgprefetchError

PROBE_SECONDS = 5.0  # how long the cluster's address may take to accept a connection
TASK_RETRIES = 3  # reruns of a task whose worker or node was lost (Ray's max_retries); never forever


def join(address: str | None) -> bool:
    """Connect to the cluster at ``address`` (or ``RAY_ADDRESS``, or start one here); True if this started it."""
    if ray.is_initialized():
        return False
    _probe(address or os.environ.get("RAY_ADDRESS"))
    try:
        # The workers' output stays theirs: `--json` prints one object per epoch on stdout, nothing else.
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = address or "(RAY_ADDRESS, or a new local one)"
        raise ExecutorError(f"cannot join the Ray cluster {where}: {line}") from None
    return True


def _probe(address: str | None) -> None:
    """Fail in seconds when nothing answers at a cluster's address: ``ray.init`` would wait for it for minutes.

    Ray retries an unreachable GCS without end, printing a warning every few seconds; a cron run with a
    mistyped ``RAY_ADDRESS`` would hang until its timeout. ``auto`` and ``local`` (and no address) are
    Ray's to resolve: they fail fast on their own.
    """
    if not address or address in ("auto", "local"):
        return
    where = address.removeprefix("ray://")
    host, _, port = where.rpartition(":")
    if not host or not port.isdigit():
        raise ExecutorError(f"the Ray address {address!r} is not HOST:PORT (or ray://HOST:PORT, auto, local)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_SECONDS).close()
    except OSError as e:
        raise ExecutorError(
            f"cannot join the Ray cluster at {address}: nothing answers there ({e.strerror or e}); start it with "
            "`ray start --head`, or unset RAY_ADDRESS to start one on this host"
        ) from None


def failure(error: ray.exceptions.RayError, task: str) -> Exception:
    """A task's failure as the epoch's one-line error: what the single process would raise, or one naming ``task``.

    Bad data and lost connections are the single process's own errors (a NULL, an overflow, a transient
    ``SourceError`` the epoch retries); anything else names the task, and a task whose worker or node was
    lost more often than Ray retries it says so.
    """
    if isinstance(error, ray.exceptions.RayTaskError):
        cause = error.cause
        if isinstance(cause, PgprefetchError | UnknownCategoryError):
            return cause
        return ExecutorError(f"{task} failed: {type(cause).__name__}: {line(cause)}")
    return ExecutorError(f"{task} failed after {TASK_RETRIES} retries: {line(error)}")


def line(e: BaseException) -> str:
    """The first line of an error's message (its type when it has none)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def cluster_cpus() -> int:
    """The cluster's CPUs: the parts of an epoch by default."""
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


@ray.remote(num_cpus=0)
class Tracker:
    """What the parts of an epoch report while they run: samples written per part, and their attempts.

    A part run again (its worker killed) starts its count over, so the driver's progress never counts a
    batch twice; its attempts beyond the first are its retries. One tracker serves a dump's epochs in
    turn (:meth:`begin`): an actor is a process, seconds to start on a busy host.
    """

    def __init__(self) -> None:
        self.begin(0)

    def begin(self, parts: int) -> None:
        """A new epoch of ``parts`` parts."""
        self.samples = [0] * parts
        self.bytes = [0] * parts
        self.attempts = [0] * parts

    def started(self, part: int) -> None:
        """Part ``part`` (re)starts."""
        self.attempts[part] += 1
        self.samples[part] = self.bytes[part] = 0

    def advance(self, part: int, samples: int, nbytes: int) -> None:
        """Part ``part`` wrote ``samples`` more samples, ``nbytes`` bytes."""
        self.samples[part] += samples
        self.bytes[part] += nbytes

    def totals(self) -> tuple[int, int, list[int]]:
        """Samples and bytes written so far, and each part's attempts."""
        return sum(self.samples), sum(self.bytes), list(self.attempts)
