"""The PostgreSQL side: connections and the exported snapshot, the statements, and what errors mean.

``session`` holds the snapshot and the workers that import it, ``columns`` and ``statement`` build what
the server runs (never pasting values into SQL), ``retry`` decides once whether an error lost the
connection, and ``redaction`` keeps passwords out of messages. Imports ``config`` and the root leaves.
"""

from pgprefetch.pg.session import BatchReader, Snapshot

__all__ = ["BatchReader", "Snapshot"]
