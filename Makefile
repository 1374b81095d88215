# Astraeus — `make help` lists the targets.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
WORKLOADS_STAMP := $(VENV)/.workloads
# Python keeps each module's compiled form (__pycache__) where a machine's environment says
# not to (PYTHONDONTWRITEBYTECODE, as on the CI machines): else every server, agent and CLI a
# test starts compiles the backend from source again, half a second of CPU each, and pytest
# rewrites every test module's assertions anew in each lane.
unexport PYTHONDONTWRITEBYTECODE

.DEFAULT_GOAL := help
.PHONY: help setup up serve test test-fast explore checks lint typecheck schema schema-check services bench load fleet proto clean \
  console console-test browser screenshots demo workloads slurm nftables

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-13s %s\n", $$1, $$2}'

PROTO   := proto/astraeus/agent/v1/agent.proto
PROTO_PY := gen/astraeus/agent/v1/agent_pb2.py

$(STAMP): pyproject.toml $(PROTO)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet 'grpcio-tools>=1.66'
	$(MAKE) --no-print-directory proto
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

proto: ## generate the agent protocol's Python code into gen/ (never edited by hand)
	rm -rf gen && mkdir -p gen
	$(BIN)/python -m grpc_tools.protoc -I proto --python_out=gen --grpc_python_out=gen \
	  --pyi_out=gen $(PROTO)
	touch gen/astraeus/__init__.py gen/astraeus/agent/__init__.py gen/astraeus/agent/v1/__init__.py

setup: $(STAMP) console ## create .venv, install Astraeus with its development tools, build the console

# The console (frontend/): npm packages from package-lock.json, then the bundle the server serves.
CONSOLE_STAMP := frontend/node_modules/.installed
CONSOLE_SOURCES := $(shell find frontend/src -type f 2>/dev/null) frontend/index.html \
  frontend/vite.config.ts frontend/tsconfig.json

$(CONSOLE_STAMP): frontend/package.json frontend/package-lock.json
	cd frontend && npm ci --no-audit --no-fund --loglevel=error
	touch $@

frontend/dist/index.html: $(CONSOLE_STAMP) $(CONSOLE_SOURCES)
	cd frontend && npm run --silent build

console: frontend/dist/index.html ## build the console into frontend/dist (type check, then Vite)

console-test: $(CONSOLE_STAMP) ## the console's component tests (Vitest, jsdom)
	cd frontend && npm test --silent

browser: ## install Debian's chromium for the console's browser tests when missing (needs root)
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends chromium; } || \
	  echo "browser: chromium is missing and this is not root: the browser tests will skip"; }

# The workloads' network rules (agent/network.py, issue 37): Debian's nftables, for the agent as
# root and its tests.
nftables: ## install Debian's nftables for the workloads' network rules when missing (needs root)
	@command -v nft >/dev/null || { [ "$$(id -u)" = 0 ] && \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends nftables; } || \
	  echo "nftables: nft is missing and this is not root: the network tests will skip"; }

# A one-node Slurm cluster for the Slurm tests (tests/support/slurm.py, issue 25): Debian's
# slurm-wlm, slurmdbd and munge; the cluster's accounting lives in this machine's MariaDB.
slurm: ## install Debian's Slurm (slurmctld, slurmd, slurmdbd) and munge for the Slurm tests when missing (needs root)
	@command -v slurmctld >/dev/null && command -v slurmdbd >/dev/null && command -v munged >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends slurm-wlm slurmdbd munge; } || \
	  echo "slurm: Slurm is missing and this is not root: the Slurm tests will skip"; }
screenshots: setup browser console ## retake docs/screenshots from `astraeus up --demo` after 6 minutes (MINUTES=6)
	$(BIN)/python scripts/screenshots.py --minutes $(or $(MINUTES),6)

up: setup ## run Astraeus embedded: SQLite in ~/.local/share/astraeus, prints the URL and token
	$(BIN)/astraeus up

demo: setup ## make up, and submit the example workloads (examples/): the console fills within minutes
	$(BIN)/astraeus up --demo

serve: setup ## run the API server only (set ASTRAEUS_DATABASE_URL; run `astraeus db upgrade` first)
	$(BIN)/astraeus serve

services: ## start PostgreSQL and Redis if they are down (this machine kind's commands)
	bash scripts/services.sh

lint: setup ## ruff: lint and format check; import-linter: the layer and domain contracts (pyproject.toml)
	$(BIN)/ruff check backend agent tests bench examples alembic/env.py
	$(BIN)/ruff format --check backend agent tests bench examples alembic/env.py
	$(BIN)/lint-imports --no-cache

typecheck: setup ## mypy over backend/ and agent/
	$(BIN)/mypy

schema: setup ## export the GraphQL SDL to schema.graphql
	$(BIN)/python -c "from backend.resolvers.root import sdl, SDL_PATH; SDL_PATH.write_text(sdl())"

schema-check: setup ## fail when schema.graphql is stale
	$(BIN)/python -c "from backend.resolvers.root import sdl, SDL_PATH; import sys; \
	sys.exit(0 if SDL_PATH.read_text() == sdl() else 'schema.graphql is stale: run make schema')"

