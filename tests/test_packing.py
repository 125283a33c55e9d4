"""Packed epochs against PostgreSQL: every document once per epoch, its tokens the database's, arrays consistent.

The documents are rows of token arrays with lengths from 0 to past a sequence (tests/harness/packing.py). Each
test reads what the epoch holds back into documents (by ``segment_keys`` and ``segment_offsets``) and compares
them with the table, not with the dump.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pgprefetch import EpochArrays, EpochDataset, dump_epochs, load_config

from .harness.dumps import chunk_bytes, dump, run_cli
from .harness.packing import BYTEA_TWIN, CODE_DOCS, DOCS, docs_table, documents, mixed_config, packed_config, read_back


@pytest.fixture
def docs_db(db: str) -> str:
    from .harness.db import execute

    execute(db, *DOCS)
    return db


@pytest.mark.parametrize("method", ["best-fit", "concat"])
@pytest.mark.parametrize("eos", [None, 7])
def test_every_document_is_in_the_epoch_once_with_the_databases_tokens(
    docs_db: str, tmp_path: Path, method: str, eos: int | None
) -> None:
    config = packed_config(tmp_path, method=method, eos=eos)
    result = dump(config, docs_db, epoch=0)
    table = documents(docs_db)
    got = read_back(result.path, eos)
    assert set(got) == {k for k, t in table.items() if len(t) or eos is not None}  # an empty one has no piece
    for key, tokens in got.items():
        assert tokens == table[key] + ([eos] if eos is not None else []), key


def test_check_reports_the_epochs_sequences_padding_and_pieces_before_a_dump(docs_db: str, tmp_path: Path) -> None:
    config = packed_config(tmp_path)
    code, out = run_cli("check", "--config", str(config), "--dsn", docs_db)
    assert code == 0, out
    result = dump(config, docs_db, epoch=0)
    p = EpochArrays(tmp_path / "store.zarr", 0).manifest["packing"]
    line = next(x for x in out.splitlines() if x.startswith("packing: "))
    assert line.startswith(f"packing: 300 documents ({p['tokens']:,} tokens) into {p['sequences']:,} sequences of 64")
    assert f"{p['pieces']:,} pieces, {p['documents_cut']:,} documents cut" in line
    assert f"epoch: {result.n_samples:,} samples" in out
    table = documents(docs_db)
    assert p["tokens"] == sum(len(t) for t in table.values())
    assert p["padding"] == result.n_samples * 64 - p["tokens"]
    assert p["documents_cut"] == len({k for k, t in table.items() if len(t) > 64})  # best-fit: only the long ones


def test_epochs_differ_and_an_epoch_is_the_same_bytes_alone_or_in_a_run(docs_db: str, tmp_path: Path) -> None:
    config = packed_config(tmp_path, eos=7)
    run = asyncio.run(dump_epochs(load_config(config, dsn=docs_db), range(3)))
    alone = dump(packed_config(tmp_path, eos=7, store="alone.zarr", name="alone.toml"), docs_db, epoch=2)
    assert chunk_bytes(alone.path) == chunk_bytes(run[2].path)
    first, second = (EpochArrays(tmp_path / "store.zarr", e) for e in (0, 1))
    a, b = first[0]["segment_keys"][:, :, 0], second[0]["segment_keys"][:, :, 0]
    assert not np.array_equal(a, b)  # documents shuffled, packed and the sequences shuffled anew
    assert read_back(run[0].path, 7) == read_back(run[1].path, 7)  # the same documents, whole, every epoch


def test_a_packed_epoch_stopped_midway_resumes_to_the_clean_bytes(db: str, tmp_path: Path) -> None:
    from .harness.db import execute

    execute(db, *docs_table(20_000))  # units of 25 batches: several units an epoch
    config = packed_config(tmp_path, length=2048, size=8)
    clean = dump(packed_config(tmp_path, length=2048, size=8, store="clean.zarr", name="clean.toml"), db)
    last = int(EpochArrays(tmp_path / "clean.zarr", 0)[-1]["segment_keys"][0, 0, 0])  # a document of the last batch
    execute(db, f"UPDATE docs SET tokens[1] = 70000 WHERE id = {last}")  # uint16 cannot hold it
    code, out = run_cli("dump", "--config", str(config), "--dsn", db, "--epoch", "0")
    assert code != 0
    assert f"sample (id={last}): field tokens, column tokens value 70000 does not fit uint16" in out
    assert not (tmp_path / "store.zarr" / "epoch-00000").exists()  # nothing published
    execute(db, f"UPDATE docs SET tokens[1] = (({last} * 7919 + 104729) % 50000) WHERE id = {last}")
    result = dump(config, db)
    assert result.resumed > 0  # the batches written before the failure are kept
    assert chunk_bytes(result.path) == chunk_bytes(clean.path)


def test_a_document_past_max_length_is_one_line_naming_it_before_anything_is_written(
    docs_db: str, tmp_path: Path
) -> None:
    config = packed_config(tmp_path)
    config.write_text(config.read_text().replace("max_length = 1000", "max_length = 149"))
    code, out = run_cli("dump", "--config", str(config), "--dsn", docs_db, "--epoch", "0")
    assert code == 1, out  # bad data, as a column's value past max_length is
    longest = max((k for k, t in documents(docs_db).items() if len(t) == 150))
    line = out.strip().splitlines()[-1]
    assert line.startswith("Error: sample (id="), out
    assert "has 150 elements, more than max_length 149" in line
    assert "Traceback" not in out
    assert not (tmp_path / "store.zarr").exists() or not list((tmp_path / "store.zarr").glob("epoch-*"))
    config.write_text(config.read_text().replace("max_length = 149", 'max_length = 149\ntruncate = "right"'))
    kept = read_back(dump(config, docs_db).path, None)
    assert kept[longest] == documents(docs_db)[longest][:149]
    text = config.read_text().replace('truncate = "right"', 'truncate = "left"').replace("store.zarr", "left.zarr")
    config.write_text(text)
    last = read_back(dump(config, docs_db, epoch=1).path, None)  # the last 149: each piece from its place
    assert last[longest] == documents(docs_db)[longest][-149:]
    assert last == {k: t[-149:] for k, t in documents(docs_db).items() if t}


def test_the_readers_hand_a_trainer_cu_seqlens_labels_and_masks(docs_db: str, tmp_path: Path) -> None:
    import torch

    from pgprefetch.torch import attention_inputs

    result = dump(packed_config(tmp_path, eos=7), docs_db)
    loader = torch.utils.data.DataLoader(EpochDataset(tmp_path / "store.zarr", 0), batch_size=None)
    seen = 0
    for batch in loader:
        got = attention_inputs(batch["tokens"], batch["segment_ids"])
        cu = got["cu_seqlens"]
        assert cu.dtype == torch.int32
        assert bool((cu[1:] > cu[:-1]).all())
        assert int(cu[-1]) == int((batch["segment_ids"] > 0).sum())
        labels = got["labels"]
        same = (batch["segment_ids"][:, 1:] == batch["segment_ids"][:, :-1]) & (batch["segment_ids"][:, :-1] > 0)
        assert torch.equal(labels[:, :-1][same], batch["tokens"][:, 1:][same].long())
        assert bool((labels[:, :-1][~same] == -100).all())
        assert bool((labels[:, -1] == -100).all())
        seen += batch["tokens"].shape[0]
    assert seen == result.n_samples


@pytest.mark.parametrize("method", ["best-fit", "concat"])
def test_a_scan_table_packs_to_the_bytes_of_its_query_twin(docs_db: str, tmp_path: Path, method: str) -> None:
    query = dump(packed_config(tmp_path, method=method, eos=3), docs_db, epoch=1)
    scan = packed_config(tmp_path, method=method, eos=3, scan=True, store="scan.zarr", name="scan.toml")
    code, out = run_cli("check", "--config", str(scan), "--dsn", docs_db)
    assert code == 0, out
    assert "packing: 300 documents" in out
    result = dump(scan, docs_db, epoch=1)
    assert chunk_bytes(result.path) == chunk_bytes(query.path)
    assert EpochArrays(tmp_path / "scan.zarr", 1).manifest["mode"] == "scan"


def test_splits_pack_disjoint_documents_that_cover_the_table(docs_db: str, tmp_path: Path) -> None:
    import pgprefetch

    config = packed_config(tmp_path, eos=7, extra="")
    config.write_text(config.read_text() + "[splits]\ntrain = 0.8\nval = 0.2\n")
    (train,) = pgprefetch.dump(config, epochs=0, dsn=docs_db, split="train")
    (val,) = pgprefetch.dump(config, epochs=0, dsn=docs_db, split="val")
    a, b = read_back(train.path, 7), read_back(val.path, 7)
    assert not set(a) & set(b)
    table = documents(docs_db)
    assert set(a) | set(b) == set(table)
    assert 0.7 < len(a) / len(table) < 0.9
    assert all(tokens == table[k] + [7] for k, tokens in (a | b).items())


def test_a_packed_epoch_on_an_object_store_is_the_local_bytes(docs_db: str, s3: Any, tmp_path: Path) -> None:
    local = dump(packed_config(tmp_path, method="concat"), docs_db, epoch=2)
    bucket = s3.bucket()
    remote = dump(packed_config(tmp_path, method="concat", name="s3.toml"), docs_db, epoch=2, store=f"s3://{bucket}/p")
    objects = s3.objects(bucket, "p/epoch-00002/")
    assert {k: v for k, v in objects.items() if "/" in k} == chunk_bytes(local.path)
    assert remote.n_samples == local.n_samples


def test_jax_gets_attention_inputs_whose_shape_is_the_batchs_whatever_its_documents(
    docs_db: str, tmp_path: Path
) -> None:
    pytest.importorskip("jax")
    from pgprefetch.jax import packed_inputs

    dump(packed_config(tmp_path, eos=7, size=4), docs_db)
    epoch = EpochArrays(tmp_path / "store.zarr", 0)
    most = epoch.manifest["packing"]["max_segments"]
    shapes = set()
    for b in range(len(epoch)):
        batch = epoch[b]
        got = packed_inputs(batch, epoch.manifest)
        cu = np.asarray(got["cu_seqlens"])
        real = int((batch["segment_ids"] > 0).sum())
        assert cu[-1] == real
        assert (np.diff(cu) >= 0).all()  # strictly increasing, then repeated past the last segment
        assert int((np.diff(cu) > 0).sum()) == sum(int(s.max()) for s in batch["segment_ids"])
        rows = batch["tokens"].shape[0]
        shapes.add((cu.shape, np.asarray(got["labels"]).shape))
        assert cu.shape == (rows * most + 1,)  # a batch's shape, whatever its documents: jit compiles once a shape
    assert ((4 * most + 1,), (4, 64)) in shapes


def test_tokens_in_a_bytea_pack_to_the_bytes_of_the_same_tokens_in_an_array(docs_db: str, tmp_path: Path) -> None:
    from .harness.db import execute, fetch

    execute(docs_db, BYTEA_TWIN, "ALTER TABLE docs_b ADD PRIMARY KEY (id)")
    first = fetch(docs_db, "SELECT d.tokens AS a, b.tokens AS b FROM docs d JOIN docs_b b USING (id) WHERE id = 7")[0]
    assert np.frombuffer(first["b"], "<u2").tolist() == list(first["a"])  # the twin holds the same tokens
    array = dump(packed_config(tmp_path, eos=7), docs_db, epoch=1)
    twin = packed_config(tmp_path, eos=7, store="b.zarr", name="b.toml")
    twin.write_text(twin.read_text().replace("FROM docs", "FROM docs_b"))
    assert chunk_bytes(dump(twin, docs_db, epoch=1).path) == chunk_bytes(array.path)
    execute(docs_db, "UPDATE docs_b SET tokens = tokens || '\\x01'::bytea WHERE id = 9")  # half a token more
    code, out = run_cli("dump", "--config", str(twin), "--dsn", docs_db, "--epoch", "2")
    assert code == 1
    assert "sample (id=9): field tokens, column tokens has" in out
    assert "bytes, not whole uint16 tokens of 2 bytes" in out


def test_a_tokenizers_output_packs_each_document_whole_and_a_later_epoch_takes_it_from_the_cache(
    db: str, tmp_path: Path
) -> None:
    tiktoken = pytest.importorskip("tiktoken")
    from .harness.texts import ENCODING, bodies, load_docs

    n = load_docs(db, files=12)
    config = tmp_path / "tok.toml"
    config.write_text(
        '[samples]\nkeys = "SELECT id FROM docs"\nquery = "SELECT body FROM docs WHERE id = $1"\n'
        f'[transforms.tok]\ntokenizer = "tiktoken"\nencoding = "{ENCODING}"\ninputs = ["body"]\nworkers = 1\n'
        '[fields.tokens]\ntransform = "tok"\ndtype = "uint32"\nmax_length = 200000\n'
        '[packing]\nfield = "tokens"\nlength = 1024\neos = 100257\n'
        '[batches]\nsize = 8\n[store]\npath = "store.zarr"\n'
    )
    first = dump(config, db, epoch=0)
    enc = tiktoken.get_encoding(ENCODING)
    expected = {k: [*enc.encode_ordinary(t), 100257] for k, t in bodies(db).items()}  # the rows, read back
    assert read_back(first.path, 100257) == expected
    record = EpochArrays(tmp_path / "store.zarr", 0).manifest
    assert record["transforms"]["tok"]["computed"] == n
    assert record["packing"]["documents_cut"] == sum(len(t) > 1024 for t in expected.values())
    second = dump(config, db, epoch=1)
    assert EpochArrays(tmp_path / "store.zarr", 1).manifest["transforms"]["tok"]["computed"] == 0  # all cached
    assert read_back(second.path, 100257) == expected


@pytest.fixture
def mix_db(docs_db: str) -> str:
    from .harness.db import execute

    execute(docs_db, *CODE_DOCS)
    return docs_db


def _source_tokens(batch: dict[str, np.ndarray]) -> np.ndarray:
    """Each sequence's real tokens."""
    return (batch["segment_ids"] > 0).sum(axis=1)


