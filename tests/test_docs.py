"""The README's complete example runs as written, and the documentation site builds without a broken link.

The example's files (``configs/penguins.sql``, ``penguins.toml``, ``co2.toml``, ``co2_query.toml``: the
same windows in query mode, keyed by a date) are shown in the README
verbatim: the test checks that the README and the files say the same, then loads the SQL into a fresh
database, runs the commands as a user types them and the Python block as a script.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from .harness.db import execute
from .harness.dumps import chunk_bytes

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def blocks() -> dict[str, str]:
    """The README's example blocks, by the name in the comment above each: ``<!-- example: NAME -->``."""
    found = re.findall(r"<!-- example: (\S+) -->\n```\w*\n(.*?)```", README.read_text(), flags=re.S)
    return {name: body for name, body in found}


def test_the_readme_shows_the_example_files_as_they_are() -> None:
    shown = blocks()
    for name in ("configs/penguins.sql", "configs/penguins.toml", "configs/co2.toml", "configs/co2_query.toml"):
        assert shown[name] == (ROOT / name).read_text(), f"README.md and {name} differ"


def test_the_readme_example_runs_as_written(db: str, tmp_path: Path) -> None:
    shown = blocks()
    execute(db, shown["configs/penguins.sql"])
    (tmp_path / "configs").mkdir()
    for name in ("configs/penguins.toml", "configs/co2.toml", "configs/co2_query.toml"):
        (tmp_path / name).write_text(shown[name])
    for line in shown["commands"].splitlines():
        argv = line.split()
        assert argv[0] == "pgprefetch"
        argv = [a if a != "postgresql://me@db/prod" else db for a in argv[1:]]
        done = subprocess.run([sys.executable, "-m", "pgprefetch", *argv], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        assert "warning" not in done.stdout, done.stdout  # the tables have the indexes their queries need
    (tmp_path / "read.py").write_text(shown["read.py"])
    done = subprocess.run([sys.executable, "read.py"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "10 {'island': ['Biscoe', 'Dream', 'Torgersen'], 'sex': ['female', 'male']}"
    scan, query = (chunk_bytes(tmp_path / "prefetch" / s / "epoch-00000") for s in ("co2.zarr", "co2-query.zarr"))
    assert scan == query  # the date-keyed query-mode twin gives the scan's epoch, byte for byte


def test_the_documentation_site_builds_without_a_broken_link(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    done = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "config" / "index.html").exists()


def test_the_readme_links_only_to_pages_that_exist() -> None:
    text = README.read_text()
    for target in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / target).exists(), target
