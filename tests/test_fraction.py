"""``fraction`` is a subsample, not a holdout: what docs/config.md promises of it is what a dump does.

#51.6: in a plain config ``fraction`` picked other keys each epoch (46,937 and 47,169 keys of 58,788 in
epochs 0 and 1, 37,619 in common) while docs/mixing.md said "the same keys every pass", which is true
only of a ``[samples.NAME]`` source. Neither keeps a set of keys out of training: a split needs rows a
training config never selects.
"""

from __future__ import annotations

import re
from pathlib import Path

import zarr

from .harness.configs import s_config
from .harness.db import execute, fetch
from .harness.dumps import dump
from .harness.mixing import MIX_TABLES, WEB, mix_config

ROOT = Path(__file__).resolve().parent.parent


def epoch_keys(store: Path, epoch: int) -> set[int]:
    """The keys of an epoch's samples (padding left out), as the store holds them."""
    group = zarr.open_group(store / f"epoch-{epoch:05d}", mode="r")
    n = group.attrs["pgprefetch"]["n_samples"]
    return set(group["keys"][:].reshape(-1)[:n].tolist())


def test_a_plain_fraction_takes_another_subset_each_epoch(s_table: str, tmp_path: Path) -> None:
    cfg = s_config(tmp_path, fraction=0.5, drop_last=False)
    store = tmp_path / "store.zarr"
    for epoch in (0, 1, 2):
        dump(cfg, s_table, epoch=epoch)
    everything = {r[0] for r in fetch(s_table, "SELECT id FROM s")}
    taken = [epoch_keys(store, e) for e in (0, 1, 2)]
    for keys in taken:
        assert keys <= everything
        assert 0.35 * len(everything) < len(keys) < 0.65 * len(everything)  # about half, as configured
    assert taken[0] != taken[1]  # another subset each epoch ...
    assert len(taken[0] | taken[1] | taken[2]) > 0.8 * len(everything)  # ... so training sees most keys
    dump(cfg, s_table, epoch=0, force=True)
    assert epoch_keys(store, 0) == taken[0]  # the same subset on every rerun of an epoch


def test_a_mixed_sources_fraction_takes_the_same_keys_every_epoch(db: str, tmp_path: Path) -> None:
    execute(db, *MIX_TABLES)
    cfg = mix_config(tmp_path, {"web": {**WEB, "fraction": 0.5}, "more": {**WEB, "weight": 0}}, size=10)
    store = tmp_path / "store.zarr"
    for epoch in (0, 1, 2):
        dump(cfg, db, epoch=epoch)
    taken = [epoch_keys(store, e) for e in (0, 1, 2)]
    everything = {r[0] for r in fetch(db, "SELECT id FROM web")}
    union = taken[0] | taken[1] | taken[2]
    assert union <= everything
    assert 0.35 * len(everything) < len(union) < 0.65 * len(everything)  # one subset, chosen once


def row(page: str, key: str) -> str:
    """The text of the table row of ``key`` in docs/``page``."""
    text = (ROOT / "docs" / page).read_text()
    found = re.search(rf"^\| `{re.escape(key)}` \|.*$", text, flags=re.M)
    assert found, key
    return found[0]


def test_the_docs_say_fraction_is_a_subsample_not_a_holdout() -> None:
    fraction = row("config.md", "[samples] fraction")
    assert "another subset each epoch" in fraction
    assert "not a holdout" in fraction
    assert "[samples.NAME]" in fraction
    assert "the same keys in every epoch" in fraction
    assert "[`[splits]`](splits.md)" in fraction  # what a holdout is
    mixing = " ".join((ROOT / "docs" / "mixing.md").read_text().split())  # lines joined
    claim = mixing.index("the same keys every pass")
    assert "unlike a lone `[samples]`" in mixing[claim - 300 : claim + 300]  # scoped to a mixed source
