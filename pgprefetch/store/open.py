"""Opening a store: the one place that knows which backend a location names.

It sits above the backends (zarr's ``make_store`` habit), so the interface in :mod:`pgprefetch.store.base`
knows none of them, and the object store's backend (and obstore with it) is imported only when a location
names one: a dump host writing to a local folder never loads it.
"""

from __future__ import annotations

import os

from pgprefetch.config.values import store_location
from pgprefetch.errors import ConfigError, StoreError
from pgprefetch.store.base import Store


def open_store(location: str | os.PathLike[str]) -> Store:
    """The store at ``location``: ``s3://bucket/prefix`` an object store, anything else a local folder.

    Nothing is read or created: :meth:`Store.require` checks that a store is there, :meth:`Store.create`
    makes one.

    Raises:
        StoreError: the location is not a folder or a valid ``s3://bucket/prefix``.
    """
    try:
        where = store_location(location, "store")
    except ConfigError as e:
        raise StoreError(str(e)) from None
    if isinstance(where, str):
        from pgprefetch.store.s3 import S3Store

        return S3Store(where)
    from pgprefetch.store.local import LocalStore

    return LocalStore(location)  # as given: messages show the folder as the user typed it
