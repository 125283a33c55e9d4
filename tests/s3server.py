"""A real S3 API for the tests: moto's standalone server on 127.0.0.1, spoken to over HTTP like S3."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
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


@contextmanager
def s3_server() -> Iterator[S3]:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        env = {
            "AWS_ACCESS_KEY_ID": "AKIATESTPGPREFETCH",
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
            "PGPREFETCH_S3_RETRIES": "1",
        }
        yield S3(endpoint, env)
    finally:
        server.stop()
