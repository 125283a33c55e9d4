"""The Python API for notebooks, Airflow tasks and scripts: the CLI's commands as plain functions.

Each takes what the command takes (a config file, a dict shaped like the TOML file, or a :class:`Config`;
a store path) and returns what the command prints, as objects. A dict is validated exactly as a file is,
with the same one-line messages. The functions are synchronous; inside a running event loop (a Jupyter
cell) the dump runs on a thread of its own.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pgprefetch.config.load import load_config, parse_config, with_overrides
from pgprefetch.config.model import Config
from pgprefetch.errors import ConfigError
from pgprefetch.store.maintenance import EpochInfo, PruneResult, list_epochs, verify_epoch
from pgprefetch.store.maintenance import prune as prune_store
from pgprefetch.store.open import open_store
from pgprefetch.write.pipeline import RETRIES, DumpResult, dump_epochs

T = TypeVar("T")
ConfigLike = Config | dict[str, Any] | str | os.PathLike[str]


def build_config(spec: ConfigLike, **overrides: Any) -> Config:
    """A validated :class:`Config` from a file path, a dict shaped like the TOML file, or a Config.

    ``overrides`` are the command line's: ``dsn``, ``connections``, ``store``, ``memory``, ``scratch``.
    """
    if isinstance(spec, Config):
        return with_overrides(spec, **overrides)
    if isinstance(spec, dict):
        return with_overrides(parse_config(spec), **overrides)
    return load_config(spec, **overrides)


def dump(
    spec: ConfigLike,
    epochs: int | Iterable[int] = 0,
    *,
    force: bool = False,
    retries: int = RETRIES,
    executor: str = "process",
    parts: int | None = None,
    ray_env: dict[str, str] | None = None,
    parents: bool = False,
    **overrides: Any,
) -> list[DumpResult]:
    """Dump ``epochs`` of a config (``pgprefetch dump``); in scan mode they are cut from one read.

    ``executor="ray"`` spreads each epoch over a Ray cluster's workers in ``parts`` parts (default: its CPUs;
    ``RAY_ADDRESS``, a cluster this process joined, or one started here for the dump), byte-identical to
    the default, this process (``pip install 'pgprefetch[ray]'``). ``ray_env``: environment variables for
    the parts' workers (an object store's credentials, when the cluster's own are not the ones to use).
    ``parents``: create a local store's missing parent folders too (``--parents``); by default only the
    store's own folder is made, so that a mistyped path is an error, not a new store.

    Example::

        pgprefetch.dump("configs/demo.toml", epochs=range(3), dsn="postgresql://...")
    """
    cfg = build_config(spec, **overrides)
    wanted = [epochs] if isinstance(epochs, int) else list(epochs)
    if executor == "process":
        return _run(dump_epochs(cfg, wanted, force=force, retries=retries, parents=parents))
    if executor != "ray":
        raise ConfigError(f'executor must be "process" or "ray", got {executor!r}')
    from pgprefetch.write.ray import ray_executor  # Ray only when asked for

    with ray_executor(parts, env=ray_env) as spread:
        return _run(dump_epochs(cfg, wanted, force=force, retries=retries, executor=spread, parents=parents))


def ls(store: str | os.PathLike[str]) -> list[EpochInfo]:
    """The epochs of a store, complete and partial (``pgprefetch ls``).

    Raises:
        StoreNotFoundError: nothing is there (or no pgprefetch store): the path is wrong.
    """
    return list_epochs(open_store(store).require())


def verify(store: str | os.PathLike[str], epoch: int) -> list[str]:
    """One line per corrupt or missing chunk of a published epoch; empty when all is well."""
    return verify_epoch(open_store(store).require(), epoch)


def prune(store: str | os.PathLike[str], keep: int, **options: Any) -> PruneResult:
    """Delete complete epochs more than ``keep`` behind the consumers (``pgprefetch prune``)."""
    return prune_store(open_store(store).require(), keep, **options)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:  # a running loop (a notebook): the dump gets a loop of its own
        return pool.submit(asyncio.run, coro).result()
