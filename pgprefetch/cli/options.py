"""The options several commands share: the config, the DSN, the demo's folder and scale, the store, memory.

Declared once, so ``--config`` or ``--store`` means the same in every command that takes it, and a store is
opened from them in one way (:func:`named_store`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from pgprefetch.errors import ConfigError

# pgprefetch.demo.server.DEFAULT_DIR, checked in tests/test_public_api.py: importing the server here would load
# the store (and numpy) for every command's --help.
DEFAULT_DIR = Path(".pgprefetch")

if TYPE_CHECKING:
    from pgprefetch.store.base import Store

config_option = click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The TOML config file.",
)
dsn_option = click.option(
    "--dsn", help="PostgreSQL URI; wins over PGPREFETCH_DSN and [source] dsn.", envvar=None, default=None
)
split_option = click.option(
    "--split",
    metavar="NAME",
    help="The split: one of the config's [splits] (train, val, ...); required where it has them.",
)
dir_option = click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DIR,
    show_default=True,
    help="Where the embedded server keeps its data.",
)
scale_option = click.option(
    "--scale",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    help="Size of the demo datasets: 1 = 38,560 windows and 90,000 rows of training samples.",
)

# The dump's memory, which `check` takes too: the same budget in both, so that what check predicts under it
# is what the dump then does under it (pgprefetch.write.check).
memory_options = [
    click.option(
        "--memory",
        metavar="SIZE",
        help="The dump's memory, e.g. \"2GiB\": its peak stays within the interpreter's floor + SIZE + 32 MiB (keys "
        "beyond it are ordered on disk, a table beyond it read in passes); overrides [source].",
    ),
    click.option(
        "--scratch",
        metavar="FOLDER",
        type=click.Path(file_okay=False),
        help="Where every file beyond --memory goes (keys, a scan's rows; default: beside the store's partial "
        "epoch; check's, a temporary folder); overrides [source].",
    ),
]


def named_store(config_path: Path | None, store: str | None, split: str | None = None) -> Store:
    """The store named by --store, or by the config's [store] path (``split``: its split's); it must exist."""
    from pgprefetch.config.load import load_config  # here, not at start-up: the store loads zarr
    from pgprefetch.store.open import open_store

    if store is not None:
        return open_store(store, split).require()
    if config_path is None:
        raise ConfigError("give --config or --store")
    return open_store(load_config(config_path).store.path, split).require()


store_options = [
    click.option(
        "--config",
        "config_path",
        type=click.Path(dir_okay=False, path_type=Path),
        help="The config whose [store] path to use.",
    ),
    click.option("--store", metavar="FOLDER|s3://BUCKET/PREFIX", help="The store: a folder or an S3 URL."),
    click.option("--split", metavar="NAME", help="One split of a store with [splits] (default: every split)."),
]


F = TypeVar("F", bound=Callable[..., Any])


def with_store_options(f: F) -> F:
    """Add --config and --store to a command."""
    for option in reversed(store_options):
        f = option(f)
    return f


def with_memory_options(f: F) -> F:
    """Add --memory and --scratch to a command (``dump``, and ``check``, which predicts the dump under them)."""
    for option in reversed(memory_options):
        f = option(f)
    return f
