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
    """What the parts of a dump's epochs report while they run: samples written per part, and their attempts.

    A part run again (its worker killed) starts its count over, so the driver's progress never counts a
    batch twice; its attempts beyond the first are its retries. One tracker serves a dump's epochs, each
    counted apart: an actor is a process, seconds to start on a busy host, so the driver starts it early and
    neither it nor the parts wait for it (a part's calls reach it in the order the part made them).
    """

    def __init__(self) -> None:
        self.samples: dict[tuple[int, int], int] = {}
        self.bytes: dict[tuple[int, int], int] = {}
        self.attempts: dict[tuple[int, int], int] = {}

    def started(self, epoch: int, part: int) -> None:
        """Part ``part`` of ``epoch`` (re)starts."""
        self.attempts[epoch, part] = self.attempts.get((epoch, part), 0) + 1
        self.samples[epoch, part] = self.bytes[epoch, part] = 0

    def advance(self, epoch: int, part: int, samples: int, nbytes: int) -> None:
        """Part ``part`` of ``epoch`` wrote ``samples`` more samples, ``nbytes`` bytes."""
        self.samples[epoch, part] = self.samples.get((epoch, part), 0) + samples
        self.bytes[epoch, part] = self.bytes.get((epoch, part), 0) + nbytes

    def totals(self, epoch: int, parts: int) -> tuple[int, int, list[int]]:
        """Samples and bytes of ``epoch`` written so far, and each of its ``parts`` parts' attempts."""
        samples = sum(n for (e, _), n in self.samples.items() if e == epoch)
        nbytes = sum(n for (e, _), n in self.bytes.items() if e == epoch)
        return samples, nbytes, [self.attempts.get((epoch, p), 0) for p in range(parts)]
