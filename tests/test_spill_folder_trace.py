"""With ``--scratch S`` a dump beyond memory creates files in ``S`` and in its store, nowhere else (#52).

Each dump runs as its own process under ``strace -f``, the way a user starts it, and every file or folder
it creates (``open`` with ``O_CREAT``, ``mkdir``, ``rename``, ``link``) is resolved to a path (``-y``
prints the folder a descriptor-relative call is made in). Bytecode is not written, so Python's own
``__pycache__`` is not among them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .harness.configs import scan_config
from .harness.db import execute
from .harness.dumps import chunk_bytes, dump, dump_argv
from .harness.mixing import MIX_TABLES, WEB, mix_config
from .harness.packing import docs_table, packed_config
from .harness.spill import TINY_SOURCE, WINDOWS, load_tables, numbers_config

pytestmark = pytest.mark.skipif(shutil.which("strace") is None, reason="traces the dump's system calls: needs strace")

ROWS = {"table": "flat", "key": "id", "fields": {"v": (["v"], "float32"), "w": (["w"], "int64")}}
CREATING = "openat,open,creat,mkdir,mkdirat,rename,renameat,renameat2,link,linkat,symlink,symlinkat"
# openat(3</a/b>, "name", O_RDWR|O_CREAT|O_EXCL, 0600) = 5</a/b/name>; mkdirat(AT_FDCWD</x>, "/a/c", 0700) = 0
_CALL = re.compile(r'^\d+\s+(\w+)\((?:(?:AT_FDCWD|-?\d+)<([^>]*)>, )?"([^"]*)"(.*)\) = (-?\d+)')


def created(trace: Path) -> set[Path]:
    """Every path the traced processes created (or renamed or linked something to)."""
    found: set[Path] = set()
    for line in trace.read_text(errors="replace").splitlines():
        m = _CALL.match(line)
        if m is None or int(m.group(5)) < 0:
            continue
        call, folder, name, rest = m.group(1), m.group(2), m.group(3), m.group(4)
        if call in ("open", "openat", "creat") and "O_CREAT" not in rest and call != "creat":
            continue
        if call.startswith(("rename", "link", "symlink")):  # the new name is the call's last path
            target = re.findall(r'(?:(?:AT_FDCWD|-?\d+)<([^>]*)>, )?"([^"]*)"', rest)
            if not target:
                continue
            folder, name = target[-1]
        path = Path(name) if name.startswith("/") else Path(folder or "/") / name
        found.add(Path(os.path.normpath(path)))
    return found


def traced_dump(argv: list[str], trace: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    command = ["strace", "-f", "-qq", "-y", "-e", f"trace={CREATING}", "-o", str(trace), *argv]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)


def outside(paths: set[Path], *allowed: Path) -> list[Path]:
    """The paths not under any of ``allowed`` (the kernel's own and /dev aside)."""
    return sorted(p for p in paths if not any(p.is_relative_to(a) for a in allowed) and not p.is_relative_to("/dev"))


def _mixed_config(db: str, folder: Path) -> Path:
    """A query source beside a scan source of 250,000 rows, under a budget their share of which it is past."""
    execute(
        db,
        *MIX_TABLES,
        "CREATE TABLE events (id bigint PRIMARY KEY, a float8 NOT NULL, b real NOT NULL, tag int NOT NULL)",
        "INSERT INTO events SELECT i, 3000000 + i, i * 0.125, i % 3 FROM generate_series(1, 250000) i",
    )
    folder.mkdir()
    sources = {"web": {"weight": 1, **WEB}, "events": {"weight": 2, "table": "events", "key": "id"}}
    config = mix_config(folder, sources, size=100, samples=2000, store=str(folder / "store.zarr"))
    config.write_text(config.read_text().replace("[source]\n", '[source]\nmemory = "24MiB"\n', 1))
    return config


def _packed_config(db: str, folder: Path) -> Path:
    """1,500 documents packed under ``[source] memory = "1MiB"``: their lengths and pieces go to the spill folder."""
    execute(db, *docs_table(1500))
    folder.mkdir()
    config = packed_config(folder, store=str(folder / "store.zarr"))
    config.write_text(config.read_text().replace("[source]\n", '[source]\nmemory = "1MiB"\n', 1))
    return config


@pytest.mark.parametrize(
    "kind", ["windows in passes", "rows in stretches", "query keys", "a mixed scan source", "packed documents"]
)
def test_with_scratch_a_dump_beyond_memory_creates_files_only_in_the_scratch_and_the_store(
    db: str, tmp_path: Path, kind: str
) -> None:
    if kind == "query keys":
        config = numbers_config(tmp_path / "c", n=120_000, extra_source=TINY_SOURCE)
        store = tmp_path / "c" / "store.zarr"
    elif kind == "a mixed scan source":
        config = _mixed_config(db, tmp_path / "c")
        store = tmp_path / "c" / "store.zarr"
    elif kind == "packed documents":
        config = _packed_config(db, tmp_path / "c")
        store = tmp_path / "c" / "store.zarr"
    else:
        load_tables(db)
        settings = WINDOWS if kind == "windows in passes" else ROWS
        config = scan_config(tmp_path / "c", **settings, extra=TINY_SOURCE)  # type: ignore[arg-type]
        store = tmp_path / "c" / "store.zarr"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    trace = tmp_path / "trace.txt"
    proc = traced_dump([*dump_argv(config, db), "--scratch", str(scratch), "--json"], trace)
    assert proc.returncode == 0, proc.stdout[-1500:] + proc.stderr[-1500:]
    made = created(trace)
    assert any(p.is_relative_to(scratch) for p in made), "nothing went to the scratch: the dump fitted memory"
    assert outside(made, scratch, store) == []
    assert list(scratch.iterdir()) == []  # and removed when the epoch is written
    clean = dump(config, db, memory="1GiB", store=str(tmp_path / "clean.zarr"))
    assert chunk_bytes(store / "epoch-00000") == chunk_bytes(clean.path)
