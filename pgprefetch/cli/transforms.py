"""The commands of ``[transforms]``: ``transform`` (one sample, rerun where a dump stopped) and ``cache``.

Each is a few lines over :mod:`pgprefetch.write.transform`: ``transform`` prints the sample's outputs, or the
function's own traceback and the one-line error; ``cache`` counts the outputs a store's cache holds, per
transform and version of its code, and ``--clear`` removes them (all, or ``--transform``'s).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from pgprefetch.cli.console import json_option
from pgprefetch.cli.options import config_option, dsn_option, split_option
from pgprefetch.config.values import show_size


@click.command("transform")
@config_option
@split_option
@dsn_option
@click.option("--transform", "name", required=True, metavar="NAME", help="The [transforms.NAME] to run.")
@click.option("--key", required=True, help="The sample's key as an error names it: id=4 (a=1, b=2 for several).")
@click.option("--epoch", type=click.IntRange(min=0), default=0, show_default=True, help="A random transform's epoch.")
@click.option("--source", metavar="NAME", help="A mixed config's source the sample is of ([samples.NAME]).")
def transform(
    config_path: Path, split: str | None, dsn: str | None, name: str, key: str, epoch: int, source: str | None
) -> None:
    """Run one transform on one sample in this process and print its outputs (or its traceback): a dump's rerun."""
    from pgprefetch.config.load import load_config
    from pgprefetch.errors import TransformError
    from pgprefetch.write.transform.rerun import rerun

    cfg = load_config(config_path, dsn=dsn, split=split)
    try:
        outputs = asyncio.run(rerun(cfg, name, key, epoch, source))
    except TransformError as e:
        if e.traceback:
            click.echo(e.traceback.rstrip(), err=True)
        raise
    for field, packed in outputs.items():
        click.echo(f"{field}: {packed.values.dtype} {json.dumps(packed.values.tolist())}")


@click.command("cache")
@config_option
@split_option
@click.option("--clear", is_flag=True, help="Remove the cached outputs (of --transform only, if given).")
@click.option("--transform", "names", multiple=True, metavar="NAME", help="With --clear: only this transform's.")
@json_option('Print {"path", "transforms": [...]} (or {"removed": N or "all"} with --clear).')
def cache(config_path: Path, split: str | None, clear: bool, names: tuple[str, ...], as_json: bool) -> None:
    """Count the outputs a store's transform cache holds (where it is, per transform), or remove them."""
    from pgprefetch.config.load import load_config
    from pgprefetch.store.open import config_store
    from pgprefetch.write.transform.cache import FILE, TransformCache, remove_cache, transforms_folder

    cfg = load_config(config_path, split=split)
    folder = transforms_folder(cfg, config_store(cfg))
    if clear and not names:  # the whole file: whatever it holds, a file of an older layout too
        removed = remove_cache(folder)
        said = {"removed": "all" if removed else 0}
        click.echo(json.dumps(said) if as_json else f"removed {folder / FILE}" if removed else f"no cache at {folder}")
        return
    if not (folder / FILE).exists():
        click.echo(json.dumps({"path": str(folder / FILE), "transforms": []}) if as_json else f"no cache at {folder}")
        return
    with TransformCache.open(folder, create=False) as opened:
        if clear:
            count = opened.clear(names)
            click.echo(json.dumps({"removed": count}) if as_json else f"removed {count:,} outputs from {opened.path}")
            return
        counts = opened.counts()
    if as_json:
        click.echo(json.dumps({"path": str(opened.path), "transforms": [c.to_json() for c in counts]}))
        return
    click.echo(f"{opened.path}:")
    for c in counts:
        click.echo(f"  {c.name} (code {c.fingerprint[:12]}): {c.entries:,} outputs, {show_size(c.nbytes)}")
