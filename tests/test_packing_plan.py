"""The packer and the readers' attention inputs, without a database: invariants over any lengths (Hypothesis).

The packer: every document once, its pieces in order with no gap or overlap, no empty piece, no sequence over
``length``; under best-fit only the documents longer than ``length`` cut, and the sequences, as full, of a plain
best-fit decreasing written here (a tie between equal free spaces changes which sequence, never how full);
the shuffle a permutation. The attention inputs: ``cu_seqlens`` strictly increasing over the real tokens,
padding never a segment, labels the next token of the same segment.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgprefetch.config.model import PackingConfig
from pgprefetch.read.packed import IGNORE, attention_inputs
from pgprefetch.write.pack.packer import Packing, pack

from .harness.loading import error, load

lengths_st = st.lists(st.integers(0, 700), min_size=1, max_size=300)


def _check_pieces(p: Packing, lengths: list[int], length: int) -> None:
    """Every document's tokens covered once, in order, by pieces of at least one token; no sequence overfull."""
    n_seq = p.n_sequences
    assert p.starts[0] == 0
    assert (np.diff(p.starts) >= 1).all()
    assert (p.size >= 1).all()
    used = np.bincount(np.repeat(np.arange(n_seq), np.diff(p.starts)), weights=p.size, minlength=n_seq)
    assert (used <= length).all()
    order = np.lexsort((p.offset, p.doc))
    doc, offset, size = p.doc[order], p.offset[order], p.size[order]
    assert (np.bincount(doc, weights=size, minlength=len(lengths)) == np.asarray(lengths)).all()
    first = np.r_[True, doc[1:] != doc[:-1]][: doc.size]
    assert (offset[first] == 0).all()
    assert (offset[1:][~first[1:]] == (offset + size)[:-1][~first[1:]]).all()  # each piece where the last ended


