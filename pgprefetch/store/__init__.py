"""The store: where epochs live, one interface (``base``) and a backend per kind of place.

``local`` is a folder, ``s3`` an object store (with ``uploads`` and ``lease``); :func:`open_store`
(``open``) picks the backend a location names. ``layout`` owns the on-disk format of an epoch's arrays,
``maintenance`` lists, verifies and prunes. Imports ``config`` and the root leaves; never the
PostgreSQL side, the decoder, the dump or the reader.
"""

from pgprefetch.store.base import Store
from pgprefetch.store.open import open_store

__all__ = ["Store", "open_store"]
