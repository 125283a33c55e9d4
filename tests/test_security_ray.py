"""The Ray executor's exposure (#36.7, #37.15): who can reach the cluster a dump uses, and what it is sent.

- A cluster the dump starts for itself listens on 127.0.0.1 only, for a user who sets nothing (the suite's
  ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is taken out of the dump's environment).
- The parts and readers get the config with the DSN's password replaced; the whole DSN reaches them through
  the object store, and nothing of Ray's session folder holds the password after the dump.
- A cluster started with ``ray start`` under token authentication, joined without the token, is one line
  with what to set, at once (Ray retries it for 20 s); with ``RAY_AUTH_MODE=token`` and the token it dumps.

Ray is slow on a small machine: three tests, each bounded by timeouts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import psutil
import pytest

import pgprefetch
import pgprefetch.write.ray.driver as ray_driver
import pgprefetch.write.ray.scan as ray_scan

from .harness.configs import s_config
from .harness.db import execute

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = ("127.0.0.1", "::ffff:127.0.0.1", "::1")


@pytest.fixture
def pw_dsn(s_table: str) -> Iterator[tuple[str, str]]:
    """``s_table``'s database reached as a role of its own with a password: (DSN, password)."""
    role, password = f"pw_{uuid.uuid4().hex[:10]}", f"Ray-Secret-{secrets.token_hex(8)}"
    execute(s_table, f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    execute(s_table, f"GRANT SELECT ON s TO {role}")
    parts = urlsplit(s_table)
    host = parts.netloc.rpartition("@")[2]
    try:
        yield urlunsplit(parts._replace(netloc=f"{role}:{password}@{host}")), password
    finally:
        execute(s_table, f"DROP OWNED BY {role}")
        execute(s_table, f"DROP ROLE {role}")


def _strings(value: Any, seen: set[int] | None = None) -> Iterator[str]:
    """Every string inside a task's arguments: dataclasses, containers, dict keys and values."""
    seen = set() if seen is None else seen
    if id(value) in seen or isinstance(value, np.ndarray | bytes | int | float | type(None)):
        return
    seen.add(id(value))
    if isinstance(value, str):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _strings(getattr(value, f.name), seen)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k, seen)
            yield from _strings(v, seen)
    elif isinstance(value, list | tuple | set | frozenset):
        for v in value:
            yield from _strings(v, seen)


class _Sent:
    """A Ray remote function that records the arguments the driver sends it, then sends them on."""

    def __init__(self, remote: Any, sent: list[Any], options: dict[str, Any] | None = None) -> None:
        self.remote_function, self.sent, self.kw = remote, sent, options

    def options(self, **kw: Any) -> _Sent:
        return _Sent(self.remote_function, self.sent, kw)

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self.sent.append((args, kwargs, self.kw))
        target = self.remote_function.options(**self.kw) if self.kw else self.remote_function
        return target.remote(*args, **kwargs)


