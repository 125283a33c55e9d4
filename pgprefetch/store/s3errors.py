"""An object store's errors as one line that names the store and never a secret (the S3 backend's boundary).

obstore's messages carry the request's URL, the endpoint (which may hold ``user:secret@`` or a query
string such as ``?token=``) and, for some failures, what the AWS variables hold. Every error of
:class:`pgprefetch.store.s3.S3Store` goes through :func:`s3_error`, so that what a user reads is decided
here, once: the AWS secrets, and every URL's userinfo and query string, are gone from it.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote

from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

from pgprefetch.errors import StoreError

_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


def configured_endpoint() -> str | None:
    """The endpoint the AWS variables name (a local S3 server, MinIO), or None for AWS itself."""
    env = os.environ
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT")


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


def s3_error(e: Exception, what: str, location: str, bucket: str) -> StoreError:
    """The one-line error for ``e``, raised while doing ``what`` on the store at ``location``."""
    text = scrub(str(e))
    reason = text.splitlines()[0] if text else type(e).__name__
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
