"""One transform on one sample, in this process: what ``pgprefetch transform`` runs after a dump stopped on it.

The sample's inputs come from the dump's own statement on a fresh snapshot (the same SQL, the same decoding),
so what the function is handed here is what the dump handed it; a random transform draws what the given
epoch drew. Nothing is cached or written.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from pgprefetch.config.model import Config
from pgprefetch.errors import ConfigError, SampleError
from pgprefetch.keys import KeyColumns, order_slot, uuid_slots
from pgprefetch.pg.session import BatchReader, Snapshot
from pgprefetch.write.transform.inputs import check_inputs, input_value, statement_of
from pgprefetch.write.transform.loading import output_fields
from pgprefetch.write.transform.outputs import Packed
from pgprefetch.write.transform.runner import Loaded, Task


def parse_key(keys: KeyColumns, text: str) -> np.ndarray:
    """``id=4`` or ``4`` (``a=1, b=2`` or ``1,2`` for several columns) as the key's slots, ``(width, 1)``."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != len(keys.names):
        raise ConfigError(f"--key {text!r}: expected {len(keys.names)} value(s), for {', '.join(keys.names)}")
    slots: list[int] = []
    for part, name, is_uuid, time in zip(parts, keys.names, keys.uuids, keys.times, strict=True):
        given, _, value = part.rpartition("=")
        if given and given.strip() != name:
            raise ConfigError(f"--key {text!r}: {given.strip()!r} is not a key column ({', '.join(keys.names)})")
        slots += _slots(value.strip(), name, is_uuid, time, text)
    return np.array(slots, np.int64).reshape(-1, 1)


def _slots(value: str, name: str, is_uuid: bool, time: str, text: str) -> list[int]:
    try:
        if is_uuid:
            return [int(s) for s in uuid_slots([uuid.UUID(value)])[0]]
        slot = order_slot(time, value) if time else int(value)
    except ValueError:
        slot = None
    if slot is None:
        raise ConfigError(f"--key {text!r}: {value!r} is not a value of key column {name}")
    return [int(slot)]


async def rerun(cfg: Config, name: str, key: str, epoch: int = 0, source: str | None = None) -> dict[str, Packed]:
    """Transform ``name``'s outputs for the one sample ``key``; its error, with the traceback, if it fails.

    ``source``: a mixed config's source the sample is of (required there).
    """
    if cfg.mix is not None:
        names = [s.name for s in cfg.mix.sources]
        if source not in names:
            raise ConfigError(f"--source: a mixed config's sample is of one of its sources ({', '.join(names)})")
        cfg = cfg.for_source(source)
    elif source is not None:
        raise ConfigError("--source names a source of a mixed config ([samples.NAME]); this config has one")
    if name not in {t.name for t in cfg.transforms}:
        known = ", ".join(t.name for t in cfg.transforms) or "none"
        raise ConfigError(f"no [transforms.{name}] in {cfg.file or 'the config'} (transforms: {known})")
    one = dataclasses.replace(cfg.source, connections=1)
    async with Snapshot.open(one) as snap:
        keys = (await snap.describe(cfg)).keys if cfg.mode == "query" else KeyColumns(cfg.scan_samples.key)
        slots = parse_key(keys, key)
        inputs = await check_inputs(cfg, snap)
        async with BatchReader.open(one, snap.id, statement_of(cfg, keys, inputs), row_wise=True) as reader:
            rows = cast("Sequence[Sequence[Any]]", await reader.fetch(0, np.vstack([slots, [[1]]])))
    if not rows or not rows[0]:
        raise SampleError(f"no sample ({keys.show(slots[:, 0])}) in {cfg.file or 'the config'}'s [samples]")
    first = 1 + len(cfg.transforms)
    values = {c: input_value(rows[first + j][0]) for j, c in enumerate(inputs)}
    t = cfg.transform(name)
    where = f"{cfg.file}: [transforms.{name}]" if cfg.file else f"[transforms.{name}]"
    loaded = Loaded(t, output_fields(cfg, name), where)
    task = Task(name, {c: [values[c]] for c in t.inputs}, slots, epoch, cfg.batches.seed, keys, source)
    return loaded.call(task)
