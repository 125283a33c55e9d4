"""Loading a config: the TOML file read and validated, then the command line's overrides applied.

The one way in for configs (the CLI, the Python API and the reader all come through here), so that the
precedence of ``--dsn``, ``PGPREFETCH_DSN`` and ``[source] dsn`` is decided once.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from pathlib import Path
from urllib.parse import quote

from pgprefetch.config.model import Config
from pgprefetch.config.parse import parse_config
from pgprefetch.config.values import parse_size, store_location
from pgprefetch.errors import ConfigError

__all__ = ["load_config", "parse_config", "with_overrides"]


def load_config(
    path: str | os.PathLike[str],
    *,
    dsn: str | None = None,
    connections: int | None = None,
    store: str | os.PathLike[str] | None = None,
    memory: str | None = None,
    scratch: str | os.PathLike[str] | None = None,
    split: str | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """Read, validate and freeze a config file, then apply command-line overrides.

    Args:
        path: the TOML file.
        dsn: ``--dsn``; wins over ``PGPREFETCH_DSN``, which wins over ``[source] dsn``.
        connections: ``--connections``, overriding ``[source] connections``.
        store: ``--store``, overriding ``[store] path`` (relative to the working directory, as typed).
        memory: ``--memory``, overriding ``[source] memory`` (the keys held, and a scan's table data).
        scratch: ``--scratch``, overriding ``[source] scratch`` (where keys beyond it are ordered on disk).
        split: ``--split``, one of ``[splits]``'s names: the split dumped or checked.
        environ: the environment to read ``PGPREFETCH_DSN`` from (``os.environ`` by default).

    Returns:
        The frozen config.

    Raises:
        ConfigError: the file is missing, not TOML, or breaks the contract; the message names the key.
    """
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{file}: no such config file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{file}: cannot read config file: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{file}: invalid TOML: {e}") from None
    cfg = parse_config(raw, file=file)
    return with_overrides(
        cfg, dsn=dsn, connections=connections, store=store, memory=memory, scratch=scratch, split=split, environ=environ
    )


def with_overrides(
    cfg: Config,
    *,
    dsn: str | None = None,
    connections: int | None = None,
    store: str | os.PathLike[str] | None = None,
    memory: str | None = None,
    scratch: str | os.PathLike[str] | None = None,
    split: str | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """``cfg`` with the command-line (or API) overrides applied; see :func:`load_config`."""
    env = os.environ if environ is None else environ
    source = cfg.source
    chosen_dsn = dsn or env.get("PGPREFETCH_DSN") or source.dsn
    if not chosen_dsn and env.get("PGSERVICE"):  # libpq's service name; asyncpg reads it only from a DSN
        chosen_dsn = f"postgresql://?service={quote(env['PGSERVICE'])}"
    if connections is not None:
        if isinstance(connections, bool) or connections <= 0:
            raise ConfigError(f"--connections: expected a positive integer, got {connections!r}")
        source = dataclasses.replace(source, connections=connections)
    if memory is not None:
        source = dataclasses.replace(source, memory_bytes=parse_size(memory, "--memory"))
    if scratch is not None:
        folder = store_location(scratch, "--scratch")
        if not isinstance(folder, Path):
            raise ConfigError(f"--scratch: expected a local folder, got {os.fspath(scratch)!r}")
        source = dataclasses.replace(source, scratch=folder.resolve())
    source = dataclasses.replace(source, dsn=chosen_dsn)
    store_cfg = cfg.store if store is None else dataclasses.replace(cfg.store, path=store_location(store, "--store"))
    chosen = chosen_split(cfg, split)
    out = dataclasses.replace(cfg, source=source, store=store_cfg, split=chosen)
    if out.evaluation:  # an evaluation split keeps every sample: no subsample, a short last batch padded
        out = dataclasses.replace(out, batches=dataclasses.replace(out.batches, drop_last=False))
        if out.mix is None and out.samples.fraction < 1.0:
            out = dataclasses.replace(out, samples=dataclasses.replace(out.samples, fraction=1.0))
    return out


def chosen_split(cfg: Config, split: str | None) -> str | None:
    """``--split``, checked against ``[splits]`` (None: the config has none, or none was asked for yet).

    Raises:
        ConfigError: a split the config does not name, or ``--split`` for a config without ``[splits]``.
    """
    if split is None:
        return cfg.split
    where = f"{cfg.file}: " if cfg.file else ""
    if cfg.splits is None:
        raise ConfigError(f"--split {split}: {where}the config has no [splits]")
    if split not in cfg.splits.names:
        raise ConfigError(f"--split {split}: {where}[splits] names {', '.join(cfg.splits.names)}")
    return split
