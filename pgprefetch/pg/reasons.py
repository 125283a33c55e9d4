"""Why a connection could not be made, on one line, with what to check and nothing of the password.

A connection fails for reasons asyncpg words for a network, not for the DSN the user typed: a password
holding an unencoded ``@`` is cut at its first ``@`` (the rest becomes the host, which no DNS knows), and
a TLS file the DSN names that is not there is the same ``FileNotFoundError`` as a missing server socket.
Each such reason is told here from the DSN itself, so that the hint names what the user must fix.
"""

from __future__ import annotations

import errno
import os
from urllib.parse import parse_qs, urlsplit

import asyncpg

from pgprefetch.pg.redaction import scrub

UNPARSABLE = (
    "the DSN cannot be parsed (percent-encode special characters in the password: "
    "/ as %2F, # as %23, ? as %3F, @ as %40)"
)

_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")

_TLS_FILES = {"sslrootcert": "require", "sslcrl": "require", "sslcert": "allow", "sslkey": "allow"}
"""Each TLS file a DSN may name, and the least ``sslmode`` at which asyncpg loads it (below it, it is ignored)."""

_FILE_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def unencoded_at(dsn: str | None) -> bool:
    """Whether ``dsn``'s userinfo holds an ``@`` of its own, which asyncpg would read as the start of the host.

    asyncpg splits a URI's authority at its first ``@``: ``me:p@ss@host`` connects as password ``p`` to host
    ``ss@host``. No host name holds an ``@``, so a second one is always a password's (or a user's); it is
    refused before connecting, so that no piece of the password goes out as a host name to look up.
    """
    if not dsn or "://" not in dsn:
        return False
    try:
        authority = urlsplit(dsn).netloc
    except ValueError:  # asyncpg refuses it too, and connect_reason says to percent-encode
        return False
    return authority.count("@") > 1


def connect_reason(e: BaseException, dsn: str | None) -> str:
    """Why a connection failed, on one line, with nothing of the password and with what to check.

    asyncpg's parse errors quote the piece of the DSN they choked on, which for a password holding an
    unencoded ``/``, ``#`` or ``?`` is a piece of the password ("invalid literal for int() with base 10:
    'Alpha1'"): they are never echoed. A refused connection names only an address; the user needs to hear
    that nothing listens there.
    """
    if isinstance(e, ValueError) and not isinstance(e, asyncpg.ClientConfigurationError):
        return UNPARSABLE
    reason = scrub(str(e) or type(e).__name__, dsn).splitlines()[0]
    if isinstance(e, ConnectionRefusedError) or (isinstance(e, OSError) and e.errno == errno.ECONNREFUSED):
        reason += (
            " (nothing listens there: is the server up on that host and port? "
            "`pgprefetch server` prints the DSN of its embedded one)"
        )
    elif isinstance(e, _FILE_ERRORS) and (problem := tls_file_problem(dsn)):
        reason = problem
    elif isinstance(e, FileNotFoundError):
        reason += " (no server socket there: is the server up? `pgprefetch server` prints the DSN of its embedded one)"
    return reason


def tls_file_problem(dsn: str | None) -> str | None:
    """What is wrong with a TLS file that ``dsn`` (or a ``PGSSL*`` variable) names and asyncpg loads, if anything.

    asyncpg reads these files before it opens a socket, and its error names neither the file nor the
    setting (``[Errno 2] No such file or directory``), which a missing server socket says too.
    """
    query: dict[str, list[str]] = {}
    if dsn and "://" in dsn:
        try:
            query = parse_qs(urlsplit(dsn).query)
        except ValueError:
            query = {}

    def setting(name: str) -> tuple[str | None, str]:
        values = query.get(name)  # asyncpg takes a setting's last value
        if values:
            return values[-1], "the DSN names it"
        variable = f"PG{name.upper()}"
        return os.environ.get(variable), f"{variable} names it"

    mode = setting("sslmode")[0] or "prefer"
    level = _SSL_MODES.index(mode) if mode in _SSL_MODES else len(_SSL_MODES)
    for name, least in _TLS_FILES.items():
        path, named = setting(name)
        if not path or level < _SSL_MODES.index(least):
            continue
        if not os.path.exists(path):
            return f"the {name} file {path} does not exist ({named})"
        if os.path.isdir(path):
            return f"the {name} file {path} is a folder, not a file ({named})"
        if not os.access(path, os.R_OK):
            return f"the {name} file {path} cannot be read by this user ({named})"
    return None
