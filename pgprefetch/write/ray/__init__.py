"""The Ray executor: one epoch spread over a Ray cluster's workers, under one exported snapshot, byte-identical.

``pgprefetch dump --executor ray [--parts N]`` and ``pgprefetch.dump(cfg, executor="ray")``. The driver
(the dump's own process) plans the epoch as always: it holds the keys transaction and its exported
snapshot, the epoch's lock and its writer. The epoch's batches are split into *parts* (batch ranges); each
part is a Ray task that imports the snapshot, fetches, decodes and writes its batches into the partial
epoch, and returns their checksums and statistics; the driver publishes (:mod:`.driver`, :mod:`.part`,
:mod:`.cluster`; on an object store :mod:`pgprefetch.store.records` and :mod:`.staged`). A scan config's
table is read once by reader tasks, in page ranges, and each part gets the rows its samples span through an exchange in
the object store (:mod:`.scan`). The tasks' arguments carry the DSN without its password (:mod:`.secret`);
a cluster the dump starts listens on 127.0.0.1 only (:mod:`.cluster`). Only this package imports Ray:
without it, asking for it is one line saying what to install.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgprefetch.errors import ExecutorError

if TYPE_CHECKING:
    from pgprefetch.write.ray.driver import RayExecutor

INSTALL = "pip install 'pgprefetch[ray]'"


def ray_executor(
    parts: int | None = None, address: str | None = None, env: dict[str, str] | None = None
) -> RayExecutor:
    """A :class:`~pgprefetch.write.ray.driver.RayExecutor` (``parts``: the epoch's parts; default: the cluster's CPUs).

    ``address``: the cluster (default ``RAY_ADDRESS``, else a cluster started on this host for the dump).
    ``env``: environment variables the parts' workers get (object store credentials, say).

    Raises:
        ExecutorError: Ray is not installed.
    """
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ExecutorError(f"--executor ray needs Ray, which is not installed: {INSTALL}") from None
    from pgprefetch.write.ray.driver import RayExecutor

    return RayExecutor(parts=parts, address=address, env=env)
