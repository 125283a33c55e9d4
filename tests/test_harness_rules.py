"""The harness rule: no test file imports a test module (``test_*``) or ``conftest``; shared set-up is the harness's.

A helper defined in one test module and imported by another ties the two together: moving or renaming a
test breaks an unrelated file, and running one file imports the other's tests. What several files share
lives in tests/harness (or tests/soak, a tool); conftest.py holds fixtures, which pytest hands out itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _forbidden(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def imports_of_tests(source: str, name: str) -> list[str]:
    """``name:line: imports module`` for each import in ``source`` of a ``test_*`` module or of conftest."""
    found = []
    for node in ast.walk(ast.parse(source, filename=name)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            # ``from . import test_x`` names the module in the imported names; ``from .test_x import y`` in base
            names = [base] if base else [alias.name for alias in node.names]
        else:
            continue
        found += [f"{name}:{node.lineno}: imports {n}" for n in names if _forbidden(n)]
    return found


def test_no_test_file_imports_a_test_module_or_conftest() -> None:
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 50  # the walk sees the suite
    found = [line for p in files for line in imports_of_tests(p.read_text(), str(p.relative_to(TESTS.parent)))]
    assert found == [], "import these from tests/harness instead:\n" + "\n".join(found)


def test_the_rule_catches_each_form_of_such_an_import() -> None:
    source = (
        "import tests.test_x\n"
        "from .test_y import a\n"
        "from . import test_z, harness\n"
        "from tests.conftest import fetch\n"
        "def f():\n    from ..conftest import fetch\n"
        "from .harness.db import execute\n"
        "import tests.harness.s3\n"
        "from .soak import deploy\n"
    )
    assert imports_of_tests(source, "t.py") == [
        "t.py:1: imports tests.test_x",
        "t.py:2: imports test_y",
        "t.py:3: imports test_z",
        "t.py:4: imports tests.conftest",
        "t.py:6: imports conftest",
    ]
