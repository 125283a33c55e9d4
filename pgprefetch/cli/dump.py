"""``pgprefetch dump``: epochs of a config into its store, once, a range, or ``--ahead`` from cron.

The longest command: its options are the dump's knobs (memory, scratch, retries, the executor) and how it
reports (a bar on a terminal, log lines under cron, JSON). Which epochs a run writes and what ``--keep``
deletes after is the library's (:class:`pgprefetch.write.cron.Schedule`, which :func:`pgprefetch.dump` uses
too); the command loads the config once and calls :func:`pgprefetch.write.pipeline.dump_epoch` per epoch.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pgprefetch.cli.console import json_option, log_to_stderr, run, stop_on_sigterm
from pgprefetch.cli.options import config_option, dsn_option, split_option, with_memory_options
from pgprefetch.cli.progress import BarProgress, LogProgress
from pgprefetch.cli.words import parse_epochs, summary
from pgprefetch.errors import ConfigError

if TYPE_CHECKING:
    from pgprefetch.config.model import Config
    from pgprefetch.write.batches import Progress

# pgprefetch.write.pipeline.RETRIES, which tests/test_public_api.py checks it equals: the pipeline is
# imported when a dump runs, not for `pgprefetch --help` (it loads zarr, numpy and asyncpg).
RETRIES = 5


@click.command()
@config_option
@click.option("--epoch", type=int, help="The epoch to dump.")
@click.option("--epochs", "epoch_range", help="Several epochs: 3-5, or 1,4-6.")
@click.option("--ahead", type=click.IntRange(min=1), help="Dump the next K epochs after the newest started one.")
@click.option(
    "--keep",
    type=click.IntRange(min=0),
    help="Then delete complete epochs more than N behind the slowest consumer (every recorded run counts).",
)
@click.option(
    "--consumer",
    help="Dump --ahead of this training run's epoch (default: the furthest run); --keep still keeps what every "
    "run may read. A name no run has recorded, while others have, is refused as a typo.",
)
@click.option(
    "--new",
    "new_consumer",
    is_flag=True,
    help="--consumer names a training run that has not opened an epoch yet: register it (it starts at epoch 0).",
)
@click.option(
    "--store",
    metavar="FOLDER|s3://BUCKET/PREFIX",
    help="The store, relative to the working folder; overrides [store] path (relative to the config file).",
)
@click.option(
    "--parents",
    is_flag=True,
    help="Create the store's missing parent folders too (otherwise only the store's own folder is created).",
)
@split_option
@dsn_option
@click.option("--connections", type=click.IntRange(min=1), help="Batches in flight; overrides [source].")
@with_memory_options
@click.option(
    "--force", is_flag=True, help="Rewrite complete epochs, start partial ones over, write into another config's store."
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=RETRIES,
    show_default=True,
    help="Lost connections to survive per epoch.",
)
@click.option(
    "--executor",
    type=click.Choice(["process", "ray"]),
    default="process",
    show_default=True,
    help="Who writes the batches: this process, or a Ray cluster's workers under one snapshot (RAY_ADDRESS, "
    "or a cluster started here; pip install 'pgprefetch[ray]').",
)
@click.option(
    "--parts", type=click.IntRange(min=1), help="--executor ray: the epoch's parts (default: the cluster's CPUs)."
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar, no log lines and no summary; errors only.")
@json_option("Print one JSON summary object per epoch.")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log lines on stderr (progress when stderr is not a terminal, retries, resumes): text or JSON.",
)
@click.option(
    "--log-every",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="Progress log interval when stderr is not a terminal.",
)
def dump(
    config_path: Path,
    epoch: int | None,
    epoch_range: str | None,
    ahead: int | None,
    keep: int | None,
    consumer: str | None,
    new_consumer: bool,
    store: str | None,
    parents: bool,
    split: str | None,
    dsn: str | None,
    connections: int | None,
    memory: str | None,
    scratch: str | None,
    force: bool,
    retries: int,
    executor: str,
    parts: int | None,
    quiet: bool,
    as_json: bool,
    log_format: str,
    log_every: float,
) -> None:
    """Dump epochs of a config into its Zarr store.

    \b
    Examples:
        pgprefetch dump --config configs/demo.toml --epoch 3
        pgprefetch dump --config configs/demo.toml --ahead 2 --keep 1 --quiet   # from cron
        pgprefetch dump --config configs/demo.toml --ahead 2 --consumer run2 --new   # before run2 reads
        pgprefetch dump --config configs/demo.toml --epoch 3 --executor ray --parts 8
        pgprefetch dump --config configs/splits.toml --split train --epoch 3
    """
    if parts is not None and executor != "ray":
        raise ConfigError("--parts needs --executor ray")
    from pgprefetch.write.cron import Schedule

    given = _given(epoch, epoch_range)
    schedule = Schedule(given, ahead, keep, consumer, new_consumer, force)  # every flag checked here, at once
    from pgprefetch.config.load import load_config
    from pgprefetch.store.open import config_store
    from pgprefetch.write.memory import heap

    cfg = load_config(
        config_path, dsn=dsn, connections=connections, store=store, memory=memory, scratch=scratch, split=split
    )
    heap.fit(cfg.source.memory_bytes)  # the heap's kept memory is the budget's too (pgprefetch.write.memory.policy)
    target = config_store(cfg)
    due = schedule.due(cfg, target)  # everything that can refuse the run, before an epoch is dumped
    log_to_stderr(quiet, log_format)
    stop_on_sigterm()
    shown = not (quiet or as_json)
    progress: Progress = BarProgress(enabled=shown) if sys.stderr.isatty() else LogProgress(interval=log_every)
    with _executor(executor, parts) as spread:
        _dump_each(cfg, due.epochs, progress, spread, force=force, retries=retries, parents=parents, as_json=as_json,
                   quiet=quiet)  # fmt: skip
    if due.window is not None and not due.epochs and not quiet:
        ready = list(due.window)
        said = {"status": "nothing to do", "ready": ready}
        click.echo(json.dumps(said) if as_json else f"nothing to do: epochs {', '.join(map(str, ready))} ready")
    pruned = schedule.tidy(target)
    if pruned is not None and (pruned.epochs or pruned.damaged) and shown:
        click.echo(pruned.lines(keep or 0)[0])  # the same words as `prune`; partial epochs are left alone


def _given(epoch: int | None, epoch_range: str | None) -> tuple[int, ...] | None:
    """The epochs ``--epoch`` or ``--epochs`` name (None: neither; both: refused)."""
    if epoch is not None and epoch_range is not None:
        raise ConfigError("give one of --epoch N, --epochs A-B or --ahead K")
    if epoch is not None:
        return (epoch,)
    return None if epoch_range is None else tuple(parse_epochs(epoch_range))


def _dump_each(cfg: Config, epochs: list[int], progress: Progress, spread: Any, *, force: bool, retries: int,
               parents: bool, as_json: bool, quiet: bool) -> None:  # fmt: skip
    """Dump ``epochs`` in turn, each summary printed as soon as its epoch is done (a later failure loses none)."""
    from pgprefetch.write.pipeline import dump_epoch
    from pgprefetch.write.sources import ReadCache

    cache = ReadCache()  # scan mode: the epochs of one run are cut from one read of the table
    for e in epochs:
        dumping = dump_epoch(
            cfg, e, force=force, progress=progress, retries=retries, cache=cache, executor=spread, parents=parents
        )
        result = run(dumping)
        if as_json:
            click.echo(json.dumps(result.to_json()))
        elif not quiet:
            click.echo(summary(result))


def _executor(name: str, parts: int | None) -> Any:
    """The executor --executor names, as a context (None: this process); Ray is imported only for ``ray``."""
    if name != "ray":
        return contextlib.nullcontext(None)
    from pgprefetch.write.ray import ray_executor

    return ray_executor(parts)
