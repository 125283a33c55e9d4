"""The JAX checks of test_jax.py, each run in a process of its own with two CPU devices forced.

Usage: jax_checks.py CHECK STORE [PROCESS_ID PORT]. XLA_FLAGS (two host devices) must be set before JAX is
imported, which a fresh process guarantees. Each check prints one JSON object for the test to assert on;
``all`` runs every single-process check in one process, each result under its name.
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


class Counting:
    """An iterable of an ArrayStream's batches that counts how many were pulled from it."""

    def __init__(self, stream: ArrayStream) -> None:
        self.stream, self.pulled = stream, 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        for batch in self.stream:
            self.pulled += 1
            yield batch


def ahead(store: str) -> dict:
    """No sharding: the batches on the default device, in order, ``prefetch`` pulled ahead of the consumer."""
    source = Counting(ArrayStream(store, 0, 2, consumer=None))
    pulled, got = [], []
    for batch in device_batches(source, prefetch=2):
        pulled.append(source.pulled)
        got.append(np.asarray(batch["v"]).tolist())
        assert isinstance(batch["v"], jax.Array)
        assert batch["v"].devices() == {jax.devices()[0]}
    return {"got": got, "pulled": pulled}


def sharded(store: str) -> dict:
    """A NamedSharding over both devices: global arrays split by the batch axis; the state of the consumed batch."""
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    stream = ArrayStream(store, 0, 2, batch_size=8, keys=True, consumer=None)
    batches = device_batches(stream, sharding=sharding, prefetch=3)
    got, shards = [], set()
    for i, batch in enumerate(batches):
        v = batch["v"]
        shards.add(tuple(sorted((d.id, s.data.shape[0]) for s in v.addressable_shards for d in [s.device])))
        assert np.array_equal(np.asarray(batch["keys"])[:, 0], np.asarray(v))
        got.append(np.asarray(v).tolist())
        if i == 9:
            state = batches.state_dict()
            break
    resumed = ArrayStream(store, 0, 2, batch_size=8, keys=True, consumer=None)
    resumed.load_state_dict(state)
    rest = [np.asarray(b["v"]).tolist() for b in device_batches(resumed, sharding=sharding)]
    return {"got": got + rest, "state": state, "shards": sorted(shards), "stream_state": stream.state_dict()}


def refusals(store: str) -> dict:
    """What device_batches refuses: a ring of reused buffers, batches split for another world, a short batch."""
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    out = {}
    cases = {
        "buffers": lambda: device_batches(ArrayStream(store, 0, 1, buffers=3, consumer=None)),
        "world": lambda: device_batches(EpochArrays(store, 0, rank=0, world_size=2, consumer=None), sharding=sharding),
        "short": lambda: list(device_batches(EpochArrays(store, 0, batch_size=10, consumer=None), sharding=sharding)),
    }
    for name, case in cases.items():
        try:
            case()
            out[name] = "no error"
        except ConfigError as e:
            out[name] = str(e)
    return out


def distributed(store: str, process_id: int, port: int) -> dict:
    """One of two processes: each contributes its rank's batch, every process sees the global arrays."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60)
    from jax.experimental import multihost_utils

    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    stream = ArrayStream(store, 0, 1, consumer=None)  # no ranks given: device_batches gives JAX's
    total = jax.jit(lambda v: v.sum())
    got, sums = [], []
    for batch in device_batches(stream, sharding=sharding):
        v = batch["v"]
        local = np.concatenate([np.asarray(s.data) for s in v.addressable_shards])
        got.append(local.tolist())
        whole = multihost_utils.process_allgather(v, tiled=True)
        sums.append([int(total(v)), int(np.asarray(whole).sum()), list(v.shape)])
    ranks = stream.ranks()
    jax.distributed.shutdown()
    return {"process": jax.process_index(), "ranks": list(ranks), "got": got, "sums": sums}


ONE_PROCESS = {"ahead": ahead, "sharded": sharded, "refusals": refusals}


def main() -> None:
    check, store = sys.argv[1], sys.argv[2]
    if check == "distributed":
        result = distributed(store, int(sys.argv[3]), int(sys.argv[4]))
    elif check == "all":  # the checks of one process share its start-up (importing JAX takes seconds)
        result = {name: run(store) for name, run in ONE_PROCESS.items()}
    else:
        result = ONE_PROCESS[check](store)
    print(json.dumps({"devices": len(jax.devices()), **result}))


if __name__ == "__main__":
    main()
