"""Variable-length data read back: the statistics of real values only, batches trimmed to the longest sample.

Over ``seqs`` (the ``seqs`` fixture, tests/harness/ragged.py): the manifest's figures against numpy, the
``stats`` command, the trimming readers (views, not copies; the stream's reused buffers too), and a dump of
padded fields killed and resumed holding the bytes and figures of a clean one.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .harness.configs import write_config
from .harness.db import fetch
from .harness.dumps import chunk_bytes, dump, kill_9_after
from .harness.ragged import seqs_config


def stats_config(folder: Path, name: str = "test.toml", store: str = "store.zarr", slow: bool = False) -> Path:
    query = (
        "SELECT tokens, CASE WHEN id % 7 = 0 THEN NULL ELSE id * 0.25 END AS score, id, -id AS neg"
        + (", pg_sleep(0.02)" if slow else "")
        + " FROM seqs WHERE id = $1"
    )
    fields = {
        "tokens": (["tokens"], "int32", {"max_length": 24, "truncate": "right", "pad": 99}),
        "score": (["score"], "float64", {"null": 123.0}),
        "pair": (["id", "neg"], "int64"),
    }
    return write_config(
        folder, keys="SELECT id FROM seqs", query=query, fields=fields, size=32, drop_last=False,
        name=name, store=store, connections=2,
    )  # fmt: skip


def test_statistics_count_only_real_values_and_match_numpy(seqs: str, tmp_path: Path) -> None:
    from pgprefetch import EpochDataset

    dump(stats_config(tmp_path), seqs)
    stats = EpochDataset(tmp_path / "store.zarr", 0, consumer=None).stats
    tokens = [t for r in fetch(seqs, "SELECT tokens FROM seqs") for t in r[0][:24]]  # padding excluded
    scores = [r[0] * 0.25 for r in fetch(seqs, "SELECT id FROM seqs WHERE id % 7 <> 0")]  # NULLs excluded
    ids = [r[0] for r in fetch(seqs, "SELECT id FROM seqs")]
    for got, values in (
        (stats["tokens"]["tokens"], tokens),
        (stats["score"]["score"], scores),
        (stats["pair"]["id"], ids),
    ):
        x = np.array(values, dtype=np.float64)
        assert got["count"] == x.size
        assert got["mean"] == pytest.approx(x.mean(), rel=1e-9)
        assert got["std"] == pytest.approx(x.std(), rel=1e-9)
        assert (got["min"], got["max"]) == (x.min(), x.max())
    assert set(stats) == {"tokens", "score", "pair"}


def test_trimmed_batches_are_views_cut_to_the_longest_sample(seqs: str, tmp_path: Path) -> None:
    import torch

    from pgprefetch import EpochDataset, lengths_to_mask

    fields = {"tokens": (["tokens"], "int32", {"max_length": 40})}
    dump(seqs_config(tmp_path, fields), seqs)
    full = EpochDataset(tmp_path / "store.zarr", 0, consumer=None, batch_size=4)
    cut = EpochDataset(tmp_path / "store.zarr", 0, consumer=None, batch_size=4, trim=True)
    widths = set()
    for i in range(len(full)):
        a, b = full[i], cut[i]
        longest = int(a["tokens_length"].max())
        widths.add(longest)
        assert b["tokens"].shape == (a["tokens"].shape[0], longest)
        assert b["tokens"].stride() == (40, 1)  # a view of the stored rows of 40: nothing copied
        assert torch.equal(b["tokens"], a["tokens"][:, :longest])
        mask = lengths_to_mask(b["tokens_length"])
        assert mask.shape == b["tokens"].shape
        assert torch.equal(mask.sum(dim=1), b["tokens_length"].long())
        assert (b["tokens"][~mask] == 0).all()
    assert len(widths) > 1


def test_a_resumed_dump_of_padded_fields_has_the_bytes_and_figures_of_a_clean_one(seqs: str, tmp_path: Path) -> None:
    import json

    cfg = stats_config(tmp_path, slow=True)
    store = tmp_path / "store.zarr"
    kill_9_after(cfg, seqs, store)
    resumed = dump(cfg, seqs)
    assert resumed.resumed >= 2
    clean = dump(stats_config(tmp_path, name="clean.toml", store="clean.zarr"), seqs)
    assert chunk_bytes(resumed.path) == chunk_bytes(clean.path)

    def stats(path: Path) -> dict:
        return json.loads((path / "zarr.json").read_text())["attributes"]["pgprefetch"]["stats"]

    assert stats(resumed.path) == stats(clean.path)


def test_stats_command_prints_the_figures_of_an_epoch(seqs: str, tmp_path: Path) -> None:
    import json

    from click.testing import CliRunner

    from pgprefetch.cli import cli

    dump(stats_config(tmp_path), seqs)
    store = str(tmp_path / "store.zarr")
    result = CliRunner().invoke(cli, ["stats", "--store", store, "--epoch", "0", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["epoch"] == 0
    assert figures["stats"]["pair"]["neg"]["max"] == -1
    table = CliRunner().invoke(cli, ["stats", "--config", str(tmp_path / "test.toml"), "--epoch", "0"])
    assert table.exit_code == 0
    lines = table.output.splitlines()
    assert lines[0].split() == ["field", "column", "count", "mean", "std", "min", "max"]
    assert lines[1].split()[:3] == ["tokens", "tokens", f"{figures['stats']['tokens']['tokens']['count']:,}"]
    missing = CliRunner().invoke(cli, ["stats", "--store", store, "--epoch", "5"])
    assert missing.exit_code == 1
    assert missing.output.startswith("Error: epoch 5 is not in")


def test_the_stream_trims_too_also_from_reused_buffers(seqs: str, tmp_path: Path) -> None:
    from pgprefetch import EpochDataset, EpochStream

    fields = {"tokens": (["tokens"], "int32", {"max_length": 40})}
    dump(seqs_config(tmp_path, fields), seqs)
    store = tmp_path / "store.zarr"
    want = [b["tokens"].tolist() for b in EpochDataset(store, 0, consumer=None, batch_size=4, trim=True)]
    for buffers in (0, 2):
        stream = EpochStream(store, 0, 1, batch_size=4, trim=True, buffers=buffers, consumer=None)
        assert [b["tokens"].tolist() for b in stream] == want
