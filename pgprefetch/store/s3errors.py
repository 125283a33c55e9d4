"""An object store's errors as one line that names the store and never a secret (the S3 backend's boundary).

obstore's messages carry the request's URL, the endpoint (which may hold ``user:secret@``) and, for some
failures, what the AWS variables hold. Every error of :class:`pgprefetch.store.s3.S3Store` goes through
:func:`s3_error`, so that what a user reads is decided here, once.
"""

from __future__ import annotations

import os
import re

from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

from pgprefetch.errors import StoreError

_SECRETS = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


def configured_endpoint() -> str | None:
    """The endpoint the AWS variables name (a local S3 server, MinIO), or None for AWS itself."""
    env = os.environ
    return env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or env.get("AWS_ENDPOINT")


def shown_endpoint(endpoint: str) -> str:
    """``endpoint`` as a message may show it: without any ``user:secret@`` it carries."""
    return re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#]*@", r"\1", endpoint)


def s3_error(e: Exception, what: str, location: str, bucket: str) -> StoreError:
    """The one-line error for ``e``, raised while doing ``what`` on the store at ``location``."""
    text = str(e)
    for name in _SECRETS:
        secret = os.environ.get(name)
        if secret:
            text = text.replace(secret, "***")
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
