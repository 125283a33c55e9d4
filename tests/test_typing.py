"""The public API's types, checked as a user's checker sees them: mypy --strict over a user's scripts.

``typing_user/train_script.py`` uses the API the way a training script does and pins what it gives with
``assert_type``: it must pass. ``typing_user/misuse.py`` makes the mistakes a user makes (a str where an
int goes, a misspelt keyword, a method that does not exist): mypy must reject exactly the lines marked
``# expect: <code>``, so the test proves the annotations are checked, not merely present. One mypy run
checks both, in the project's mypy cache: after ``make lint`` the package comes from it (cold, the run
reads the package and numpy, torch and JAX's stubs: about 30 s).
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import pgprefetch

ROOT = Path(__file__).parents[1]
SCRIPTS = Path(__file__).parent / "typing_user"
LINE = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+): error: (?P<message>.*?)(?:  \[(?P<code>[a-z-]+)\])?$")


def _run_mypy(cache: Path) -> dict[str, list[dict[str, Any]]]:
    """Each script's errors: one ``mypy --strict`` over both, with the project's [tool.mypy] settings."""
    scripts = sorted(SCRIPTS.glob("*.py"))
    command = [
        sys.executable, "-m", "mypy", "--strict", "--config-file", str(ROOT / "pyproject.toml"),
        "--cache-dir", str(cache), "--no-error-summary", "--show-error-codes", "--no-pretty", "--no-color-output",
        *map(str, scripts),
    ]  # fmt: skip
    # MYPYPATH: this tree's pgprefetch, whatever an installed one says.
    env = {**os.environ, "MYPYPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 2: mypy itself failed (a bad flag, a crash)
    errors: dict[str, list[dict[str, Any]]] = {script.name: [] for script in scripts}
    for line in done.stdout.splitlines():
        if m := LINE.match(line):
            errors.setdefault(Path(m["path"]).name, []).append({**m.groupdict(), "line": int(m["line"])})
    return errors


# Both mypy tests on one xdist worker, so that one run serves them (no worker waits on another's run).
pytestmark = pytest.mark.xdist_group("mypy")


@pytest.fixture(scope="session")
def mypy_errors() -> dict[str, list[dict[str, Any]]]:
    """One mypy run for the session; its cache is the project's (``make lint`` warms it: pgprefetch is read once)."""
    return _run_mypy(ROOT / ".mypy_cache")


def test_a_users_training_script_passes_mypy_strict(mypy_errors: dict[str, list[dict[str, Any]]]) -> None:
    assert mypy_errors["train_script.py"] == []


def test_mypy_rejects_each_misuse_of_the_api_and_nothing_else(mypy_errors: dict[str, list[dict[str, Any]]]) -> None:
    source = (SCRIPTS / "misuse.py").read_text().splitlines()
    expected = {(n, m[1]) for n, text in enumerate(source, 1) if (m := re.search(r"# expect: ([a-z-]+)$", text))}
    assert len(expected) >= 10
    found = {(e["line"], e["code"]) for e in mypy_errors["misuse.py"]}
    assert found == expected, mypy_errors["misuse.py"]


def _public_callables() -> list[tuple[str, Callable[..., Any]]]:
    import pgprefetch.grain
    import pgprefetch.jax

    found = []
    for module in (pgprefetch, pgprefetch.jax, pgprefetch.grain):
        for name in module.__all__:
            value = getattr(module, name)
            if not callable(value):
                continue
            found.append((f"{module.__name__}.{name}", value))
            if inspect.isclass(value) and not issubclass(value, BaseException):
                for attr in dir(value):  # its own and inherited methods, pgprefetch's (not torch's Dataset's)
                    member = getattr(value, attr)
                    function = getattr(member, "__func__", member)
                    if not attr.startswith("_") and callable(member) and function.__module__.startswith("pgprefetch"):
                        found.append((f"{module.__name__}.{name}.{attr}", member))
    return found


def test_the_public_callables_show_their_real_parameters() -> None:
    """``help()`` and IDEs show each parameter: no ``*args`` or ``**kwargs`` passed through to something else."""
    callables = _public_callables()
    names = {name for name, _ in callables}
    assert {"pgprefetch.dump", "pgprefetch.build_config", "pgprefetch.EpochDataset.from_config"} <= names
    assert {"pgprefetch.jax.device_batches", "pgprefetch.grain.EpochSource", "pgprefetch.ConfigError"} <= names
    for name, value in callables:
        parameters = inspect.signature(value).parameters.values()
        loose = [p.name for p in parameters if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        assert not loose, f"{name}{inspect.signature(value)}"
        hints = [p.name for p in parameters if p.name not in ("self", "cls") and p.annotation is p.empty]
        assert not hints, f"{name}: parameters without a type: {hints}"


def test_the_errors_take_their_message() -> None:
    for name in pgprefetch.__all__:
        value = getattr(pgprefetch, name)
        if inspect.isclass(value) and issubclass(value, BaseException):
            assert "message" in inspect.signature(value).parameters, name
