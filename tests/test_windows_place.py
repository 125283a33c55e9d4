"""Where a starts epoch's windows lie among its rows (:func:`pgprefetch.write.scan.starts.place`), and the doubling
window maximum its ``_longest`` comes from: against a window-by-window count, over random tables and windows."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pgprefetch.write.scan.starts import place, window_max


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_rows_kept_are_those_some_window_covers_and_each_window_is_a_run_of_them(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 80))
    window = data.draw(st.integers(1, n))
    starts = np.array(data.draw(st.lists(st.integers(0, n - window), max_size=40)), dtype=np.int64)
    placed = place(starts, window, n)
    coverage = np.zeros(n, dtype=np.int64)
    for s in starts:
        coverage[s : s + window] += 1
    kept = np.flatnonzero(coverage)
    assert placed.rows.tolist() == kept.tolist()
    assert placed.weights.tolist() == coverage[kept].tolist()
    for s, at in zip(starts.tolist(), placed.starts.tolist(), strict=True):
        assert placed.rows[at : at + window].tolist() == list(range(s, s + window))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=60), st.data())
def test_window_max_is_each_windows_largest(values: list[int], data: st.DataObject) -> None:
    window = data.draw(st.integers(1, len(values)))
    got = window_max(np.array(values), window)
    assert got.tolist() == [max(values[i : i + window]) for i in range(len(values) - window + 1)]
