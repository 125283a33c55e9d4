"""Passwords kept out of every message: a DSN as it may be shown, and text scrubbed of its password.

A password can sit in a URI's userinfo (``postgresql://user:secret@host``, percent-encoded or not, even
holding an unencoded ``/``, ``#``, ``?`` or ``@`` that a URL parser gives up on) or in a keyword
(``?password=secret`` in a URI, ``password=secret`` in a keyword/value DSN). A URI's query value runs from
``password=`` to the next ``&`` that starts another field (or the end): whatever it holds, a space, an
``@`` or an ``&`` included, is secret.
Messages from the server or asyncpg may repeat the password, or pieces of it (a parser that split it at a
``/`` quotes what came before), so :func:`scrub` removes the pieces too. Every error that shows a DSN or a
connection failure passes through here.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

# In a URI the value ends at the next "&" that starts another field (a "name=value"; an "&" followed by no
# "=" before the next "&" is the password's own, which asyncpg would otherwise quote as a "bad query field"),
# or at the end. In a keyword/value DSN it ends at whitespace, unless quoted.
_URI_PASSWORD = re.compile(r"(?i)([?&]password\s*=\s*)([^&]*(?:&[^&=]*(?=&|$))*)")
_KEYWORD_PASSWORD = re.compile(r"(?i)((?:^|\s)password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)")

_SEPARATORS = re.compile(r"[/#?@&:\s]+")
"""Where a parser may cut a password it cannot read (an unencoded ``/`` ends the port, ``?`` the path)."""

MIN_FRAGMENT = 3
"""Pieces of a password this long or longer are scrubbed from messages; shorter ones would eat ordinary words."""


def _userinfo_end(rest: str) -> int:
    """Where a URI's userinfo ends (the index of its last ``@`` before any ``password=``), or -1 without one."""
    query = _URI_PASSWORD.search(rest)
    head = rest[: query.start()] if query else rest
    return head.rfind("@")


def _passwords(dsn: str) -> list[str]:
    """Every password written in ``dsn`` (as typed), found without a URL parser."""
    found = []
    if "://" in dsn:
        rest = dsn.split("://", 1)[1]
        at = _userinfo_end(rest)
        if at >= 0 and ":" in rest[:at] and rest[:at].split(":", 1)[1]:
            found.append(rest[:at].split(":", 1)[1])
        found += [m[2] for m in _URI_PASSWORD.finditer(rest) if m[2]]
    else:
        for m in _KEYWORD_PASSWORD.finditer(dsn):
            value = m[2]
            found.append(value[1:-1] if value.startswith("'") and value.endswith("'") else value)
    return [p for p in found if p]


def redact(dsn: str | None) -> str:
    """The DSN as it may be shown: every form of its password replaced by ``***``."""
    if not dsn:
        return "the server from the PG* environment"
    if "://" not in dsn:
        return _KEYWORD_PASSWORD.sub(r"\1***", dsn)
    scheme, rest = dsn.split("://", 1)
    rest = _URI_PASSWORD.sub(r"\1***", rest)
    at = _userinfo_end(rest)
    if at >= 0 and ":" in rest[:at] and rest[:at].split(":", 1)[1]:
        rest = f"{rest[:at].split(':', 1)[0]}:***{rest[at:]}"
    return f"{scheme}://{rest}"


def secrets(dsn: str | None) -> list[str]:
    """What must never be shown of ``dsn``: each password as typed and decoded, and its longer pieces.

    Longest first, so that replacing them in turn never leaves the tail of a longer one behind.
    """
    forms: set[str] = set()
    for password in _passwords(dsn) if dsn else []:
        for form in (password, unquote(password), unquote(password.replace("+", " "))):
            forms.add(form)
            forms.update(piece for piece in _SEPARATORS.split(form) if len(piece) >= MIN_FRAGMENT)
    return sorted((f for f in forms if f), key=len, reverse=True)


def scrub(text: str, dsn: str | None) -> str:
    """``text`` with the DSN's password, as typed or percent-decoded, and its pieces replaced by ``***``."""
    for form in secrets(dsn):
        text = text.replace(form, "***")
    return text
