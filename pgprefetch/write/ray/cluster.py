"""Joining a Ray cluster (or starting one on this host) for a dump, and the tracker parts report progress to.

A dump that started the cluster stops it when it ends; one that joined a running cluster (``RAY_ADDRESS``,
``ray job submit``, a notebook's ``ray.init``) leaves it as it was. A cluster the dump starts listens on
127.0.0.1 only (:func:`loopback`): by default Ray's GCS, raylets and workers listen on every interface.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import Iterator
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from pgprefetch.decode.layout import UnknownCategoryError
from pgprefetch.errors import ExecutorError, PgprefetchError

PROBE_SECONDS = 5.0  # how long the cluster's address may take to accept a connection (and answer the GCS probe)
LOCAL_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray's processes on this host bind to the loopback address
AUTH_HINT = (
    "set RAY_AUTH_MODE=token and give this process the cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or "
    "~/.ray/auth_token; `ray get-auth-token` on its head prints it)"
)
TASK_RETRIES = 3  # reruns of a task whose worker or node was lost (Ray's max_retries); never forever


def join(address: str | None) -> bool:
    """Connect to the cluster at ``address`` (or ``RAY_ADDRESS``, or start one here); True if this started it.

    A cluster started here is on 127.0.0.1 only; so is the connection to one at a loopback address (a
    ``ray start --head --node-ip-address=127.0.0.1``), which Ray would otherwise redirect to this host's
    outward address, where nothing listens.
    """
    if ray.is_initialized():
        return False
    target = address or os.environ.get("RAY_ADDRESS")
    _probe(target)
    local = not target or target == "local" or _is_loopback(target)
    private: dict[str, Any] = {"_node_ip_address": "127.0.0.1"} if not target or target == "local" else {}
    try:
        with loopback() if local else contextlib.nullcontext():
            # The workers' output stays theirs: `--json` prints one object per epoch on stdout, nothing else.
            ray.init(
                address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
                **private,
            )  # fmt: skip
    except (ConnectionError, RuntimeError, ValueError) as e:
        line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = address or "(RAY_ADDRESS, or a new local one)"
        raise ExecutorError(f"cannot join the Ray cluster {where}: {line}") from None
    return True


@contextlib.contextmanager
def loopback() -> Iterator[None]:
    """Ray on this host's loopback address while the block starts (or connects to) a cluster.

    Ray binds its GCS, raylet, object manager, agents and workers to every interface unless
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, its switch for "one machine, loopback only", which it reads when
    ``ray`` is imported (for this process) and which the processes it starts inherit. It also turns
    ``_node_ip_address="127.0.0.1"`` into the outward address unless that switch is off. So the block sets
    both: the variable for the processes started in it, Ray's constant for this one; and restores them after,
    so that a later ``ray.init`` of the same process (a notebook's) to a remote cluster is Ray's as usual.
    """
    from ray._private import ray_constants  # Ray's own switch, read at import: the one lever it offers

    saved_env, saved_flag = os.environ.get(LOCAL_ONLY), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[LOCAL_ONLY] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(LOCAL_ONLY, None)
        else:
            os.environ[LOCAL_ONLY] = saved_env


def _is_loopback(address: str) -> bool:
    """Whether a cluster address names this host's loopback (``127.x``, ``::1``, ``localhost``)."""
    host = address.removeprefix("ray://").rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    if not address.startswith("ray://"):  # Ray Client goes through its own server, not the GCS
        _probe_auth(address)


def _probe_auth(address: str) -> None:
    """Fail in a moment when the cluster wants a token this process does not send.

    A cluster started with ``ray start`` (Ray 2.60 and later) has token authentication on; ``ray.init`` to an
    explicit address sends a token only under ``RAY_AUTH_MODE=token``, and otherwise retries the refused GCS
    for 20 seconds, printing ``InvalidAuthToken`` each second, before "cannot join". One GCS call, sent as
    ``ray.init`` would send it, tells the two apart at once. Ray's private client: if this Ray has none, the
    probe is skipped (``ray.init``'s own error still comes, later).
    """
    try:
        # Ray's private GCS client, which its _raylet.pyi leaves out.
        from ray._raylet import AuthenticationMode, InnerGcsClient, get_authentication_mode  # type: ignore[attr-defined]
        from ray.exceptions import AuthenticationError
    except ImportError:  # another Ray: no probe
        return
    try:
        InnerGcsClient.standalone(address, None, int(PROBE_SECONDS * 1000))
    except AuthenticationError:
        sent = get_authentication_mode() == AuthenticationMode.TOKEN
        what = "refused this process's token" if sent else "wants a token (token authentication) and got none"
        hint = "check the token is the cluster's (`ray get-auth-token` on its head)" if sent else AUTH_HINT
        raise ExecutorError(f"cannot join the Ray cluster at {address}: it {what}; {hint}") from None
    except Exception:  # anything else is ray.init's to report, as before
        return


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
    """What the parts of an epoch (a *run*: a dump's epoch) report while they run: samples and attempts per part.

    A part run again (its worker killed) starts its count over, so the driver's progress never counts a
    batch twice; its attempts beyond the first are its retries. An actor is a process, a second or more to
    start on a busy host, so one serves every dump of the driver's process (:func:`tracker`), started as early
    as the dump can (a scan starts it while the table is read). A part waits for its ``started`` call to be
    received before it works; its progress calls are not waited for (they reach it in the order it made them).
    """

    def __init__(self) -> None:
        self.samples: dict[tuple[str, int], int] = {}
        self.bytes: dict[tuple[str, int], int] = {}
        self.attempts: dict[tuple[str, int], int] = {}

    def started(self, run: str, part: int) -> None:
        """Part ``part`` of ``run`` (re)starts."""
        self.attempts[run, part] = self.attempts.get((run, part), 0) + 1
        self.samples[run, part] = self.bytes[run, part] = 0

    def advance(self, run: str, part: int, samples: int, nbytes: int) -> None:
        """Part ``part`` of ``run`` wrote ``samples`` more samples, ``nbytes`` bytes."""
        self.samples[run, part] = self.samples.get((run, part), 0) + samples
        self.bytes[run, part] = self.bytes.get((run, part), 0) + nbytes

    def totals(self, run: str, parts: int) -> tuple[int, int, list[int]]:
        """Samples and bytes of ``run`` written so far, and each of its ``parts`` parts' attempts."""
        samples = sum(n for (r, _), n in self.samples.items() if r == run)
        nbytes = sum(n for (r, _), n in self.bytes.items() if r == run)
        return samples, nbytes, [self.attempts.get((run, p), 0) for p in range(parts)]

    def forget(self, run: str) -> None:
        """``run`` is over: drop its counts."""
        for counts in (self.samples, self.bytes, self.attempts):
            for key in [k for k in counts if k[0] == run]:
                del counts[key]


_tracker: tuple[str, Any] | None = None  # this process's: (the node and job it belongs to, its handle)


def tracker() -> Any:
    """This process's :class:`Tracker` on the cluster it joined, started on first use.

    On the driver's node: losing another node must not lose the counts.
    """
    global _tracker
    context = ray.get_runtime_context()
    # A new ray.init is a new job (or a new cluster, whose first job has the same id): the old tracker is gone.
    job = f"{context.get_node_id()}/{context.get_job_id()}"
    if _tracker is None or _tracker[0] != job:
        here = NodeAffinitySchedulingStrategy(context.get_node_id(), soft=False)
        # mypy drops what a class decorator returns: @ray.remote makes Tracker an ActorClass, with .options.
        _tracker = (job, Tracker.options(scheduling_strategy=here).remote())  # type: ignore[attr-defined]
    return _tracker[1]


def lost_tracker() -> None:
    """The tracker was lost with its node: the next :func:`tracker` starts another."""
    global _tracker
    _tracker = None
