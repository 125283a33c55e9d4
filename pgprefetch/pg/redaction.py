"""Passwords kept out of every message: a DSN as it may be shown, and text scrubbed of its password.

A password can sit in a URI (``postgresql://user:secret@host``, percent-encoded or not, even holding an
unencoded ``/`` or ``#`` that a URL parser gives up on) or in a keyword (``password=secret``). Messages
from the server or asyncpg may repeat it; every error that shows a DSN or a connection failure passes
through here.
"""

from __future__ import annotations

import re
from urllib.parse import unquote


def _password(dsn: str) -> str | None:
    """The password in a DSN, found without a URL parser (which gives up on an unencoded ``/`` or ``#``)."""
    if "://" in dsn:
        rest = dsn.split("://", 1)[1]
        userinfo = rest[: rest.rfind("@")] if "@" in rest else ""
        if ":" in userinfo and userinfo.split(":", 1)[1]:
            return userinfo.split(":", 1)[1]
    m = re.search(r"(?i)password\s*=\s*('([^']*)'|[^&\s]+)", dsn)
    return (m[2] if m[2] is not None else m[1]) if m else None


def redact(dsn: str | None) -> str:
    """The DSN as it may be shown: every form of its password replaced by ``***``."""
    if not dsn:
        return "the server from the PG* environment"
    if "://" in dsn:
        scheme, rest = dsn.split("://", 1)
        at = rest.rfind("@")
        if at >= 0 and ":" in rest[:at] and rest[:at].split(":", 1)[1]:
            rest = f"{rest[:at].split(':', 1)[0]}:***{rest[at:]}"
        dsn = f"{scheme}://{rest}"
    return re.sub(r"(?i)(password\s*=\s*)('[^']*'|[^&\s]+)", r"\1***", dsn)


def scrub(text: str, dsn: str | None) -> str:
    """``text`` with the DSN's password, as typed or percent-decoded, replaced by ``***``."""
    password = _password(dsn) if dsn else None
    if not password:
        return text
    for form in sorted({password, unquote(password)}, key=len, reverse=True):
        text = text.replace(form, "***")
    return text
