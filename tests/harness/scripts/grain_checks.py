"""The Grain checks of test_grain.py that need Grain's worker processes, each run as a plain script.

Usage: grain_checks.py STORE WORKERS [--steps K --state FILE] [--resume FILE]. Prints one JSON object: the
sample values of each batch the loader yielded. With ``--steps``, stops after K batches and writes Grain's
iterator state to FILE; with ``--resume``, a fresh loader takes that state and runs to the end. Grain's
workers read absl flags, which a plain script has not parsed: ``FLAGS.mark_as_parsed()`` (README).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import grain
from absl import flags

from pgprefetch.grain import EpochSource


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("store")
    parser.add_argument("workers", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--state", type=Path)
    parser.add_argument("--resume", type=Path)
    args = parser.parse_args()
    flags.FLAGS.mark_as_parsed()
    source = EpochSource(args.store, 0, consumer=None)
    sampler = grain.samplers.IndexSampler(len(source), shuffle=False, num_epochs=1)
    loader = grain.DataLoader(data_source=source, sampler=sampler, worker_count=args.workers)
    it = iter(loader)
    if args.resume:
        it.set_state(args.resume.read_bytes())
    got = []
    for batch in it:
        got.append(batch["v"].tolist())
        if args.steps and len(got) == args.steps:
            args.state.write_bytes(it.get_state())
            break
    print(json.dumps({"got": got}))


if __name__ == "__main__":
    main()
