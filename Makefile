# pgprefetch: `make demo` and `make test` work on a fresh machine with only Python (>= 3.11).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The CPU wheel of torch 2.13.0 lies on local disk here; a bare `torch` would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: install test test-fast demo lint format docs bench bench-peers chaos soak clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e '.[torch,jax,ray,demo,tokenizers,dev]'
	touch $(STAMP)

# The suite over every core (pytest-xdist), 2 workers a core: the tests wait on servers and processes about
# 40% of the time (2 cores: 2 workers 7:14, 3 workers 6:32, 4 workers 6:03). Long rounds are marked and left
# out here: make chaos, make soak.
WORKERS ?= $(shell $(PYTHON) -c "import os; print(min(12, 2 * (os.cpu_count() or 1)))")
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS)

# The tests that need no server (no PostgreSQL, S3 or Ray: the marker `server`, tests/conftest.py): the config,
# the shuffle, the mix's plan, the store's metadata, messages; for a quick loop while editing.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n $(WORKERS) -m 'not server and not chaos and not scale and not soak'

demo: $(STAMP)
	$(BIN)/pgprefetch demo
	$(BIN)/python examples/train.py --config configs/demo.toml --epochs 0 --steps 30

# The import direction too (README.md, "Code map"): the contracts in pyproject.toml, run by import-linter.
# And the types: mypy --strict over pgprefetch/ ([tool.mypy] in pyproject.toml; tests/ are typed loosely).
# The complexity gate: no function above radon's grade C (cyclomatic complexity 20), split by what it does.
lint: $(STAMP)
	$(BIN)/xenon --max-absolute C pgprefetch
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# The documentation site from docs/ (MkDocs); --strict: a broken link or page fails it. The suite builds it too.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The Ray executor's overhead on this host, both modes (bench/scale.py; 1, 2, 4, 8 workers on a large host),
# mixing two sources against the same samples unmixed (bench/mixing.py), and the dump's peak RSS and time under
# --memory 32, 64 and 256 MiB against in memory (bench/memory.py, about 10 minutes): sections of bench/RESULTS.md.
# Packing (bench/packing.py: padding beside OLMo-core's best-fit, the plan of 10M lengths, tokens/s).
# Windows stored as starts against the batches layout (bench/windowstarts.py: dump, bytes, readers warm and cold).
# The transforms bench (bench/transforms.py) sets Hugging Face datasets beside the dump: it and what it reads
# the table with (SQLAlchemy, psycopg2) are the `bench` extra, installed here only, not by `make install`.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[torch,jax,ray,demo,tokenizers,dev,bench]'
	touch $(BENCH_STAMP)

bench: $(STAMP) $(BENCH_STAMP)
	$(BIN)/python -m bench
	$(BIN)/python -m bench.scale --workers 1,2 --samples 100000
	$(BIN)/python -m bench.mixing --results bench/RESULTS.md
	$(BIN)/python -m bench.transforms --results bench/RESULTS.md
	$(BIN)/python -m bench.packing --results bench/RESULTS.md
	$(BIN)/python -m bench.memory --results bench/RESULTS.md
	$(BIN)/python -m bench.windowstarts --results bench/RESULTS.md

# The reader beside MosaicML Streaming and LitData on the same epoch (bench/peers.py, report in bench/PEERS.md),
# in a venv of its own: Streaming pins numpy < 2.2, which .venv need not agree with. The peers and their runtime
# deps are pinned exactly and installed without the resolver (bench/peers-requirements.txt says why);
# pgprefetch goes in from this tree, its deps held to those pins. PEERS_ARGS: e.g. --epoch-mb 64.
PEERS_VENV  ?= .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed
PEERS_ARGS  ?=
# bench.handwritten (scan mode against ADBC and ConnectorX scripts; report in bench/HANDWRITTEN.md and a section
# of bench/RESULTS.md), on a cold and a warm server it starts (bench/tuned.py), each over its socket and TCP.
# A quick run: HANDWRITTEN_ARGS="--rows 200000 --big-rows 0 --runs 1 --servers warm".
HANDWRITTEN_ARGS ?= --results bench/RESULTS.md --big-memory 4GiB

$(PEERS_STAMP): pyproject.toml bench/peers-requirements.txt
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet "$(TORCH)"
	$(PEERS_VENV)/bin/python -m pip install --quiet --no-deps -r bench/peers-requirements.txt
	$(PEERS_VENV)/bin/python -m pip install --quiet -e . -c bench/peers-requirements.txt
	touch $(PEERS_STAMP)

bench-peers: $(PEERS_STAMP)
	$(PEERS_VENV)/bin/python -m bench.peers $(PEERS_ARGS)
	$(PEERS_VENV)/bin/python -m bench.handwritten $(HANDWRITTEN_ARGS)

# The fault suite at length: 200 faulted dumps (make test runs 10), and the rounds marked chaos or scale that make
# test leaves out: the 810k-row epoch killed three times, ten times; Ray's killed workers and nodes; 2M keys beyond memory.
chaos: $(STAMP)
	$(BIN)/python -m pytest -q -s -m 'chaos or scale'
	PGPREFETCH_CHAOS_RUNS=200 $(BIN)/python -m pytest -q -s tests/test_chaos.py

# The soak (tests/soak, docs/soak.md): cron dumping ahead every second or two while two training ranks
# read, faults on a schedule, a local store then an S3 one (moto); about 15 minutes. Prints each store's summary
# and the path of its timeline picture (soak-report/<store>/timeline.png). SOAK_ARGS: e.g. --seed 7 --stores s3.
SOAK_ARGS ?=
soak: $(STAMP)
	$(BIN)/python -m pytest -q -s -m soak tests/test_soak.py
	$(BIN)/python -m tests.soak --out soak-report $(SOAK_ARGS)

clean:
	rm -rf $(VENV) soak-report .pgprefetch prefetch .site .pytest_cache .ruff_cache .mypy_cache *.egg-info
