"""The epoch's order: which key lands in which batch, and where.

The shuffle (:mod:`.shuffle`) is a pure function of (seed, epoch, key); keys beyond ``[source] memory`` are
ordered on disk (:mod:`.spill`) into a key file (:mod:`.keyfile`). Nothing here knows of PostgreSQL or the
store: it orders numbers, so the order can be tested, and changed, on its own.
"""