def test_parts_and_readers_are_sent_the_dsn_without_its_password_and_still_connect(
    ray_cluster: object, pw_dsn: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dsn, password = pw_dsn
    sent: list[Any] = []
    monkeypatch.setattr(ray_driver, "run_part", _Sent(ray_driver.run_part, sent))
    monkeypatch.setattr(ray_scan, "read_block", _Sent(ray_scan.read_block, sent))
    (tmp_path / "q").mkdir()
    query = s_config(tmp_path / "q")
    scan = tmp_path / "scan.toml"
    scan.write_text('[samples]\ntable = "s"\nkey = ["id"]\n[fields.v]\ncolumns = ["v"]\ndtype = "float32"\n'
                    '[batches]\nsize = 16\n[store]\npath = "scan.zarr"\n')  # fmt: skip
    for config in (query, scan):
        (result,) = pgprefetch.dump(config, epochs=0, dsn=dsn, executor="ray", parts=2)
        assert (result.status, result.parts) == ("written", 2)
    assert len(sent) >= 4  # two parts of each mode, and the scan's readers
    leaked = [s for args in sent for s in _strings(args) if password in s]
    assert leaked == []
    assert any("***" in s for args in sent for s in _strings(args))  # the server is still named


def _ray_sockets(pid: int, seen: dict[tuple[str, str, int], str]) -> None:
    """Record the LISTEN sockets of ``pid``'s descendants (the Ray processes it started)."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        try:
            name = child.name()
            for c in child.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    seen[name, c.laddr.ip, c.laddr.port] = name
        except psutil.Error:
            continue


def test_a_cluster_the_dump_starts_listens_on_loopback_only_and_its_session_never_holds_the_password(
    pw_dsn: tuple[str, str], tmp_path: Path, short_temp: Path
) -> None:
    dsn, password = pw_dsn
    config = s_config(tmp_path, slow=True)  # ~2 s of parts: time to look at the cluster while it runs
    temp = short_temp
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")}
    env.update(PYTHONPATH=str(ROOT), RAY_TMPDIR=str(temp), HOME=str(tmp_path))  # HOME: Ray's token goes there
    argv = [sys.executable, "-m", "pgprefetch", "dump", "--config", str(config), "--dsn", dsn, "--epoch", "0",
            "--executor", "ray", "--parts", "2", "--quiet"]  # fmt: skip
    seen: dict[tuple[str, str, int], str] = {}
    with subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as dump:
        deadline = time.monotonic() + 120
        while dump.poll() is None and time.monotonic() < deadline:
            _ray_sockets(dump.pid, seen)
            time.sleep(0.1)
        if dump.poll() is None:
            dump.kill()
        out, err = dump.communicate(timeout=30)
    assert dump.returncode == 0, err.decode()
    names = {name for name, _, _ in seen}
    assert {"gcs_server", "raylet"} <= names, seen  # the cluster was seen while it ran
    assert [key for key in seen if key[1] not in LOOPBACK] == []
    assert password.encode() not in out + err
    holding = [p for p in temp.rglob("*") if p.is_file() and not p.is_symlink() and password.encode() in p.read_bytes()]
    assert holding == []


@pytest.fixture
def short_temp() -> Iterator[Path]:
    """A short folder for Ray's session (its unix sockets' paths are capped near 107 bytes); removed after."""
    temp = Path(tempfile.mkdtemp(prefix="pgpf-r-", dir="/tmp"))
    try:
        yield temp
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop_cluster(temp: Path) -> None:
    """Stop only the cluster started under ``temp`` (never `ray stop`: it stops every cluster of the user)."""
    ours = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if str(temp) in " ".join(p.info["cmdline"] or []):
                ours += [p, *p.children(recursive=True)]
        except psutil.Error:
            continue
    for p in ours:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(ours, timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(alive, timeout=10)


def test_a_token_cluster_joined_without_its_token_is_one_line_at_once_and_with_it_dumps(
    s_table: str, tmp_path: Path, short_temp: Path
) -> None:
    temp, port, token = short_temp, _free_port(), secrets.token_hex(16)
    home = tmp_path / "home"  # no ~/.ray/auth_token there: the token is only the cluster's
    home.mkdir()
    # The dumps run as a user's would: without the suite's RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which only
    # `ray start` gets (as docs/many-machines.md says): without it Ray turns 127.0.0.1 into the outward address.
    drop = ("RAY_AUTH", "RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    base = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    base.update(HOME=str(home), PYTHONPATH=str(ROOT))
    ray_bin = Path(sys.executable).with_name("ray")
    start = [str(ray_bin), "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--temp-dir",
             str(temp), "--num-cpus", "1", "--include-dashboard", "false", "--disable-usage-stats"]  # fmt: skip
    try:
        started = subprocess.run(
            start, capture_output=True, text=True, timeout=120,
            env={**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        config = s_config(tmp_path)
        argv = [sys.executable, "-m", "pgprefetch", "dump", "--config", str(config), "--dsn", s_table, "--epoch",
                "0", "--executor", "ray", "--parts", "1", "--quiet"]  # fmt: skip
        joining = {**base, "RAY_ADDRESS": f"127.0.0.1:{port}"}
        refused = subprocess.run(argv, env=joining, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0
        assert refused.stderr.strip().splitlines()[-1] == (
            f"Error: cannot join the Ray cluster at 127.0.0.1:{port}: it wants a token (token authentication) and "
            "got none; set RAY_AUTH_MODE=token and give this process the cluster's token (RAY_AUTH_TOKEN, "
            "RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token; `ray get-auth-token` on its head prints it)"
        )
        assert not list((tmp_path / "store.zarr").glob("epoch-*"))
        with_token = {**joining, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
        ok = subprocess.run(argv, env=with_token, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert ok.returncode == 0, ok.stderr
        assert (tmp_path / "store.zarr" / "epoch-00000" / "zarr.json").is_file()
    finally:
        _stop_cluster(temp)
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(temp) in " ".join(p.info["cmdline"] or [])]
