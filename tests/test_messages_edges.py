"""One clear line where a traceback or the wrong hint was (#51 items 7, 8, 10, 11, 12 and the first of 13).

Each edge is met as a user meets it, against the real PostgreSQL (and moto's S3 server for the endpoint's
secrets): the commands run as processes of their own, and what they print must be one line, exit non-zero,
with no traceback and nothing secret. The torch reader's device is a Python call, so it is checked as one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import torch

import pgprefetch
from pgprefetch import EpochDataset
from pgprefetch.errors import ConfigError, SourceError

from .harness.configs import s_config, scan_config
from .harness.db import execute
from .harness.dumps import dump
from .harness.mixing import CODE, MIX_TABLES, WEB, mix_config
from .harness.s3 import S3, SECRET

PIECES = ("Alpha1", "Bravo2")  # the two halves of a password: neither may be printed


def pgprefetch_cli(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``pgprefetch ARGS`` as a user runs it: a process of its own."""
    argv = [sys.executable, "-m", "pgprefetch", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a failed command printed, checked: non-zero exit, no traceback, nothing else."""
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "Traceback" not in out, out
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    assert lines[0].startswith("Error: "), out
    return lines[0]


def with_password(dsn: str, password: str) -> str:
    """``dsn`` (the test server's, which trusts its user) with ``password`` typed into its userinfo as is."""
    parts = urlsplit(dsn)
    if parts.password:
        pytest.skip("the server takes a password: a made-up one would be refused")
    server = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or 'postgres'}:{password}@{server}"))


def with_settings(dsn: str, settings: str) -> str:
    """``dsn`` with ``settings`` (``name=value&...``) added to its query."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(query=f"{parts.query}&{settings}" if parts.query else settings))


# --- 7: a password holding an unencoded "@" ---------------------------------------------------------------


def test_a_password_with_an_unencoded_at_is_told_to_percent_encode_it(s_table: str, tmp_path: Path) -> None:
    cfg = s_config(tmp_path)
    typed = with_password(s_table, "Alpha1@Bravo2")  # asyncpg reads the host as "Bravo2@<host>"
    line = one_error_line(pgprefetch_cli("dump", "--config", cfg, "--epoch", "0", "--dsn", typed))
    assert line.startswith("Error: cannot connect to postgresql://"), line
    assert line.endswith("(percent-encode special characters in the password: / as %2F, # as %23, ? as %3F, @ as %40)")
    assert "Name or service not known" not in line
    for piece in PIECES:
        assert piece not in line, line
    encoded = pgprefetch_cli(
        "dump", "--config", cfg, "--epoch", "0", "--dsn", with_password(s_table, "Alpha1%40Bravo2")
    )
    assert encoded.returncode == 0, encoded.stderr  # the hint is the fix: the same password, encoded, connects


# --- 13 (first half): a TLS file the DSN names that is not there --------------------------------------------


def test_a_missing_or_wrong_sslrootcert_is_named_not_taken_for_a_missing_socket(s_table: str, tmp_path: Path) -> None:
    cfg = s_config(tmp_path)
    missing = tmp_path / "certs" / "root.crt"
    dsn = with_settings(s_table, f"sslmode=verify-full&sslrootcert={missing}")
    line = one_error_line(pgprefetch_cli("dump", "--config", cfg, "--epoch", "0", "--dsn", dsn))
    assert line.endswith(f": the sslrootcert file {missing} does not exist (the DSN names it)"), line
    assert "server socket" not in line
    folder = with_settings(s_table, f"sslmode=require&sslrootcert={tmp_path}")
    line = one_error_line(pgprefetch_cli("dump", "--config", cfg, "--epoch", "0", "--dsn", folder))
    assert line.endswith(f": the sslrootcert file {tmp_path} is a folder, not a file (the DSN names it)"), line
    env = {**os.environ, "PGSSLROOTCERT": str(missing)}
    line = one_error_line(
        pgprefetch_cli(
            "dump", "--config", cfg, "--epoch", "0", "--dsn", with_settings(s_table, "sslmode=require"), env=env
        )
    )
    assert line.endswith(f": the sslrootcert file {missing} does not exist (PGSSLROOTCERT names it)"), line


def test_a_missing_server_socket_still_says_so(tmp_path: Path) -> None:
    dsn = f"postgresql://someone@/db?host={tmp_path / 'no-server-here'}"
    line = one_error_line(pgprefetch_cli("dump", "--config", s_config(tmp_path), "--epoch", "0", "--dsn", dsn))
    assert "(no server socket there: is the server up?" in line, line


# --- 8: a scan window longer than every series ---------------------------------------------------------------

SERIES = (
    "CREATE TABLE series (sid int, t int, f0 real, f1 real, label int)",
    "INSERT INTO series SELECT s, t, t, t * 2, s FROM generate_series(1, 5) s, generate_series(1, 10 + s) t",
)
TOO_LONG = (
    "[samples] window = 64 is longer than every series (the longest has 15 rows): no sample fits; "
    "set window to at most 15, or check the table's key column"
)


def test_check_of_a_window_longer_than_every_series_names_the_window_and_the_longest(db: str, tmp_path: Path) -> None:
    execute(db, *SERIES)
    cfg = scan_config(tmp_path, table="series", key="sid", order="t", window=64)
    proc = pgprefetch_cli("check", "--config", cfg, "--dsn", db)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    assert "keys query" not in out, out  # scan mode has none
    assert out.splitlines()[0] == f"error: {TOO_LONG}", out  # then the check's count of problems


def test_a_window_longer_than_every_series_on_ray_names_the_window_and_the_longest(
    ray_cluster: object, db: str, tmp_path: Path
) -> None:
    execute(db, *SERIES)
    cfg = scan_config(tmp_path, table="series", key="sid", order="t", window=64)
    with pytest.raises(SourceError) as e:
        pgprefetch.dump(cfg, epochs=0, dsn=db, executor="ray", parts=2)
    assert str(e.value) == TOO_LONG


# --- 10: a malformed mix record in the store -------------------------------------------------------------------


@pytest.mark.parametrize(
    "after_hash",
    [
        pytest.param("²", id="superscript-two"),
        pytest.param("1" * 5000, id="5000-digits"),
        pytest.param("１２", id="fullwidth"),
    ],
)
def test_a_malformed_mix_record_stops_the_next_dump_in_one_line(db: str, tmp_path: Path, after_hash: str) -> None:
    execute(db, *MIX_TABLES)
    cfg = mix_config(tmp_path, {"web": {"weight": 1, **WEB}, "code": {"weight": 1, **CODE}}, samples=50)
    assert pgprefetch_cli("dump", "--config", cfg, "--epoch", "0", "--dsn", db, "-q").returncode == 0
    metadata = tmp_path / "store.zarr" / "epoch-00000" / "zarr.json"
    group = json.loads(metadata.read_text())
    (web,) = [s for s in group["attributes"]["pgprefetch"]["mix"]["sources"] if s["name"] == "web"]
    assert web["end"]["after"] is not None  # 25 of web's 300 keys taken: the record names the last one
    web["end"]["after"][0] = after_hash
    metadata.write_text(json.dumps(group))
    line = one_error_line(pgprefetch_cli("dump", "--config", cfg, "--epoch", "1", "--dsn", db))
    assert line == (
        f"Error: {tmp_path / 'store.zarr'}/epoch 1: its mix record is malformed "
        "(source 'web': its last key's hash); rewrite that epoch with --force"
    ), line


# --- 11: a CUDA device without CUDA ----------------------------------------------------------------------------


def test_to_device_on_a_device_torch_cannot_use_is_one_line_naming_it(s_table: str, tmp_path: Path) -> None:
    dump(s_config(tmp_path), s_table)
    ds = EpochDataset(tmp_path / "store.zarr", 0)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not count:
        with pytest.raises(ConfigError) as e:
            ds.to_device("cuda:0")  # at the call, not at the first batch
        message = str(e.value)
        assert message.startswith("to_device('cuda:0'): "), message
        assert "built without CUDA" in message or "no CUDA device on this machine" in message, message
        assert "\n" not in message
    else:  # a GPU machine: a device number it does not have
        with pytest.raises(ConfigError, match=rf"^to_device\('cuda:{count}'\): this machine has {count} CUDA device"):
            ds.to_device(f"cuda:{count}")
    with pytest.raises(ConfigError, match=r"^to_device\('gpu'\): not a torch device \(Expected one of cpu, cuda"):
        ds.to_device("gpu")
    assert len(list(ds.to_device("cpu"))) == len(ds)  # the CPU is always there


# --- 12: the endpoint's secrets in S3 errors -------------------------------------------------------------------


def test_an_upper_case_http_endpoint_is_plain_http(s3: S3) -> None:
    url = f"s3://{s3.bucket()}/x"
    endpoint = "HTTP://user:Alpha1Bravo2@" + s3.endpoint.removeprefix("http://")  # RFC 3986: schemes have no case
    proc = pgprefetch_cli("ls", "--store", url, env={**os.environ, **s3.env, "AWS_ENDPOINT_URL": endpoint})
    assert one_error_line(proc) == f"Error: no store at {url} (nothing there, or not a pgprefetch store)"  # reached


@pytest.mark.parametrize(
    "endpoint",
    [
        pytest.param("HTTP://user:Alpha1Bravo2@127.0.0.1:9", id="userinfo-unreachable"),  # nothing listens there
        pytest.param("http://127.0.0.1:9/?token=tok3nValue", id="query-unreachable"),
        pytest.param("http://user:Alpha1Bravo2@{host}/?token=tok3nValue", id="both-answered"),  # a mangled URL: 500
        pytest.param("Http://{host}?X-Amz-Security-Token=tok3nValue", id="token-answered"),
    ],
)
def test_an_endpoint_s_userinfo_and_query_never_reach_an_s3_error(s3: S3, endpoint: str) -> None:
    url = f"s3://{s3.bucket()}/x"
    endpoint = endpoint.format(host=s3.endpoint.removeprefix("http://"))
    line = one_error_line(
        pgprefetch_cli("ls", "--store", url, env={**os.environ, **s3.env, "AWS_ENDPOINT_URL": endpoint})
    )
    assert line.startswith(f"Error: {url}: "), line
    for secret in ("Alpha1Bravo2", "tok3nValue", SECRET):
        assert secret not in line, line


# --- an endpoint that cannot be parsed: obstore would panic, or send the password's tail as a path -----------


@pytest.mark.parametrize(
    "endpoint",
    [
        pytest.param("http://user:Alpha1/Bravo2@{host}", id="slash"),
        pytest.param("http://user:Alpha1 Bravo2@{host}", id="space"),
        pytest.param("http://user:Alpha1#Bravo2@{host}", id="hash"),
        pytest.param("http://user:Alpha1?Bravo2@{host}", id="question-mark"),
        pytest.param("http://user:Alpha1@Bravo2@{host}", id="at"),
        pytest.param("http://user:Alpha1Bravo2@127.0.0.1:99999", id="port-out-of-range"),
        pytest.param("http://user:Alpha1Bravo2@{host}/`", id="backquote"),
        pytest.param("ftp://user:Alpha1Bravo2@{host}", id="not-http"),
    ],
)
def test_an_endpoint_that_cannot_be_parsed_is_refused_in_one_line_naming_its_variable(s3: S3, endpoint: str) -> None:
    url = f"s3://{s3.bucket()}/x"
    endpoint = endpoint.format(host=s3.endpoint.removeprefix("http://"))
    env = {**os.environ, **s3.env, "AWS_ENDPOINT_URL": endpoint}
    line = one_error_line(pgprefetch_cli("ls", "--store", url, env=env))
    assert line.startswith(f"Error: {url}: AWS_ENDPOINT_URL "), line
    assert "percent-encode" in line or "http://" in line, line
    for secret in (*PIECES, SECRET):
        assert secret not in line, line


def test_a_panic_of_obstore_is_one_store_error(s3: S3) -> None:
    """A Rust panic is a BaseException that no ``except Exception`` catches; the store maps it like any error.

    The endpoint check keeps every known panic out, so the client here is given the URL behind its back.
    """
    import obstore

    from pgprefetch.errors import StoreError
    from pgprefetch.store.s3 import S3Store

    store = S3Store(f"s3://{s3.bucket()}/x")
    store._client = obstore.store.S3Store(
        store.bucket, endpoint=s3.endpoint + "/`Alpha1Bravo2", client_options={"allow_http": True}
    )
    with pytest.raises(StoreError) as caught:
        store.exists()
    assert str(caught.value).startswith(f"{store.location}: looking up zarr.json: the S3 client failed ("), caught.value
    assert "\n" not in str(caught.value)
    assert "Alpha1" not in str(caught.value)
