"""The ``pgprefetch`` command line: each command parses options, loads the config and calls the library.

Errors are translated in one place, :class:`pgprefetch.cli.console.Group`: a
:class:`~pgprefetch.errors.PgprefetchError` becomes ``Error: <one line>`` with its exit code (2 for config
and usage errors, 1 otherwise), or a JSON object after ``--json``; anything unexpected becomes one line too,
unless ``--debug`` asks for the traceback.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pgprefetch._version import __version__
from pgprefetch.cli.console import Group, fail, json_option, tune_for_dumping
from pgprefetch.cli.dump import dump
from pgprefetch.cli.options import (
    config_option,
    dir_option,
    dsn_option,
    scale_option,
    split_option,
    with_memory_options,
    with_store_options,
)
from pgprefetch.cli.progress import BarProgress
from pgprefetch.cli.splits import Shown, per_split
from pgprefetch.cli.transforms import cache, transform
from pgprefetch.cli.words import consumer_lines, summary
from pgprefetch.config.values import parse_duration, show_size
from pgprefetch.errors import StoreError

if TYPE_CHECKING:
    from pgprefetch.store.base import Store

# Each command imports the library it calls when it runs: `pgprefetch --version` and `--help` load neither
# zarr, numpy nor asyncpg (tests/test_public_api.py). pgprefetch.write.check.SAMPLE_BATCHES, checked there:
SAMPLE_BATCHES = 8

DEMO_CONFIGS = ("configs/demo.toml", "configs/demo-rows.toml", "configs/demo-scan.toml")


def loaded(counts: dict[str, int]) -> str:
    """What loading the demo datasets says it loaded."""
    return f"loaded sequences ({counts['sequences']:,} train windows) and rows ({counts['rows']:,} train rows)"


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pgprefetch")
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
def cli(debug: bool) -> None:
    """Pre-generate shuffled, snapshot-consistent training epochs from PostgreSQL into Zarr."""


cli.add_command(dump)  # the longest command, in a module of its own (pgprefetch.cli.dump)
cli.add_command(transform)  # the commands of [transforms] (pgprefetch.cli.transforms)
cli.add_command(cache)


@cli.command("ls")
@with_store_options
@json_option('Print {"epochs": [...]} instead of a table.')
def ls(config_path: Path | None, store: str | None, split: str | None, as_json: bool) -> None:
    """List the epochs of a store (of each of its splits): state, batches, samples, size, created, seconds."""
    per_split(config_path, store, split, as_json, _listed)


def _listed(target: Store) -> Shown:
    from pgprefetch.store.maintenance import consumer_infos, list_epochs

    infos = list_epochs(target)
    readers = consumer_infos(target)
    now = datetime.now(UTC)
    lines = [
        f"{'epoch':>5}  {'state':<8} {'batches':>9} {'samples':>11} {'on disk':>10}  {'created':<25} {'seconds':>8}"
    ]
    for i in infos:
        batches = f"{i.batches_written}/{i.n_batches}" if i.state == "partial" else f"{i.n_batches}"
        seconds = f"{i.seconds:.1f}" if i.seconds is not None else "-"
        lines.append(
            f"{i.epoch:>5}  {i.state:<8} {batches:>9} {i.n_samples or 0:>11,} {show_size(i.bytes):>10}"
            f"  {i.created or '-':<25} {seconds:>8}"
            + ("  " + ", ".join(f"{name} {n:,}" for name, n in i.sources.items()) if i.sources else "")
            + (f"  left out {i.left_out:,}" if i.left_out else "")
        )
    if readers:
        lines += consumer_lines(readers, now)
    shown: dict[str, Any] = {"epochs": [i.to_json() for i in infos], "consumers": [r.to_json(now) for r in readers]}
    try:
        cached = _transform_cache(target)
    except StoreError as e:  # the epochs are listed all the same
        lines.append(f"transform cache: {e}")
        cached = None
    if cached is not None:
        path, counts = cached
        lines.append(f"transform cache {path}:")
        lines += [
            f"  {c.name} (code {c.fingerprint[:12]}): {c.entries:,} outputs, {show_size(c.nbytes)}" for c in counts
        ]
        shown["transform_cache"] = {"path": str(path), "transforms": [c.to_json() for c in counts]}
    return Shown(shown, lines)


def _transform_cache(target: Store) -> tuple[Path, list[Any]] | None:
    """The transform cache of a local store (its root's, for a split) and its counts; None where it has none."""
    from pgprefetch.write.transform.cache import stored_counts

    root = (target.parent or target).local_root
    return stored_counts(root) if root is not None else None


@cli.command()
@with_store_options
@click.option("--epoch", type=int, required=True, help="The epoch to check.")
@json_option('Print {"epoch", "problems": [...], "ok"}.')
def verify(config_path: Path | None, store: str | None, split: str | None, epoch: int, as_json: bool) -> None:
    """Recompute every chunk's checksum; name each corrupt or missing chunk (exit 1 if any)."""
    from pgprefetch.store.maintenance import verify_epoch
    from pgprefetch.store.splits import served_epoch

    def one(target: Store) -> Shown:
        served = served_epoch(target, epoch)  # an evaluation split's one epoch
        problems = verify_epoch(target, served)
        said = {"epoch": served, "problems": problems, "ok": not problems}
        if problems:
            return Shown(said, problems, f"epoch {served}: {len(problems)} corrupt or missing chunk(s)")
        return Shown(said, [f"epoch {served}: every chunk matches its checksum"])

    per_split(config_path, store, split, as_json, one)


@cli.command()
@with_store_options
@click.option("--epoch", type=int, required=True, help="The epoch whose statistics to print.")
@json_option('Print {"epoch", "stats": {field: {column: {count, mean, std, min, max}}}}.')
def stats(config_path: Path | None, store: str | None, split: str | None, epoch: int, as_json: bool) -> None:
    """Per field and column: count, mean, std, min and max over an epoch's real values (padding excluded).

    std is the population standard deviation (NumPy's default, ddof=0); pandas' .std() and R's sd() give
    the sample one (ddof=1), larger by sqrt(count / (count - 1)).
    """
    per_split(config_path, store, split, as_json, lambda target: _stats(target, epoch))


def _stats(target: Store, epoch: int) -> Shown:
    from pgprefetch.store.splits import served_epoch

    epoch = served_epoch(target, epoch)  # an evaluation split's one epoch
    manifest = target.manifest(epoch)
    figures = manifest.get("stats")
    if figures is None:
        failure = f"epoch {epoch} has no statistics: a pgprefetch that did not compute them wrote it"
        return Shown({"epoch": epoch, "stats": None}, [], failure)
    lines = [f"{'field':<16} {'column':<16} {'count':>12} {'mean':>14} {'std':>14} {'min':>14} {'max':>14}"]
    for field, columns in figures.items():
        for column, s in columns.items():
            cells = (f"{s[k]:>14.6g}" if s[k] is not None else f"{'-':>14}" for k in ("mean", "std", "min", "max"))
            lines.append(f"{field:<16} {column:<16} {s['count']:>12,} {' '.join(cells)}")
    left = [f"{name} ({_why_no_stats(entry)})" for name, entry in manifest["fields"].items() if name not in figures]
    if left:
        lines.append(f"not summarised: {', '.join(left)}")
    return Shown({"epoch": epoch, "stats": figures}, lines)


def _why_no_stats(entry: dict[str, Any]) -> str:
    """Why ``stats`` has no figures for a field of the manifest."""
    if "categories" in entry:
        return "category codes: count them with np.bincount"
    return "bytes of text or bytea" if entry["dtype"] == "uint8" and "lengths" in entry else "not a number"


@cli.command("prune")
@with_store_options
@click.option(
    "--keep",
    type=click.IntRange(min=0),
    required=True,
    help="Keep epochs from (the slowest consumer's epoch - N) on; every recorded run counts.",
)
@click.option(
    "--consumer",
    help="Checked as a run's name only: prune keeps what every recorded run may read (see `pgprefetch forget`).",
)
@click.option(
    "--partials", is_flag=True, help="Also delete partial epochs no dump is writing (a rerun would resume them)."
)
@click.option(
    "--partials-older-than",
    "partials_age",
    metavar="DURATION",
    help='Also delete partial epochs last written longer ago than this, e.g. "7d" or "12h".',
)
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; delete nothing.")
@click.option("--quiet", "-q", is_flag=True, help="Print nothing unless something fails (for cron).")
@json_option("Print one JSON object.")
def prune_command(
    config_path: Path | None,
    store: str | None,
    split: str | None,
    keep: int,
    consumer: str | None,
    partials: bool,
    partials_age: str | None,
    dry_run: bool,
    quiet: bool,
    as_json: bool,
) -> None:
    """Delete complete epochs more than N behind the consumers; partial epochs only when told."""
    age = parse_duration(partials_age, "--partials-older-than") / 1000 if partials_age is not None else None
    from pgprefetch.store.maintenance import prune

    def one(target: Store) -> Shown:
        result = prune(target, keep, consumer, partials=partials, partials_older_than=age, dry_run=dry_run)
        return Shown(result.to_json(), [] if quiet else result.lines(keep) or ["nothing to delete"])

    per_split(config_path, store, split, as_json, one)


@cli.command("forget")
@with_store_options
@click.argument("consumer")
@json_option('Print {"forgotten": [...]}: the records removed.')
def forget(config_path: Path | None, store: str | None, split: str | None, consumer: str, as_json: bool) -> None:
    """Remove a training run's consumer records (every rank), so that --keep and prune stop keeping its epochs.

    Only for a run gone for good: until then its records keep every epoch it may still read, whatever other
    runs' cron lines say. `pgprefetch ls` shows each run's records, stale ones (not updated for 7 days) marked.
    """
    from pgprefetch.store.maintenance import forget_consumer

    def one(target: Store) -> Shown:
        removed = forget_consumer(target, consumer)
        records = f"{len(removed)} record{'s' if len(removed) != 1 else ''}"
        return Shown({"forgotten": removed}, [f"forgot consumer {consumer} ({records})"])

    per_split(config_path, store, split, as_json, one)


@cli.command()
@config_option
@split_option
@dsn_option
@with_memory_options
@click.option("--epoch", type=click.IntRange(min=0), default=0, show_default=True, help="The epoch to plan.")
@click.option(
    "--batches", type=click.IntRange(min=1), default=SAMPLE_BATCHES, show_default=True, help="Batches to decode."
)
@click.option("--verbose", is_flag=True, help="Also list each checked batch's problems, one line each.")
@json_option("Print one JSON object.")
def check(
    config_path: Path,
    split: str | None,
    dsn: str | None,
    memory: str | None,
    scratch: str | None,
    epoch: int,
    batches: int,
    verbose: bool,
    as_json: bool,
) -> None:
    """Run everything a dump would decide against the database, on a sample of batches; write nothing.

    Exits 0 when a dump of this config would go through, 1 with the errors otherwise. It predicts the
    dump's peak memory and time under the dump's --memory and --scratch. A config with [splits] is checked
    split by split (--split: the one named).
    """
    from pgprefetch.config.load import load_config
    from pgprefetch.write.check import check_config

    cfg = load_config(config_path, dsn=dsn, memory=memory, scratch=scratch, split=split)
    names = [split] if split is not None or cfg.splits is None else list(cfg.splits.names)
    reports = {}
    for name in names:
        one = cfg if name == split else load_config(config_path, dsn=dsn, memory=memory, scratch=scratch, split=name)
        reports[name] = report = asyncio.run(check_config(one, epoch, batches))
        if not as_json:
            click.echo((f"split {name}:\n" if len(names) > 1 else "") + "\n".join(report.lines(verbose)))
    if as_json:
        said = {n: r.to_json() for n, r in reports.items()}
        click.echo(json.dumps({"splits": said} if len(names) > 1 else next(iter(said.values()))))
    errors = sum(len(r.errors) for r in reports.values())
    if errors:
        raise fail(f"{config_path}: {errors} problem(s) found", 1)


@cli.command("demo-data")
@dsn_option
@scale_option
@click.option(
    "--replace",
    is_flag=True,
    help="Also drop tables named like the demo's (items, ticks, ...) that demo-data did not make.",
)
def demo_data(dsn: str | None, scale: float, replace: bool) -> None:
    """Load the two deterministic demo datasets (sequences and rows) into a database.

    It (re)creates ticks, train_samples, test_samples, items, train_items and test_items, and refuses to drop
    a table of those names that it did not make itself unless --replace is given.
    """
    from pgprefetch.demo.data import load_demo_data

    # As for every other command: --dsn, then PGPREFETCH_DSN, then the PG* variables.
    counts = asyncio.run(load_demo_data(dsn or os.environ.get("PGPREFETCH_DSN"), scale, replace=replace))
    click.echo(loaded(counts))


@cli.command()
@dir_option
def server(folder: Path) -> None:
    """Run the embedded PostgreSQL and print its DSN until Ctrl-C or SIGTERM (both stop it)."""
    from pgprefetch.demo.server import run_server

    run_server(folder, click.echo)


@cli.command()
@dir_option
@scale_option
@click.option(
    "--config",
    "configs",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEMO_CONFIGS,
    show_default=True,
    help="Configs to dump epoch 0 of.",
)
def demo(folder: Path, scale: float, configs: tuple[Path, ...]) -> None:
    """Start the embedded PostgreSQL, load the demo data and dump epoch 0 of each demo config."""
    from pgprefetch.config.load import load_config
    from pgprefetch.demo.data import load_demo_data
    from pgprefetch.demo.server import embedded_server
    from pgprefetch.write.pipeline import dump_epochs

    with embedded_server(folder, note=lambda line: click.echo(line, err=True)) as dsn:
        click.echo(f"embedded PostgreSQL at {dsn}")
        counts = asyncio.run(load_demo_data(dsn, scale, replace=True))  # its own server's database
        click.echo(loaded(counts))
        for path in configs:
            cfg = load_config(path, dsn=dsn)
            progress = BarProgress(enabled=sys.stderr.isatty())
            # parents: the demo configs' stores go to prefetch/, which a fresh clone does not have yet.
            (result,) = asyncio.run(dump_epochs(cfg, [0], force=True, progress=progress, parents=True))
            click.echo(f"{path}: {summary(result)}")
            click.echo(json.dumps(result.to_json()))


def main() -> None:
    """Console-script entry point."""
    tune_for_dumping()  # what the dump needs; the other commands do not mind
    cli(prog_name="pgprefetch")