@pytest.mark.parametrize("method", ["best-fit", "concat"])
def test_a_packed_mix_gives_each_source_its_share_of_tokens_in_every_prefix_of_sequences(
    mix_db: str, tmp_path: Path, method: str
) -> None:
    result = dump(mixed_config(tmp_path, 3, 1, method=method), mix_db)
    epoch = EpochArrays(tmp_path / "mix.zarr", 0)
    assert epoch.sources == ["web", "code"]
    batches = [epoch[b] for b in range(len(epoch))]
    sources = np.concatenate([b["source"] for b in batches])
    tokens = np.concatenate([_source_tokens(b) for b in batches])
    web = np.cumsum(np.where(sources == 0, tokens, 0))
    total = np.cumsum(tokens)
    tables = {0: documents(mix_db), 1: documents(mix_db, "code_docs")}
    longest = max(len(t) + 1 for table in tables.values() for t in table.values())  # a document and its eos
    # every prefix: within one sequence's tokens (the interleave) and one document's (a quota's last document)
    assert (np.abs(web - 0.75 * total) <= 64 + longest).all()
    assert (np.abs(web - 0.75 * total)[: len(total) // 2] <= 64).all()  # away from the end: one sequence
    for b in batches:  # a sequence's pieces are of its own source's documents, with the database's tokens
        for s in range(b["tokens"].shape[0]):
            n = int(b["segment_ids"][s].max())
            for i in range(1, n + 1):
                key, offset = int(b["segment_keys"][s, i - 1, 0]), int(b["segment_offsets"][s, i - 1])
                piece = b["tokens"][s][b["segment_ids"][s] == i].tolist()
                doc = tables[int(b["source"][s])][key] + [7]
                assert piece == doc[offset : offset + len(piece)]
    # the epoch: one pass of the source with the fewest tokens per unit of weight; the other, its share of that
    passes = {name: sum(len(t) + 1 for t in tables[c].values()) for c, name in ((0, "web"), (1, "code"))}
    shares = {"web": 0.75, "code": 0.25}
    slowest = min(passes, key=lambda name: passes[name] / shares[name])
    epoch_tokens = int(passes[slowest] / shares[slowest])
    for entry in epoch.manifest["mix"]["sources"]:
        if entry["name"] == slowest:
            assert entry["documents"] == len(tables[entry["code"]])  # all of it, once
        assert 0 <= entry["tokens"] - round(shares[entry["name"]] * epoch_tokens) < longest
    assert result.sources == {"web": int((sources == 0).sum()), "code": int((sources == 1).sum())}


def test_a_packed_mix_walks_each_sources_passes_and_an_epoch_alone_is_the_runs(mix_db: str, tmp_path: Path) -> None:
    config = mixed_config(tmp_path, 1, 1)
    run = asyncio.run(dump_epochs(load_config(config, dsn=mix_db), range(3)))
    alone = dump(mixed_config(tmp_path, 1, 1, name="alone.toml", store="alone.zarr"), mix_db, epoch=2)
    assert chunk_bytes(alone.path) == chunk_bytes(run[2].path)
    counts: dict[int, int] = {}
    for e in range(3):  # web's passes span epochs: each of its documents taken once a pass
        epoch = EpochArrays(tmp_path / "mix.zarr", e)
        record = next(s for s in epoch.manifest["mix"]["sources"] if s["name"] == "web")
        taken = []
        for b in range(len(epoch)):
            batch = epoch[b]
            firsts = (batch["segment_offsets"] == 0) & (batch["source"] == 0)[:, None]  # a document's first piece
            taken += batch["segment_keys"][..., 0][firsts].tolist()
        assert len(taken) == record["documents"]  # whole documents, each where its pass puts it
        for k in taken:
            counts[k] = counts.get(k, 0) + 1
    assert set(counts) == set(documents(mix_db))  # more than a pass in all: every document
    assert max(counts.values()) - min(counts.values()) <= 1  # none a pass ahead of another


def test_packed_epochs_spread_over_ray_are_the_single_process_bytes(
    ray_cluster: object, mix_db: str, tmp_path: Path
) -> None:
    """One source (concat: documents cut across parts) and a packed mix (a reader a source in each part)."""
    from .harness.raycluster import on_ray

    single = dump(packed_config(tmp_path, eos=7, method="concat"), mix_db, epoch=1)
    config = packed_config(tmp_path, eos=7, method="concat", store="ray.zarr", name="ray.toml")
    spread = on_ray(config, mix_db, epoch=1, parts=3)
    assert (spread.executor, spread.parts) == ("ray", 3)
    assert chunk_bytes(spread.path) == chunk_bytes(single.path)
    mixed = dump(mixed_config(tmp_path, 2, 1), mix_db, epoch=1)
    spread = on_ray(mixed_config(tmp_path, 2, 1, name="rmix.toml", store="rmix.zarr"), mix_db, epoch=1, parts=3)
    assert chunk_bytes(spread.path) == chunk_bytes(mixed.path)
    assert spread.sources == mixed.sources


def test_a_packed_epoch_resumes_on_another_world_and_batch_size_reading_each_sequence_once(
    docs_db: str, tmp_path: Path
) -> None:
    dump(packed_config(tmp_path, size=4), docs_db)
    store = tmp_path / "store.zarr"

    def numbers(batch: dict[str, Any]) -> list[tuple[int, int]]:  # a sequence: its first piece's document, offset
        return [
            (int(k), int(o))
            for k, o in zip(batch["segment_keys"][:, 0, 0], batch["segment_offsets"][:, 0], strict=True)
        ]

    ranks = [EpochDataset(store, 0, batch_size=8, rank=r, world_size=2, consumer=None) for r in range(2)]
    seen = [n for ds in ranks for i in range(3) for n in numbers(ds[i])]
    state = ranks[0].state_dict(batches=3)
    rest = []
    for r in range(3):
        ds = EpochDataset(store, 0, batch_size=5, rank=r, world_size=3, consumer=None)
        ds.load_state_dict(state)
        rest += [n for b in ds for n in numbers(b)]
    every = [n for b in EpochArrays(store, 0) for n in numbers(b)]
    assert len(set(seen + rest)) == len(seen) + len(rest)  # no sequence twice
    assert set(seen + rest) <= set(every)
    assert len(every) - len(seen) - len(rest) < 15  # all but the remainder a last step of 3 ranks drops


@pytest.mark.chaos
def test_a_packed_epochs_lost_connections_are_retried_to_the_clean_bytes(db: str, tmp_path: Path) -> None:
    import json

    from .harness.db import execute
    from .harness.dumps import journal_lines, start_dump, wait_for
    from .harness.faults import kill_every_connection

    execute(db, *docs_table(20_000))
    clean = dump(packed_config(tmp_path, length=2048, size=8, store="clean.zarr", name="clean.toml"), db)
    config = packed_config(tmp_path, length=2048, size=8)
    config.write_text(config.read_text().replace("FROM docs WHERE", "FROM docs, pg_sleep(0.0005) WHERE"))
    proc = start_dump(config, db, 0, "--json")
    wait_for(lambda: journal_lines(tmp_path / "store.zarr") >= 1)
    kill_every_connection(db)  # the lengths' statement, the pieces' readers, the snapshot
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1])["retries"] == 1
    assert chunk_bytes(tmp_path / "store.zarr" / "epoch-00000") == chunk_bytes(clean.path)
