"""The mixing bench: a mixed epoch against the same samples dumped unmixed, both modes (issue #40).

Target: mixing costs at most 5% over the unmixed dump. Two tables of ``ROWS`` rows each (``id``, a
``real[16]`` embedding and an ``int`` label, as the rows dataset has) are the sources, weights 1:1, and
``[mix] samples`` is both tables' rows; the unmixed epoch is one source over a table holding both tables'
rows (the same samples, one query or one scan). Each dump is a whole ``pgprefetch dump --json`` process;
each round runs the four once, the order reversed every other round; a case's seconds are the median of
its rounds' own reported seconds (no interpreter start-up), and the verdict is on the median of the
rounds' mixed / unmixed ratios (each pair ran back to back, so a host's drift weighs on both alike).
Run: ``python -m bench.mixing [--quick]``; ``--results bench/RESULTS.md`` splices the section into it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.harness.db import execute

from . import log
from .postgres import database, server
from .report import splice_into

ROWS, QUICK_ROWS = 600_000, 20_000
ROUNDS = 7
TARGET = 1.05
BEGIN, END = "<!-- mixing bench: begin -->", "<!-- mixing bench: end -->"
PGPREFETCH = Path(sys.executable).parent / "pgprefetch"

FIELDS = """
[fields.emb]
columns = ["emb"]
dtype = "float32"

[fields.label]
columns = ["label"]
dtype = "int64"

[batches]
size = 1024
seed = 0
"""


def _tables(rows: int) -> list[str]:
    make = (
        "CREATE TABLE {t} (id int PRIMARY KEY, emb real[] NOT NULL, label int NOT NULL);"
        "INSERT INTO {t} SELECT i, ARRAY(SELECT (i * 7 + j) % 101 / 10.0 FROM generate_series(1, 16) j)::real[], "
        "i % 10 FROM generate_series({lo}, {hi}) i"
    )
    return [
        make.format(t="mix_a", lo=1, hi=rows),
        make.format(t="mix_b", lo=rows + 1, hi=2 * rows),
        "CREATE TABLE mix_ab AS SELECT * FROM mix_a UNION ALL SELECT * FROM mix_b",
        "ALTER TABLE mix_ab ADD PRIMARY KEY (id)",
        "VACUUM ANALYZE",
    ]


def _source(table: str, mode: str) -> str:
    if mode == "query":
        return f'keys = "SELECT id FROM {table}"\nquery = "SELECT emb, label FROM {table} WHERE id = $1"\n'
    return f'table = "{table}"\nkey = "id"\n'


def configs(folder: Path, rows: int) -> dict[str, Path]:
    """The four configs: each mode mixed and unmixed."""
    out = {}
    for mode in ("query", "scan"):
        mixed = (
            "[source]\nconnections = 8\n"
            f"[samples.a]\n{_source('mix_a', mode)}[samples.b]\n{_source('mix_b', mode)}"
            f'[mix]\nsamples = {2 * rows}\n{FIELDS}[store]\npath = "{folder / f"{mode}-mixed.zarr"}"\n'
        )
        alone = (
            f"[source]\nconnections = 8\n[samples]\n{_source('mix_ab', mode)}{FIELDS}"
            f'[store]\npath = "{folder / f"{mode}-unmixed.zarr"}"\n'
        )
        for name, text in ((f"{mode} mixed", mixed), (f"{mode} unmixed", alone)):
            path = folder / (name.replace(" ", "-") + ".toml")
            path.write_text(text)
            out[name] = path
    return out


def dump_seconds(config: Path, dsn: str) -> tuple[float, int]:
    """One dump of epoch 0 as a process: the seconds it reports, and its samples."""
    argv = [str(PGPREFETCH), "dump", "--config", str(config), "--epoch", "0", "--force", "--json", "--dsn", dsn]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{config.name}: {done.stdout}{done.stderr}")
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    return float(summary["seconds"]), int(summary["n_samples"])


def run(dsn: str, rows: int, rounds: int = ROUNDS) -> dict[str, list[float]]:
    """Each case's reported seconds, a run per round."""
    execute(dsn, *_tables(rows))
    with tempfile.TemporaryDirectory(prefix="pgpf-mix-") as tmp:
        cases = configs(Path(tmp), rows)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for r in range(rounds):
            order = list(cases) if r % 2 == 0 else list(reversed(cases))
            for name in order:
                seconds, samples = dump_seconds(cases[name], dsn)
                assert samples == 2 * rows - 2 * rows % 1024, (name, samples)  # whole batches, both ways
                times[name].append(seconds)
                log(f"  mixing: {name} round {r}: {seconds:.2f} s")
    return times


def render(times: dict[str, list[float]], rows: int) -> str:
    """The section of RESULTS.md."""
    rounds = len(next(iter(times.values())))
    lines = [
        BEGIN,
        "## Mixing (issue #40)",
        "",
        f"Two tables of {rows:,} rows (`real[16]` + `int`), mixed 1:1 into an epoch of {2 * rows:,} samples in "
        f"batches of 1,024, against one source over a table of both (the same samples); medians of {rounds} "
        "rounds of the dump's own seconds. Target: mixed / unmixed <= 1.05.",
        "",
        "| mode | unmixed | mixed | mixed / unmixed (median of the rounds' ratios) |",
        "|---|--:|--:|--:|",
    ]
    for mode in ("query", "scan"):
        a, b = statistics.median(times[f"{mode} unmixed"]), statistics.median(times[f"{mode} mixed"])
        # each round's pair ran back to back: the median of their ratios is what drift on a shared host spares
        ratio = statistics.median(m / u for m, u in zip(times[f"{mode} mixed"], times[f"{mode} unmixed"], strict=True))
        verdict = "met" if ratio <= TARGET else "not met"
        lines.append(f"| {mode} | {a:.2f} s | {b:.2f} s | {ratio:.3f}x ({verdict}) |")
    lines.append(END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.mixing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ROWS:,} rows a table, one round")
    parser.add_argument("--results", type=Path, help="splice the section into this RESULTS.md")
    args = parser.parse_args(argv)
    rows = QUICK_ROWS if args.quick else ROWS
    with server() as admin, database(admin) as dsn:
        times = run(dsn, rows, 1 if args.quick else ROUNDS)
    section = render(times, rows)
    print(section)
    if args.results:
        splice_into(args.results, section, BEGIN, END)


if __name__ == "__main__":
    main()
