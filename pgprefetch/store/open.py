"""Opening a store: the one place that knows which backend a location names.

It sits above the backends (zarr's ``make_store`` habit), so the interface in :mod:`pgprefetch.store.base`
knows none of them, and the object store's backend (and obstore with it) is imported only when a location
names one: a dump host writing to a local folder never loads it.
"""

from __future__ import annotations

import os

from pgprefetch.config.model import Config
from pgprefetch.config.values import store_location
from pgprefetch.errors import ConfigError, StoreError
from pgprefetch.store.base import Store
from pgprefetch.store.splits import dump_store, open_split


def open_store(location: str | os.PathLike[str], split: str | None = None) -> Store:
    """The store at ``location``: ``s3://bucket/prefix`` an object store, anything else a local folder.

    Nothing is read or created: :meth:`Store.require` checks that a store is there, :meth:`Store.create`
    makes one. ``split``: the store of that split of the store there, which must exist and have it
    (:mod:`.splits`: a reader's ``split=``).

    Raises:
        StoreError: the location is not a folder or a valid ``s3://bucket/prefix``; no such split.
    """
    if split is not None:
        return open_split(open_store(location), split)
    try:
        where = store_location(location, "store")
    except ConfigError as e:
        raise StoreError(str(e)) from None
    if isinstance(where, str):
        from pgprefetch.store.s3 import S3Store

        return S3Store(where)
    from pgprefetch.store.local import LocalStore

    return LocalStore(location)  # as given: messages show the folder as the user typed it


def config_store(cfg: Config) -> Store:
    """The store ``cfg``'s epochs go in: ``[store] path``, or its split's store (``cfg.split``; :mod:`.splits`)."""
    return dump_store(open_store(cfg.store.path), cfg.splits, cfg.split)
