"""Train a tiny model with plain JAX on pgprefetch epochs: ArrayStream (or Grain) -> device_batches -> jit step.

Run after `pgprefetch demo` (which dumps epoch 0 of configs/demo.toml), as a plain script:

    python examples/jax_train.py --config configs/demo.toml --epochs 1
    python examples/jax_train.py --config configs/demo.toml --epochs 1 --grain   # Grain's DataLoader, 2 workers

Each sample is a 64-step window of two features; a per-step softmax regression predicts every step's label
(5 classes). Batches are split over all devices along the batch axis (a NamedSharding), each process
contributing its own rank's batches; try XLA_FLAGS=--xla_force_host_platform_device_count=2 on a CPU.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pgprefetch import ArrayStream, load_config
from pgprefetch.jax import device_batches


def stream_batches(store: str, epochs: int, seen: list) -> Iterator[dict[str, np.ndarray]]:
    """Consecutive epochs for this process's rank (device_batches gives the stream JAX's ranks)."""
    stream = ArrayStream(store, 0, epochs, keys=True)
    return recorded(stream, seen)


def grain_batches(store: str, epochs: int, seen: list) -> Iterator[dict[str, np.ndarray]]:
    """The same through Grain: one DataLoader per epoch, sharded by JAX process, no second shuffle."""
    import grain
    from absl import flags

    from pgprefetch.grain import EpochSource

    flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags; a plain script parsed none
    for epoch in range(epochs):
        source = EpochSource(store, epoch, keys=True)
        sampler = grain.samplers.IndexSampler(
            len(source),
            shard_options=grain.sharding.ShardByJaxProcess(drop_remainder=True),
            shuffle=False,  # the epoch is already shuffled, deterministically, by the dump
            num_epochs=1,  # one pass: the next epoch is the next pgprefetch epoch, shuffled anew
        )
        yield from recorded(grain.DataLoader(data_source=source, sampler=sampler, worker_count=2), seen)


def recorded(batches: object, seen: list) -> Iterator[dict[str, np.ndarray]]:
    """The batches without their keys, which are noted on the host (JAX without x64 has no int64)."""
    for batch in batches:  # type: ignore[attr-defined]
        batch = dict(batch)
        seen.append(batch.pop("keys").tolist())
        yield batch


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    logits = x @ params["w"] + params["b"]  # (batch, 64, 5)
    labels = jax.nn.one_hot(y, 5)
    return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits), axis=-1))


@jax.jit
def train_step(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> tuple[dict[str, jax.Array], jax.Array]:
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - 0.5 * g, params, grads), loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/demo.toml")
    parser.add_argument("--store", help="the store (instead of the config's)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs to train on, from epoch 0")
    parser.add_argument("--grain", action="store_true", help="read through Grain's DataLoader (2 workers)")
    parser.add_argument("--record", type=Path, help="write the sample keys trained on here (JSON)")
    args = parser.parse_args()

    store = args.store or str(load_config(args.config).store.path)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, P("data"))  # every array split over the devices by its batch axis
    seen: list = []
    batches = (grain_batches if args.grain else stream_batches)(store, args.epochs, seen)
    params = {"w": jnp.zeros((2, 5)), "b": jnp.zeros(5)}
    losses = []
    for batch in device_batches(batches, sharding=sharding, prefetch=2):
        params, loss = train_step(params, batch["x"], batch["y"])
        losses.append(loss)
    first, last = float(losses[0]), float(losses[-1])
    print(f"trained {len(losses)} steps on {len(jax.devices())} devices, loss {first:.4f} -> {last:.4f}")
    if args.record:
        args.record.write_text(json.dumps(seen))


if __name__ == "__main__":
    main()
