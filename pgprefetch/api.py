"""The Python API for notebooks, Airflow tasks and scripts: the CLI's commands as plain functions.

Each takes what the command takes (a config file, a dict shaped like the TOML file, or a :class:`Config`;
a store path) and returns what the command prints, as objects. A dict is validated exactly as a file is,
with the same one-line messages. The functions are synchronous; inside a running event loop (a Jupyter
cell) the dump runs on a thread of its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Coroutine, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from pgprefetch.config.load import load_config, parse_config, with_overrides
from pgprefetch.config.model import Config
from pgprefetch.errors import ConfigError
from pgprefetch.store.maintenance import EpochInfo, PruneResult, forget_consumer, list_epochs, verify_epoch
from pgprefetch.store.maintenance import prune as prune_store
from pgprefetch.store.open import config_store, open_store
from pgprefetch.store.splits import served_epoch
from pgprefetch.write.cron import Schedule
from pgprefetch.write.pipeline import RETRIES, DumpResult, dump_epochs

T = TypeVar("T")
ConfigLike = Config | dict[str, Any] | str | os.PathLike[str]


def build_config(
    spec: ConfigLike,
    *,
    dsn: str | None = None,
    connections: int | None = None,
    store: str | os.PathLike[str] | None = None,
    memory: str | None = None,
    scratch: str | os.PathLike[str] | None = None,
    split: str | None = None,
    transforms: Mapping[str, Callable[..., Any]] | None = None,
) -> Config:
    """A validated :class:`Config` from a file path, a dict shaped like the TOML file, or a Config.

    The overrides are the command line's (``--dsn``, ``--connections``, ``--store``, ``--memory``,
    ``--scratch``, ``--split``); None leaves the config's own. ``transforms``: function objects for
    ``[transforms.NAME]`` (a notebook's ``{"tok": tokenize}``), in place of their ``function``; a dict spec may
    also hold the function itself as ``function``.
    """
    if isinstance(spec, Config | dict):
        cfg = spec if isinstance(spec, Config) else parse_config(spec)
        cfg = with_overrides(
            cfg, dsn=dsn, connections=connections, store=store, memory=memory, scratch=scratch, split=split
        )
    else:
        cfg = load_config(
            spec, dsn=dsn, connections=connections, store=store, memory=memory, scratch=scratch, split=split
        )
    return with_functions(cfg, transforms or {})


def with_functions(cfg: Config, functions: Mapping[str, Callable[..., Any]]) -> Config:
    """``cfg`` whose ``[transforms.NAME]`` run ``functions[NAME]``; a name it has no transform of is refused."""
    unknown = sorted(set(functions) - {t.name for t in cfg.transforms})
    if unknown:
        known = ", ".join(t.name for t in cfg.transforms) or "none"
        raise ConfigError(f"transforms={{{unknown[0]!r}: ...}}: the config has no [transforms.{unknown[0]}] ({known})")
    replaced = tuple(
        dataclasses.replace(t, function=functions[t.name]) if t.name in functions else t for t in cfg.transforms
    )
    return dataclasses.replace(cfg, transforms=replaced)


def dump(
    spec: ConfigLike,
    epochs: int | Iterable[int] | None = None,
    *,
    ahead: int | None = None,
    keep: int | None = None,
    consumer: str | None = None,
    new_consumer: bool = False,
    force: bool = False,
    retries: int = RETRIES,
    executor: str = "process",
    parts: int | None = None,
    ray_env: dict[str, str] | None = None,
    parents: bool = False,
    dsn: str | None = None,
    connections: int | None = None,
    store: str | os.PathLike[str] | None = None,
    memory: str | None = None,
    scratch: str | os.PathLike[str] | None = None,
    split: str | None = None,
    transforms: Mapping[str, Callable[..., Any]] | None = None,
) -> list[DumpResult]:
    """Dump ``epochs`` of a config (``pgprefetch dump``), or the next ``ahead`` ones; scan mode cuts them from one read.

    ``epochs`` (default: epoch 0) or ``ahead``: the ``ahead`` epochs after the newest one a training run has
    opened (``consumer``'s, or the furthest run's; ``new_consumer`` registers ``consumer`` first), those not
    complete yet: what cron's ``dump --ahead K`` writes. ``keep``: then delete the complete epochs more than
    ``keep`` behind the slowest recorded run (``--keep``). ``executor="ray"`` spreads each epoch over a Ray
    cluster's workers in ``parts`` parts (default: its CPUs; ``RAY_ADDRESS``, a cluster this process joined,
    or one started here for the dump), byte-identical to the default, this process (``pip install
    'pgprefetch[ray]'``). ``ray_env``: environment variables for the parts' workers (an object store's
    credentials, when the cluster's own are not the ones to use). ``parents``: create a local store's missing
    parent folders too (``--parents``); by default only the store's own folder is made, so that a mistyped
    path is an error, not a new store. ``split``: the split to dump, required where the config has
    ``[splits]`` (``--split``; docs/splits.md). ``dsn``, ``connections``, ``store``, ``memory``, ``scratch``:
    the command line's overrides; ``transforms``: function objects for ``[transforms.NAME]`` (:func:`build_config`).

    Example::

        pgprefetch.dump("configs/demo.toml", epochs=range(3), dsn="postgresql://...")
        pgprefetch.dump("configs/demo.toml", ahead=2, keep=1)   # what cron runs
    """
    if epochs is None and ahead is None:
        epochs = 0
    given = None if epochs is None else ((epochs,) if isinstance(epochs, int) else tuple(epochs))
    schedule = Schedule(given, ahead, keep, consumer, new_consumer, force)
    if executor not in ("process", "ray"):
        raise ConfigError(f'executor must be "process" or "ray", got {executor!r}')
    cfg = build_config(
        spec,
        dsn=dsn,
        connections=connections,
        store=store,
        memory=memory,
        scratch=scratch,
        split=split,
        transforms=transforms,
    )
    target = config_store(cfg)
    due = schedule.due(cfg, target)
    if executor == "process":
        results = _run(dump_epochs(cfg, due.epochs, force=force, retries=retries, parents=parents))
    else:
        from pgprefetch.write.ray import ray_executor  # Ray only when asked for

        with ray_executor(parts, env=ray_env) as spread:
            results = _run(dump_epochs(cfg, due.epochs, force=force, retries=retries, executor=spread, parents=parents))
    schedule.tidy(target)
    return results


def ls(store: str | os.PathLike[str], *, split: str | None = None) -> list[EpochInfo]:
    """The epochs of a store (of its split ``split``), complete and partial (``pgprefetch ls``).

    Raises:
        StoreNotFoundError: nothing is there (or no pgprefetch store): the path is wrong.
    """
    return list_epochs(open_store(store, split).require())


def verify(store: str | os.PathLike[str], epoch: int, *, split: str | None = None) -> list[str]:
    """One line per corrupt or missing chunk of a published epoch (of split ``split``); empty when all is well."""
    target = open_store(store, split).require()
    return verify_epoch(target, served_epoch(target, epoch))


def prune(
    store: str | os.PathLike[str],
    keep: int,
    consumer: str | None = None,
    *,
    partials: bool = False,
    partials_older_than: float | None = None,
    dry_run: bool = False,
    split: str | None = None,
) -> PruneResult:
    """Delete complete epochs more than ``keep`` behind the slowest consumer (``pgprefetch prune``).

    Every recorded consumer counts: nothing any training run may still read is deleted. ``consumer`` is
    checked as a recorded run's name (a typo is refused) and narrows nothing. ``partials``: also delete
    partial epochs no dump is writing; ``partials_older_than``: those last written more than this many
    seconds ago. ``dry_run``: say what would be deleted; delete nothing. ``split``: the store's split of
    that name (a store with ``[splits]`` is pruned a split at a time).
    """
    return prune_store(
        open_store(store, split).require(),
        keep,
        consumer,
        partials=partials,
        partials_older_than=partials_older_than,
        dry_run=dry_run,
    )


def forget(store: str | os.PathLike[str], consumer: str, *, split: str | None = None) -> list[str]:
    """Remove every record of training run ``consumer`` (``pgprefetch forget``); the records removed.

    Only for a run gone for good: until then its records keep, against every ``prune`` and ``--keep``, each
    epoch it may still read. A name with no record raises ConfigError naming the closest recorded one.
    """
    return forget_consumer(open_store(store, split).require(), consumer)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:  # a running loop (a notebook): the dump gets a loop of its own
        return pool.submit(asyncio.run, coro).result()