# Test lanes (issue 22; tests/conftest.py marks each test unit, db, e2e or workloads). `make
# test` runs them all in TEST_LANES pytest-xdist processes: an e2e or workloads module at a time
# in one process (its live server starts once), the longest first, unit and db tests one at a
# time to whichever process is free. The suite waits on real processes more than it computes,
# so 2 cores keep more lanes than cores busy. `make test-fast` runs unit and db on SQLite only,
# with Hypothesis' quick profile, in FAST_LANES, its longest tests first (tests/conftest.py's
# LONGEST_FAST) and then one test at a time to whichever lane is free (--maxschedchunk 1:
# pytest-xdist's default chunks left one lane 12-14 s of queued tests after the others ended).
# Its tests compute more than they wait, and each lane first imports the backend and collects:
# 4 lanes began their first tests 23 s in, 3 lanes 11 s in (issue 39, 2026-12-04, beside
# another engineer's load of 5). `make test` in 8 lanes, not 6: its longest modules mostly wait
# (a stall timeout, minutes of ticks, a server away, Slurm's daemons) and start first; with 6
# lanes the cores idled up to 40% of the run's third to seventh minutes (the summary's "cpu by
# minute"), and 8 filled them (2026-12-05: make test 714 s, cores 94% busy). Its heavier load
# found a real ledger bug on its second run (a pass dated before the run it placed:
# tests/scheduling/test_pass_time.py), fixed. 10, not 8, since the suite grew by the idle,
# checkpoint and workdir live modules, which wait minutes too: with 8 the cores were 81, 66, 68
# and 83% busy in minutes 3, 4, 6 and 7, with 10 they were 93-96% (a fresh clone's make test
# 787 s with 8 lanes, 648 s with 10 and the lanes reading one collection's compiled modules).
TEST_LANES ?= 10
FAST_LANES ?= 3

$(WORKLOADS_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,workloads]'
	touch $(WORKLOADS_STAMP)

workloads: $(WORKLOADS_STAMP) ## PyTorch (CPU) for the real distributed-training tests (tests/workloads/)

checks: lint typecheck schema-check console-test ## the static checks: ruff, import contracts, mypy, schema drift, the console's tests

# The checks run beside the tests (they compute while the tests mostly wait on processes), their
# output kept and printed after; either failing fails `make test`. They are started as `make`,
# not `$(MAKE)`: a recipe line naming $(MAKE) runs even under `make -n`, and with it the suite.
# Before the lanes start, one collection alone compiles the backend and writes pytest's rewritten
# test modules to __pycache__, which every lane then reads: on a fresh clone the lanes, begun
# together, each compiled and rewrote all 546 modules themselves, 12 CPU-s a lane where a lane
# that finds them written takes 4 (issue 39).
test: setup workloads services browser slurm nftables ## every check and every test, SQLite and PostgreSQL, and the console's
	@started=$$(date +%s); log=$$(mktemp); \
	  make --no-print-directory checks > $$log 2>&1 & checks=$$!; \
	  $(BIN)/pytest --collect-only -q > /dev/null 2>&1; \
	  ASTRAEUS_HYPOTHESIS=thorough $(BIN)/pytest -n $(TEST_LANES) --dist loadgroup \
	    --no-loadscope-reorder --durations=30; tests=$$?; \
	  wait $$checks; passed=$$?; cat $$log; rm -f $$log; \
	  echo "test: checks $$([ $$passed = 0 ] && echo passed || echo FAILED), tests $$([ $$tests = 0 ] && echo passed || echo FAILED), in $$(( $$(date +%s) - started ))s"; \
	  [ $$passed = 0 ] && [ $$tests = 0 ]

test-fast: setup ## unit and db tests on SQLite, quick property tests (no processes, no training)
	ASTRAEUS_TEST_DATABASES=sqlite ASTRAEUS_HYPOTHESIS=quick $(BIN)/pytest -x -q \
	  -n $(FAST_LANES) --maxschedchunk 1 -m 'unit or db'

explore: setup services ## property tests only, each with 10 times its examples drawn at random (make test draws the same ones every run): what fails becomes an @example
	ASTRAEUS_HYPOTHESIS=explore $(BIN)/pytest -q -n $(TEST_LANES) --dist loadgroup -m 'unit or db'

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) gen .pytest_cache .mypy_cache .ruff_cache

BENCH_ARGS ?=
bench: setup services browser ## every benchmark (bench/) beside its bare baseline; the table in bench/RESULTS.md (BENCH_ARGS="--scale 1m": also the million-worker tick)
	$(BIN)/python -m bench.run_all $(BENCH_ARGS)

LOAD_ARGS ?= --agents 20 --runs 100
load: setup services ## the production topology on loopback under load, simulated agents (bench/load.py; LOAD_ARGS)
	$(BIN)/python -m bench.load $(LOAD_ARGS)

FLEET_ARGS ?= --machines 100 300 1000
fleet: setup services ## one serve held against many simulated machines (bench/fleet.py; FLEET_ARGS)
	$(BIN)/python -m bench.fleet $(FLEET_ARGS)
