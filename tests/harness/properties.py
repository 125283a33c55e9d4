"""The property tests' Hypothesis profile, and the strategies several test files draw keys from.

Hypothesis, not hand-rolled ``default_rng`` loops: it searches the space (repeats, extremes, empty and
one-element cases) instead of one fixed sample of it, and a failing case comes back shrunk to a minimal
one. Two profiles:

- ``ci`` (the default): ``derandomize`` draws the same examples on every run, so CI is deterministic and a
  red run is a red run on any machine; ``max_examples`` keeps the property tests to a few seconds in all;
  ``deadline=None`` because two shared cores make timings noise; ``database=None`` writes no example
  database into the tree; ``print_blob`` prints the failing case's blob to replay it with ``@reproduce_failure``.
- ``dev``: random, ten times the examples, for hunting: ``HYPOTHESIS_PROFILE=dev make test``.

tests/conftest.py imports this module once, which registers and loads the profile.
"""

from __future__ import annotations

import math
import os

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

settings.register_profile("ci", derandomize=True, max_examples=50, deadline=None, database=None, print_blob=True)
settings.register_profile("dev", max_examples=500, deadline=None, database=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# For a property whose every example writes a real store (zarr, files): a quarter of the profile's examples.
costly = settings(max_examples=max(5, settings().max_examples // 4))

INT64 = np.iinfo(np.int64)
EXTREMES = (0, -1, 1, int(INT64.min), int(INT64.min) + 1, int(INT64.max) - 1, int(INT64.max))
# A key value: anything a bigint (int8) column holds, drawn often from the edges and from a few small values (repeats).
values = st.one_of(st.sampled_from(EXTREMES), st.integers(-3, 3), st.integers(int(INT64.min), int(INT64.max)))
# The seeds a config holds (a TOML integer: int64) and the epochs a dump is asked for (0 and up).
seeds = st.integers(int(INT64.min), int(INT64.max))
epochs = st.integers(0, int(INT64.max))


@st.composite
def key_arrays(
    draw: st.DrawFn, widths: tuple[int, ...] = (1, 2), max_keys: int = 200, repeats: bool = True, min_keys: int = 0
) -> np.ndarray:
    """Keys as the dump holds them: ``(width, n)`` int64, column-major; with ``repeats``, some keys twice or more.

    Distinct keys are drawn first, then (with ``repeats``) copies of some of them at random places, so a
    repeat may land far from its first copy (in another run, another bucket).
    """
    width = draw(st.sampled_from(widths))
    distinct = draw(st.lists(st.tuples(*[values] * width), min_size=min_keys, max_size=max_keys, unique=True))
    keys = list(distinct)
    if repeats and distinct:
        copies = draw(st.lists(st.sampled_from(distinct), max_size=max_keys // 4))
        for key in copies:
            keys.insert(draw(st.integers(0, len(keys))), key)
    return np.ascontiguousarray(np.array(keys, dtype=np.int64).reshape(-1, width).T)


def distinct_count(keys: np.ndarray) -> int:
    """How many different keys (columns) ``keys`` holds: the oracle for repeats found."""
    return int(np.unique(keys, axis=1).shape[1]) if keys.shape[1] else 0


def same_json(a: object, b: object) -> bool:
    """Whether two JSON values are the same, NaN equal to NaN and a bool never equal to a number."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    return a == b


# Any text: every script, emoji, control characters and lone surrogates (escaped by json, as zarr writes them).
texts = st.text(st.characters(exclude_categories=()), max_size=12)
# JSON-able attributes as a manifest holds them: numbers of any size, NaN and the infinities, nested lists and maps.
special_floats = st.sampled_from([math.nan, math.inf, -math.inf, -0.0])  # drawn often, not left to chance
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | special_floats | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20,
)
attributes = st.dictionaries(texts, json_values, max_size=5)
