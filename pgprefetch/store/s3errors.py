"""An object store's errors as one line that names the store and never a secret (the S3 backend's boundary).

obstore's messages carry the request's URL, the endpoint (which may hold ``user:secret@`` or a query
string such as ``?token=``) and, for some failures, what the AWS variables hold. Every error of
:class:`pgprefetch.store.s3.S3Store` goes through :func:`s3_error`, so that what a user reads is decided
here, once: the AWS secrets, and every URL's userinfo and query string, are gone from it.
"""

from __future__ import annotations

import os
import re
import string
from urllib.parse import unquote, urlsplit

from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

from pgprefetch.errors import StoreError

_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
"""The variables that may name the endpoint, the first set one winning (obstore reads them in this order)."""

PERCENT_ENCODE = (
    "percent-encode special characters in its password: / as %2F, ? as %3F, # as %23, @ as %40, a space as %20"
)


def configured_endpoint() -> str | None:
    """The endpoint the AWS variables name (a local S3 server, MinIO), or None for AWS itself."""
    found = _endpoint_variable()
    return found[1] if found else None


def _endpoint_variable() -> tuple[str, str] | None:
    """The variable that names the endpoint, and its value; None when none is set."""
    return next(((name, os.environ[name]) for name in _ENDPOINT_VARIABLES if os.environ.get(name)), None)


def checked_endpoint(location: str) -> str | None:
    """The configured endpoint, refused in one line that names its variable, never its value, unless it parses.

    obstore's HTTP layer panics (a Rust traceback) on a URL it cannot take apart rather than raising, and a
    password typed with a raw ``/``, ``?`` or ``#`` ends the host part early, so that the rest of the
    password would become a path a message then shows. An endpoint is checked here, before any client is made.
    """
    found = _endpoint_variable()
    if found is None:
        return None
    name, endpoint = found
    problem = endpoint_problem(endpoint)
    if problem:
        raise StoreError(f"{location}: {name} {problem}")
    return endpoint


def endpoint_problem(endpoint: str) -> str | None:
    """What is wrong with ``endpoint`` as an S3 server's URL, in words that quote none of it; None if nothing.

    Only what RFC 3986 lets a URL hold passes: obstore's HTTP layer panics on some of the rest (a backquote,
    ``<``, a space, a non-ASCII host) and passes others on unchecked. An ``@`` anywhere after the host is
    refused too, in a query's value as well: it is where a password with an unencoded ``/``, ``?`` or ``#``
    leaves its tail, and a server reads it percent-encoded the same.
    """
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return "must start with http:// or https:// (the S3 server's URL, such as http://localhost:9000)"
    if not _URI_CHARACTERS.issuperset(endpoint):
        return f"holds a space or another character a URL cannot ({PERCENT_ENCODE})"
    try:
        parts = urlsplit(endpoint)
        if "@" in parts.netloc.rpartition("@")[0] or "@" in rest[len(parts.netloc) :]:
            return f"cannot be parsed: an unencoded @, or a / ? # before the @ ({PERCENT_ENCODE})"
        parts.port  # noqa: B018 - urllib parses the port when asked for it
        host = parts.hostname or ""
    except ValueError:
        return f"cannot be parsed: its port is not a number up to 65535, or {PERCENT_ENCODE}"
    if not re.fullmatch(r"[a-z0-9._-]+|[0-9a-f:.]*:[0-9a-f:.]*", host):
        return "names no host, or one that is neither a name nor an IP address (such as http://localhost:9000)"
    return None


_URI_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-._~:/?#[]@!$&'()*+,;=%")
"""The characters a URL may hold (RFC 3986's unreserved, reserved and ``%``); anything else is percent-encoded."""


_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^\s/?#]*@)?([^\s?#]*)([?#]\S*)?")
"""A URL in a message: its scheme (any case), userinfo (up to its last ``@``), host and path, query or fragment."""

MIN_SECRET = 3
"""Pieces of an endpoint's userinfo or query this long or longer are scrubbed anywhere; shorter would eat words."""


def allows_http(endpoint: str | None) -> bool:
    """Whether ``endpoint`` is plain HTTP, its scheme in any case (``HTTP://`` is ``http://``, as in RFC 3986)."""
    return bool(endpoint) and str(endpoint).partition("://")[0].strip().lower() == "http"


def shown_endpoint(endpoint: str) -> str:
    """``endpoint`` as a message may show it: without any ``user:secret@`` or query string it carries."""
    return scrub(endpoint)


def scrub(text: str) -> str:
    """``text`` without a secret: the AWS variables' values, every URL's userinfo and query, the endpoint's pieces.

    The endpoint's own userinfo and query values go wherever they appear, as typed or percent-decoded: a
    client may quote the URL its own way (lower-cased scheme, re-encoded), which the URL pattern still finds,
    but a value quoted on its own would not be.
    """
    for name in _SECRETS:
        secret = os.environ.get(name)
        if secret:
            text = text.replace(secret, "***")
    text = _URL.sub(lambda m: m[1] + m[3] + ("?***" if m[4] else ""), text)
    for piece in _endpoint_secrets(configured_endpoint()):
        text = text.replace(piece, "***")
    return text


def _endpoint_secrets(endpoint: str | None) -> list[str]:
    """The endpoint's userinfo, its password and its query's values, as typed and percent-decoded, longest first.

    A query's names (``token``) are ordinary words and stay; only what follows an ``=`` is a secret.
    """
    if not endpoint or "://" not in endpoint:
        return []
    rest = endpoint.split("://", 1)[1]
    userinfo = re.split(r"[/?#]", rest, maxsplit=1)[0].rpartition("@")[0]  # to the last "@": it may hold more
    found = [userinfo, userinfo.partition(":")[2]] if userinfo else []
    query = re.search(r"[?#](.*)", rest[len(userinfo) :])
    if query:
        found += [query[1], *(field.partition("=")[2] for field in re.split(r"[&;]", query[1]))]
    forms = {form for value in found for form in (value, unquote(value))}
    return sorted((f for f in forms if len(f) >= MIN_SECRET), key=len, reverse=True)


def is_panic(e: BaseException) -> bool:
    """Whether ``e`` is a Rust panic that obstore let through (pyo3's ``PanicException``, not importable by name)."""
    return type(e).__name__ == "PanicException"


def s3_error(e: BaseException, what: str, location: str, bucket: str) -> StoreError:
    """The one-line error for ``e``, raised while doing ``what`` on the store at ``location``."""
    text = scrub(str(e))
    reason = text.splitlines()[0] if text else type(e).__name__
    if is_panic(e):
        found = _endpoint_variable()
        check = f"check {found[0]}" if found else "check the AWS variables"
        return StoreError(f"{location}: {what}: the S3 client failed ({reason[:160]}); {check}")
    if "NoSuchBucket" in text:
        return StoreError(f"{location}: bucket {bucket!r} does not exist")
    if isinstance(e, PermissionDeniedError | UnauthenticatedError) or re.search(
        r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|403 Forbidden", text
    ):
        return StoreError(
            f"{location}: access denied ({what}); check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN"
        )
    if re.search(r"error sending request|[Cc]onnection refused|dns error|timed out|Connect", text):
        endpoint = configured_endpoint()
        where = shown_endpoint(endpoint) if endpoint else "AWS"
        detail = re.sub(r"^.*?(error sending request|Connection refused|dns error|timed out)", r"\1", reason)
        return StoreError(f"{location}: cannot reach the object store at {where} ({what}: {detail[:160]})")
    return StoreError(f"{location}: {what}: {reason}")
