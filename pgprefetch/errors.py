"""The exceptions pgprefetch raises, and the exit code each one maps to.

The library raises; only the CLI prints. Every message is one line that says what is wrong and what was
expected, because it is what a user reads at 3 a.m. in a cron mail::

    PgprefetchError                  exit 1
    ├── ConfigError (ValueError)      exit 2   bad config file or option
    ├── SourceError                  exit 1   PostgreSQL refused, failed or returned unusable data
    │   └── SampleError              exit 1   one sample's rows don't fit the fields (names the key)
    ├── TransformError               exit 1   a [transforms.NAME] raised or returned what its fields cannot hold
    ├── ExecutorError                exit 1   a part of an epoch spread over a cluster failed beyond its retries
    └── StoreError                   exit 1   the Zarr store is unwritable, unreadable or not ours
        ├── StoreNotFoundError       exit 2   no store where one was given to read (a wrong path)
        ├── EpochNotFoundError (FileNotFoundError)
        ├── EpochNotReadyError       the epoch is still being written
        └── FormatVersionError       written by a newer pgprefetch
"""

from __future__ import annotations


class PgprefetchError(Exception):
    """Base class of every error pgprefetch raises on purpose."""

    exit_code: int = 1

    def __init__(self, message: str) -> None:
        """``message``: the one line a user reads (``str(e)``)."""
        super().__init__(message)


class ConfigError(PgprefetchError, ValueError):
    """A config file, a command-line option or the queries' shape is wrong: a usage error."""

    exit_code = 2


class SourceError(PgprefetchError):
    """PostgreSQL could not be reached, refused a statement, or returned data pgprefetch cannot use.

    ``transient`` marks a lost connection or a server going away: the dump retries those, counted under
    ``cause`` (see :mod:`pgprefetch.pg.retry`). ``connected``: the server was there (the dump got a
    snapshot, or the server answered that it is starting up), so a transient failure is retried.
    """

    def __init__(self, message: str, *, transient: bool = False, cause: str | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.cause = cause
        self.connected = False


class SampleError(SourceError):
    """One sample's rows do not fit the fields: a NULL, a wrong row count or a wrong array length."""


class TransformError(PgprefetchError):
    """A ``[transforms.NAME]`` raised, or returned what its fields cannot hold; names the transform and the sample.

    ``traceback``: the exception's traceback as text, from whichever process ran it (shown under ``--debug``);
    ``sample``: the failed sample's key as messages show it (``id=4``), None where no one sample is to blame;
    ``transform``: its name, where known.
    """

    def __init__(
        self, message: str, traceback: str = "", sample: str | None = None, transform: str | None = None
    ) -> None:
        super().__init__(message)
        self.traceback = traceback
        self.sample = sample
        self.transform = transform

    def __reduce__(self) -> tuple[type[TransformError], tuple[str, str, str | None, str | None]]:
        """Pickled whole: a worker process raises it, the dump reports it."""
        return type(self), (str(self), self.traceback, self.sample, self.transform)


class ExecutorError(PgprefetchError):
    """The Ray executor could not run (Ray missing, no cluster) or lost a part beyond its retries; names the part."""


class StoreError(PgprefetchError):
    """The Zarr store is missing, unwritable, or holds something pgprefetch did not write."""


class StoreNotFoundError(StoreError):
    """No pgprefetch store at the location given to read (``ls``, ``verify``, ``prune``, ``stats``).

    Exit 2, as for a config error: the path the user gave is wrong, which nothing but the user can fix; a
    store that exists but fails is exit 1 (a cron job's mail should tell the two apart).
    """

    exit_code = 2


class EpochNotFoundError(StoreError, FileNotFoundError):
    """The requested epoch is not in the store."""


class EpochNotReadyError(StoreError):
    """The requested epoch is still being written (or its dump died part-way)."""


class FormatVersionError(StoreError):
    """The store was written in a format version this pgprefetch does not read."""
