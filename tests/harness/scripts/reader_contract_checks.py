"""The JAX checks of test_reader_contracts.py, run in a process of its own with two CPU devices forced.

Usage: reader_contract_checks.py STORE. The store holds one epoch dumped with ``drop_last = false`` whose
last batch is short. XLA_FLAGS must be set before JAX is imported, which a fresh process guarantees.
Prints one JSON object for the test to assert on.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pgprefetch import ArrayStream, ConfigError, EpochArrays
from pgprefetch.jax import device_batches


class Counting(EpochArrays):
    """An EpochArrays that counts the batches read from it: a refusal at open reads none."""

    read_batches = 0

    def __getitem__(self, i: int):  # type: ignore[no-untyped-def]
        Counting.read_batches += 1
        return super().__getitem__(i)


def refused(make) -> str:  # type: ignore[no-untyped-def]
    """The error of making device_batches (not of iterating them), or 'no error'."""
    try:
        make()
    except ConfigError as e:
        return str(e)
    return "no error"


def main() -> None:
    store = sys.argv[1]
    sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
    out: dict = {"devices": len(jax.devices())}
    out["arrays"] = refused(lambda: device_batches(Counting(store, 0, consumer=None), sharding=sharding))
    out["stream"] = refused(lambda: device_batches(ArrayStream(store, 0, 1, consumer=None), sharding=sharding))
    out["read_before_refusal"] = Counting.read_batches
    padded = []
    for batch in device_batches(EpochArrays(store, 0, consumer=None), sharding=sharding, pad_last=True):
        padded.append({"v": np.asarray(batch["v"]).tolist(), "valid": np.asarray(batch["valid"]).tolist()})
    out["padded"] = padded
    streamed = device_batches(ArrayStream(store, 0, 1, keys=True, consumer=None), sharding=sharding, pad_last=True)
    out["stream_padded"] = [
        {"v": np.asarray(b["v"]).tolist(), "valid": np.asarray(b["valid"]).tolist(), "keys": list(b["keys"].shape)}
        for b in streamed
    ]
    out["state"] = streamed.state_dict()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
