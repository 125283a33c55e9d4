"""The Grain layer: a published epoch as a ``grain`` random-access data source of stored batches.

The only package that imports Grain. It imports the reading core (``pgprefetch.read``), never torch or JAX.
"""

try:
    import grain  # noqa: F401  (checked here, so the error below is one line naming the extra)
except ImportError as e:
    if e.name != "grain":
        raise
    raise ImportError("pgprefetch.grain needs Grain: pip install 'pgprefetch[jax]'", name="grain") from None

from pgprefetch.grain.source import EpochSource

__all__ = ["EpochSource"]
