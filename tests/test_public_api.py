"""The public surface: a sorted, complete __all__, a torch-free dump path, every command documented."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pgprefetch
from pgprefetch.cli import cli

ROOT = Path(__file__).parents[1]


def test_all_is_sorted_and_every_name_exists() -> None:
    assert pgprefetch.__all__ == sorted(pgprefetch.__all__)
    for name in pgprefetch.__all__:
        assert getattr(pgprefetch, name) is not None


def test_the_dump_path_does_not_import_torch() -> None:
    code = "import sys, pgprefetch.cli, pgprefetch.write.pipeline; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_the_dump_path_of_a_local_store_does_not_load_the_s3_client() -> None:
    """obstore's native module is 5 MiB of the dump's floor: only an S3 store's dump pays for it."""
    code = (
        "import sys, pgprefetch.cli.dump, pgprefetch.write.pipeline, pgprefetch.write.sources, pgprefetch.write.cron\n"
        "print('obstore' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_python_dash_m_runs_the_cli() -> None:
    result = subprocess.run([sys.executable, "-m", "pgprefetch", "--version"], capture_output=True, text=True)
    assert result.returncode == 0
    assert result.stdout == f"pgprefetch, version {pgprefetch.__version__}\n"


def test_every_command_is_in_the_cli_reference() -> None:
    reference = (ROOT / "docs" / "cli.md").read_text()
    for name in cli.commands:
        assert f"pgprefetch {name}" in reference, name


def test_the_reader_without_torch_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"  # as if torch were not installed
        "import pgprefetch\n"
        "try:\n    pgprefetch.EpochDataset\nexcept ImportError as e:\n    print(e)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == "pgprefetch.EpochDataset needs torch: pip install 'pgprefetch[torch]'\n"


def test_the_package_is_typed() -> None:
    assert (ROOT / "pgprefetch" / "py.typed").exists()


def test_the_command_line_starts_without_zarr_numpy_or_asyncpg() -> None:
    code = (
        "import sys\n"
        "from pgprefetch.cli import cli\n"
        "try:\n    cli(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'zarr', 'numpy', 'asyncpg', 'tqdm'}))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.splitlines()[-1] == "[]"  # each command imports the library when it runs


def test_the_command_line_s_defaults_are_the_library_s() -> None:
    from pgprefetch.cli import commands, dump, options
    from pgprefetch.demo.server import DEFAULT_DIR
    from pgprefetch.write.check import SAMPLE_BATCHES
    from pgprefetch.write.pipeline import RETRIES

    assert (commands.SAMPLE_BATCHES, dump.RETRIES, options.DEFAULT_DIR) == (SAMPLE_BATCHES, RETRIES, DEFAULT_DIR)
