"""Scripts the tests run as processes of their own, by path (``SCRIPTS / name``), never imported.

A fresh process is what they need: JAX's XLA_FLAGS (two host devices) must be set before JAX is
imported, Grain's workers and accelerate's ranks are processes, and each prints its result as JSON.

- ``jax_checks.py``: ``device_batches`` and ``jax.distributed`` (tests/test_jax.py)
- ``grain_checks.py``: Grain's DataLoader with worker processes (tests/test_grain.py)
- ``reader_contract_checks.py``: the readers' contracts under JAX (tests/test_reader_contracts.py)
- ``accelerate_ranks.py``: EpochStream under accelerate's ranks (tests/test_frameworks.py)
"""

from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
