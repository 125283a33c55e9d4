"""A real S3 API for the tests: moto's standalone server on 127.0.0.1, spoken to over HTTP like S3."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SECRET = "s3cr3t-Never-Printed-9f2e"  # the tests check no output, log or object ever shows it


@dataclass(frozen=True)
class S3:
    """A running server: its endpoint, and the environment that points pgprefetch (and boto3) at it."""

    endpoint: str
    env: dict[str, str]

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )

    def bucket(self) -> str:
        """A new, empty bucket."""
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name

    def objects(self, bucket: str, prefix: str) -> dict[str, bytes]:
        """Every object under ``prefix``, by key relative to it."""
        client = self.client()
        out = {}
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                out[item["Key"].removeprefix(prefix).lstrip("/")] = body
        return out


def epoch_objects(s3: S3, bucket: str, prefix: str, epoch: int = 0) -> dict[str, bytes]:
    """The objects of an epoch, as ``chunk_bytes`` names a local epoch's files (its group zarr.json left out)."""
    objects = s3.objects(bucket, f"{prefix}/epoch-{epoch:05d}/")
    return {key: body for key, body in objects.items() if "/" in key}


def atomic_conditional_puts() -> None:
    """Make moto's conditional put decide as S3 does: its precondition and its write as one step.

    moto checks ``If-Match`` / ``If-None-Match`` and then writes, with no lock between: two puts racing on
    one key can both pass the check, so a compare-and-swap on it (the store's vocabulary) loses an update,
    which S3 never does. One lock around moto's put makes it S3's; the store's code is what the tests test.
    """
    from moto.s3.responses import S3Response

    original = S3Response.put_object
    if getattr(original, "atomic", False):
        return
    lock = threading.Lock()

    def put_object(self: Any) -> Any:
        with lock:
            return original(self)

    put_object.atomic = True  # type: ignore[attr-defined]
    S3Response.put_object = put_object  # type: ignore[method-assign]


@contextmanager
def s3_server() -> Iterator[S3]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    atomic_conditional_puts()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield _running(f"http://{host}:{port}")
    finally:
        server.stop()


def _running(endpoint: str) -> S3:
    env = {
        "AWS_ACCESS_KEY_ID": "AKIATESTPGPREFETCH",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
        "PGPREFETCH_S3_RETRIES": "1",
    }
    return S3(endpoint, env)


# moto's threaded server in a process of its own: prints its port, stops when its stdin closes.
_SERVER = (
    "import logging, sys\n"
    f"sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})\n"  # (this harness, from anywhere)
    "from moto.server import ThreadedMotoServer\n"
    "from tests.harness.s3 import atomic_conditional_puts\n"
    "atomic_conditional_puts()\n"
    "logging.getLogger('werkzeug').setLevel(logging.ERROR)\n"
    "server = ThreadedMotoServer(ip_address='127.0.0.1', port=0, verbose=False)\n"
    "server.start()\n"
    "print('PORT', server.get_host_and_port()[1], flush=True)\n"
    "sys.stdin.read()\n"
    "server.stop()\n"
)


@contextmanager
def moto_process() -> Iterator[tuple[int, str]]:
    """moto's server in a process of its own: its pid and endpoint; stopped (stdin closed, then killed) after.

    For a harness whose own threads must not wait on moto's GIL (the soak), or that measures moto's CPU
    apart from its own (the S3 bench).
    """
    import subprocess
    import sys
    import tempfile

    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=tempfile.gettempdir(),
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        said = proc.stdout.readline().split()
        if len(said) != 2 or said[0] != "PORT":
            raise RuntimeError(f"moto's server did not start (it said {said!r})")
        yield proc.pid, f"http://127.0.0.1:{said[1]}"
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]


@contextmanager
def s3_server_process() -> Iterator[S3]:
    """The same server as :func:`s3_server`, in a process of its own (:func:`moto_process`)."""
    with moto_process() as (_, endpoint):
        yield _running(endpoint)


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """This process's environment with ``values`` set (obstore and pgprefetch read AWS_*), restored after."""
    import os

    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


_ERRORS = {
    503: b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>",
    500: b"<Error><Code>InternalError</Code><Message>We encountered an internal error.</Message></Error>",
}


@contextmanager
def throttling_proxy(
    endpoint: str, every: int, refuse_with: Callable[[str], int | None] = lambda request: 503
) -> Iterator[tuple[str, list[int]]]:
    """An HTTP proxy to ``endpoint`` that answers every ``every``-th request with S3's 503 SlowDown.

    ``refuse_with`` is asked at each such request, given it ("GET /bucket/key"): the status to refuse it
    with (503 SlowDown, 500 InternalError, or 0: the connection closed without an answer, as by a server
    restarting), or None to let it through, so faults can come and go on a schedule (the soak's).
    Yields its endpoint and a one-item list counting the requests it refused.
    """
    import http.client
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import urlsplit

    target = urlsplit(endpoint)
    seen, refused = [0], [0]
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None: ...

        def _any(self) -> None:
            # One request per connection: a pooled connection the proxy had closed would be a failure of
            # the proxy, not of the retries under test.
            self.close_connection = True
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with lock:
                seen[0] += 1
                status = refuse_with(f"{self.command} {self.path}") if seen[0] % every == 0 else None
                refused[0] += status is not None
            if status == 0:
                return  # dropped unanswered: the connection closes (close_connection)
            if status is not None:
                error = _ERRORS[status]
                self.send_response(status)
                self.send_header("Content-Length", str(len(error)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(error)
                return
            upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
            upstream.request(self.command, self.path, body=body, headers=dict(self.headers))
            reply = upstream.getresponse()
            data = reply.read()
            self.send_response(reply.status)
            for name, value in reply.getheaders():  # a HEAD's Content-Length is the object's size: kept
                if name.lower() not in ("transfer-encoding", "connection") and not (
                    name.lower() == "content-length" and self.command != "HEAD"
                ):
                    self.send_header(name, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            upstream.close()

        do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _any

    class Server(ThreadingHTTPServer):
        request_queue_size = 128  # the default backlog of 5 refuses connections when the machine is busy
        daemon_threads = True

        def handle_error(self, request: object, client_address: object) -> None:
            """A client that went away mid-answer (a process killed by a test) is no error of the proxy."""
            import sys

            if not isinstance(sys.exc_info()[1], ConnectionError):
                super().handle_error(request, client_address)  # type: ignore[arg-type]

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", refused
    finally:
        server.shutdown()
        server.server_close()