def _reference_fills(lengths: list[int], length: int, group: int) -> list[int]:
    """Best-fit decreasing as written in the papers: a list of free spaces, scanned for the tightest fit.

    Returns every sequence's tokens, sorted: which of two equally free sequences takes an item changes
    neither their number nor how full each ends up.
    """
    fills: list[int] = []
    for g in range(0, len(lengths), group):
        rest = sorted((n % length for n in lengths[g : g + group] if n % length), reverse=True)
        free: list[int] = []
        for item in rest:
            fits = [i for i, room in enumerate(free) if room >= item]
            if fits:
                best = min(fits, key=lambda i: free[i])
                free[best] -= item
            else:
                free.append(length - item)
        fills += [length - room for room in free] + [length] * sum(n // length for n in lengths[g : g + group])
    return sorted(fills)


@given(lengths=lengths_st, length=st.integers(1, 300), group=st.integers(1, 400))
@settings(max_examples=300, deadline=None)
def test_best_fit_keeps_documents_whole_but_the_long_ones_and_fills_its_sequences_as_best_fit_decreasing_does(
    lengths: list[int], length: int, group: int
) -> None:
    p = pack(np.array(lengths), length, "best-fit", group)
    _check_pieces(p, lengths, length)
    pieces = np.bincount(p.doc, minlength=len(lengths))
    expected = [0 if n == 0 else -(-n // length) for n in lengths]  # a long one: its full pieces and the rest
    assert pieces.tolist() == expected
    fills = np.add.reduceat(p.size, p.starts[:-1]) if p.n_sequences else np.zeros(0, dtype=np.int64)
    assert sorted(fills.tolist()) == _reference_fills(lengths, length, group)


@given(lengths=lengths_st, length=st.integers(1, 300))
@settings(max_examples=300, deadline=None)
def test_concat_cuts_the_stream_every_length_tokens_with_no_padding_but_the_last(
    lengths: list[int], length: int
) -> None:
    p = pack(np.array(lengths), length, "concat", 1)
    _check_pieces(p, lengths, length)
    total = sum(lengths)
    assert p.n_sequences == -(-total // length)
    assert p.padding == p.n_sequences * length - total
    assert p.padding < length or total == 0
    docs_in_order = p.doc[np.lexsort((p.offset, p.doc))]
    assert (np.diff(p.doc) >= 0).all()
    assert len(docs_in_order) == p.doc.size


@given(lengths=lengths_st, length=st.integers(1, 300), seed=st.integers(0, 2**31), epoch=st.integers(0, 50))
@settings(max_examples=100, deadline=None)
def test_the_sequences_shuffle_is_a_permutation_of_whole_sequences(
    lengths: list[int], length: int, seed: int, epoch: int
) -> None:
    p = pack(np.array(lengths), length, "best-fit", 64)
    q = p.shuffled(seed, epoch)
    assert q.numbers is not None
    assert sorted(q.numbers.tolist()) == list(range(p.n_sequences))
    for new, old in enumerate(q.numbers):
        a, b = q.pieces(new, new + 1), p.pieces(int(old), int(old) + 1)
        assert q.doc[a].tolist() == p.doc[b].tolist()
        assert q.offset[a].tolist() == p.offset[b].tolist()
    _check_pieces(q, lengths, length)


def test_best_fit_in_large_groups_leaves_under_a_tenth_of_a_percent_of_padding() -> None:
    """The issue's bound on lognormal documents (median about 545), the default group of 65,536."""
    rng = np.random.default_rng(7)
    lengths = np.maximum(1, rng.lognormal(np.log(545), 1.0, 200_000).astype(np.int64))
    for length in (2048, 8192):
        p = pack(lengths, length, "best-fit", 65_536)
        assert p.padding / (p.n_sequences * length) < 0.001
        assert p.documents_cut == int((lengths > length).sum())


def test_an_epoch_packs_other_sequences_than_the_last_and_the_same_ones_again() -> None:
    lengths = np.random.default_rng(1).integers(1, 300, 5000)
    a, b = pack(lengths[::-1], 512, "best-fit", 1000), pack(lengths, 512, "best-fit", 1000)
    assert not np.array_equal(a.doc, b.doc)  # another epoch's document order: other sequences
    again = pack(lengths, 512, "best-fit", 1000).shuffled(3, 4)
    ours = b.shuffled(3, 4)
    for name in ("starts", "doc", "offset", "size"):
        assert np.array_equal(getattr(ours, name), getattr(again, name))
    assert not np.array_equal(ours.doc, b.shuffled(3, 5).doc)


segments_st = st.lists(st.lists(st.integers(1, 9), max_size=6), min_size=1, max_size=6)


@given(rows=segments_st, length=st.integers(1, 40))
def test_cu_seqlens_bound_each_segment_over_the_real_tokens_and_never_the_padding(
    rows: list[list[int]], length: int
) -> None:
    segments = np.zeros((len(rows), length), dtype=np.int32)
    tokens = (np.arange(segments.size).reshape(segments.shape) + 1000).astype(np.uint16)  # as stored
    expected = []
    for r, sizes in enumerate(rows):
        at = 0
        for i, size in enumerate(sizes):
            size = min(size, length - at)
            if size <= 0:
                break
            segments[r, at : at + size] = i + 1
            expected.append(size)
            at += size
    got = attention_inputs(tokens, segments)
    cu = got["cu_seqlens"]
    assert cu.dtype == np.int32
    assert cu[0] == 0
    assert np.diff(cu).tolist() == expected
    assert (np.diff(cu) > 0).all()
    assert cu[-1] == (segments > 0).sum() == got["indices"].size
    assert (segments.reshape(-1)[got["indices"]] > 0).all()
    labels = got["labels"]
    for r in range(segments.shape[0]):
        for j in range(length):
            same = j + 1 < length and segments[r, j] > 0 and segments[r, j + 1] == segments[r, j]
            assert labels[r, j] == (tokens[r, j + 1] if same else IGNORE)
    assert (got["loss_mask"] == (labels != IGNORE)).all()
    assert (got["token_mask"] == (segments > 0)).all()
    padded = attention_inputs(tokens, segments, pad_to=cu.size + 3)["cu_seqlens"]
    assert padded[: cu.size].tolist() == cu.tolist()
    assert (padded[cu.size :] == cu[-1]).all()


def test_attention_inputs_refuse_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="one \\(batch, length\\) shape"):
        attention_inputs(np.zeros((2, 4)), np.zeros((2, 5)))


# --- [packing] in the config: one line for each mistake, before any server is touched ------------------------

PACKED: dict[str, Any] = {
    "samples": {"keys": "SELECT id FROM docs", "query": "SELECT tokens FROM docs WHERE id = $1"},
    "fields": {"tokens": {"columns": ["tokens"], "dtype": "uint16", "max_length": 4096}},
    "packing": {"field": "tokens", "length": 2048},
    "batches": {"size": 8},
    "store": {"path": "store.zarr"},
}


def _with(section: str, key: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(PACKED)
    table = data
    for part in section.split("."):
        table = table.setdefault(part, {})
    table[key] = value
    return data


def test_a_packing_config_loads_with_its_defaults_and_keeps_every_sequence(cfg: Path) -> None:
    loaded = load(cfg, PACKED)
    assert loaded.packing == PackingConfig(field="tokens", length=2048)
    assert (loaded.packing.method, loaded.packing.eos, loaded.packing.pad) == ("best-fit", None, 0)
    assert loaded.batches.drop_last is False  # the last sequences are a short batch, not dropped documents
    assert loaded.content()["packing"]["length"] == 2048  # in the config's identity


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_with("packing", "field", "ids"), '[packing] field: expected the name of a [fields.NAME], got "ids"'),
        (
            _with("packing", "method", "first-fit"),
            '[packing] method: expected one of best-fit, concat; got "first-fit"',
        ),
        (_with("packing", "length", 0), "[packing] length: expected a positive integer, got 0"),
        (_with("packing", "eos", 70000), "[packing] eos: 70000 does not fit [fields.tokens] dtype uint16 (0..65535)"),
        (_with("packing", "pad", -1), "[packing] pad: -1 does not fit [fields.tokens] dtype uint16 (0..65535)"),
        (
            _with("packing", "stride", 1),
            '[packing]: unknown key "stride" (expected one of: field, length, method, eos, pad, group)',
        ),
        (
            _with("fields.tokens", "dtype", "float32"),
            '[packing] field = "tokens": token ids need an integer dtype, got float32',
        ),
        (
            _with("fields", "title", {"columns": ["title"], "dtype": "int32"}),
            "[packing]: a packed epoch holds token sequences only: remove [fields.title] (a sequence has no one row)",
        ),
        (
            _with("samples", "max_rows", 4),
            "[packing]: a document is one row: remove [samples] rows / max_rows",
        ),
    ],
    ids=["field", "method", "length", "eos", "pad", "unknown-key", "dtype", "another-field", "rows"],
)
def test_a_packing_mistake_is_one_line(cfg: Path, data: dict[str, Any], message: str) -> None:
    assert error(cfg, data).endswith(message)


def test_a_packed_field_without_max_length_is_told_to_give_one(cfg: Path) -> None:
    data = copy.deepcopy(PACKED)
    del data["fields"]["tokens"]["max_length"]
    assert error(cfg, data).endswith(
        '[packing] field = "tokens": documents have any length: give [fields.tokens] a max_length'
        " (the longest it takes)"
    )


def _tokenized(random: bool) -> dict[str, Any]:
    data = copy.deepcopy(PACKED)
    data["samples"]["query"] = "SELECT body FROM docs WHERE id = $1"
    data["transforms"] = {"tok": {"function": "prep:tok", "inputs": ["body"], "random": random}}
    data["fields"] = {"tokens": {"transform": "tok", "dtype": "uint16", "max_length": 4096}}
    return data


def test_a_random_transforms_output_is_not_packed_and_a_deterministic_ones_is(cfg: Path) -> None:
    assert error(cfg, _tokenized(True)).endswith(
        '[packing] field = "tokens": [transforms.tok] is random: an epoch is packed from its tokens\' lengths, '
        "known before it is written; pack a deterministic transform's output (it is cached)"
    )
    assert load(cfg, _tokenized(False)).packing == PackingConfig(field="tokens", length=2048)


def test_ray_refuses_an_epoch_packed_from_a_transform_in_one_line(cfg: Path) -> None:
    pytest.importorskip("ray")
    from pgprefetch.errors import ConfigError
    from pgprefetch.write.ray import ray_executor

    with pytest.raises(ConfigError, match="does not dump epochs packed from a transform's output yet"):
        ray_executor().check(load(cfg, _tokenized(False)))
    ray_executor().check(load(cfg, PACKED))  # a column of tokens packs on Ray
