"""The store commands over a store's splits: one split when ``--split`` names it, every split otherwise.

A store with ``[splits]`` holds a store per split (:mod:`pgprefetch.store.splits`). ``ls``, ``verify``,
``stats``, ``prune`` and ``forget`` run on each in turn: text output under a ``split NAME:`` line each,
``--json`` as ``{"splits": {NAME: <the command's object>}}``; a store without splits is shown as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pgprefetch.cli.console import fail
from pgprefetch.errors import ConfigError, StoreNotFoundError

if TYPE_CHECKING:
    from pgprefetch.store.base import Store


@dataclass
class Shown:
    """What a store command says of one store: its JSON object, its text lines, and a failure (exit 1)."""

    json: dict[str, Any]
    lines: list[str] = field(default_factory=list)
    failure: str | None = None


def stores(config_path: Path | None, store: str | None, split: str | None) -> list[tuple[str | None, Store]]:
    """The stores a command runs on: the split named, or each split of a store that has them, or the store."""
    from pgprefetch.cli.options import named_store
    from pgprefetch.store.splits import split_rule, split_store

    root = named_store(config_path, store, split)
    if split is not None:
        return [(split, root)]
    rule = split_rule(root)
    if rule is None:
        return [(None, root)]
    found: list[tuple[str | None, Store]] = [(n, s) for n in rule.names if (s := split_store(root, n)).exists()]
    if not found:
        raise StoreNotFoundError(f"{root.location}: no split of {', '.join(rule.names)} has been dumped yet")
    return found


def _run(one: Callable[[Store], Shown], targets: list[tuple[str | None, Store]]) -> list[tuple[str | None, Shown]]:
    """``one`` on every split; a split that refuses it (a run it has no record of) is said, not the end.

    Only when every split refuses is it the command's error: a run that reads ``train`` alone is known there.
    """
    shown: list[tuple[str | None, Shown]] = []
    refused: list[ConfigError] = []
    for name, target in targets:
        try:
            shown.append((name, one(target)))
        except ConfigError as e:
            refused.append(e)
            shown.append((name, Shown({"skipped": str(e)}, [f"skipped: {e}"])))
    if len(refused) == len(targets):
        raise refused[0]
    return shown


def per_split(
    config_path: Path | None, store: str | None, split: str | None, as_json: bool, one: Callable[[Store], Shown]
) -> None:
    """Run ``one`` on each store :func:`stores` names and print what it says; exit 1 if any failed."""
    targets = stores(config_path, store, split)
    several = any(name is not None for name, _ in targets) and split is None
    shown = _run(one, targets) if several else [(name, one(target)) for name, target in targets]
    if as_json:
        click.echo(json.dumps({"splits": {n: s.json for n, s in shown}} if several else shown[0][1].json))
    else:
        for name, s in shown:
            if several and s.lines:
                click.echo(f"split {name}:")
            if s.lines:
                click.echo("\n".join(s.lines))
    failures = [f"{f'split {n}: ' if several else ''}{s.failure}" for n, s in shown if s.failure]
    if failures:
        if as_json:
            raise click.exceptions.Exit(1)
        raise fail("; ".join(failures), 1)
