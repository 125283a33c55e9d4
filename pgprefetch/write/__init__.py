"""The dump: an epoch's keys read and shuffled on one snapshot, its batches fetched, decoded and written.

Named ``write`` (the store's other side is ``read``): a subpackage ``pgprefetch.dump`` would be shadowed by
the public function :func:`pgprefetch.dump`.

``pipeline`` runs an epoch (locks, retries, resume, publication); ``sources`` chooses where its batches
come from: the query mode (``query``) or the scan mode (``scan/``), both behind the contracts in
``batches``. ``plan`` and ``shuffle`` fix the epoch's order, ``schedule`` and ``tasks`` run the units,
``writer``, ``shardfiles``, ``stats`` and ``manifest`` put it on disk; ``check`` runs the same code and
writes nothing. Imports ``decode``, ``pg``, ``store`` and ``config``; never the reader or the CLI.
"""

from pgprefetch.write.check import CheckReport, check_config
from pgprefetch.write.pipeline import RETRIES, DumpResult, dump_epoch, dump_epochs

__all__ = ["RETRIES", "CheckReport", "DumpResult", "check_config", "dump_epoch", "dump_epochs"]
