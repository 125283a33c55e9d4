"""The DSN's password kept out of what Ray records of a task: its arguments carry the DSN without it.

A task's arguments travel in its spec to the raylet and the worker, are kept by the driver for retries and
lineage, and may be pickled into logs or spilled objects; a ``runtime_env`` is shown by Ray's state API
and dashboard. So the config a part or reader gets names the server with its password replaced
(:func:`~pgprefetch.pg.redaction.redact`), and the whole DSN is put in the cluster's object store once per
epoch; the task reads it from there into memory (:func:`opened`) and never writes it anywhere. Whoever
can run code on the cluster can still read it (as they can the data): a shared cluster must be on a
trusted network or use Ray's token authentication.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ray

from pgprefetch.config.model import Config
from pgprefetch.pg.redaction import redact


def sealed(cfg: Config) -> tuple[Config, tuple[Any, ...]]:
    """``cfg`` with its DSN's password replaced, and the whole DSN as a (nested) object ref, if it had one.

    The ref rides inside a tuple so that Ray hands the task the ref, not the value: the value is fetched
    by :func:`opened` from the object store, never placed in the task's spec.
    """
    dsn = cfg.source.dsn
    if not dsn or redact(dsn) == dsn:
        return cfg, ()
    bare = dataclasses.replace(cfg, source=dataclasses.replace(cfg.source, dsn=redact(dsn)))
    return bare, (ray.put(dsn),)


def opened(cfg: Config, dsn: tuple[Any, ...]) -> Config:
    """The config a task connects with: ``cfg`` with the DSN :func:`sealed` put away, in memory only."""
    if not dsn:
        return cfg
    return dataclasses.replace(cfg, source=dataclasses.replace(cfg.source, dsn=ray.get(dsn[0])))
