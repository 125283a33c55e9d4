"""The JAX layer: NumPy batches of the reading core placed on devices ahead of the step (``device_batches``).

The only package that imports JAX. It imports the reading core (``pgprefetch.read``), never torch or Grain.
"""

try:
    import jax  # noqa: F401  (checked here, so the error below is one line naming the extra)
except ImportError as e:
    if e.name not in ("jax", "jaxlib"):
        raise
    raise ImportError("pgprefetch.jax needs JAX: pip install 'pgprefetch[jax]'", name="jax") from None

from pgprefetch.jax.device import DeviceBatches, device_batches
from pgprefetch.jax.packed import attention_inputs, packed_inputs

__all__ = ["DeviceBatches", "attention_inputs", "device_batches", "packed_inputs"]
