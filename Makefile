# pipeplan: `make test` and `make serve` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-quick lint bench venv clean serve

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned: any other spec pulls gigabytes of CUDA wheels (DEVELOPERS.md). torchtitan and DeepSpeed
# (their config loaders check the exports: tests/test_export_torchtitan.py, tests/test_export_deepspeed.py)
# without their dependencies, so that they cannot replace torch; the small pure ones their config loaders
# import are in the dev extras (tyro; psutil, hjson, py-cpuinfo, msgpack, einops). DeepSpeed is an sdist: built
# against the installed torch (--no-build-isolation), no CUDA ops.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps torchtitan==0.2.2
	DS_BUILD_OPS=0 $(BIN)/pip install -q --no-deps --no-build-isolation deepspeed==0.19.8
	touch $(STAMP)

venv: $(STAMP)

# under CI, PostgreSQL is installed and started (.ci/postgres.sh) so the database/API tests run on it too,
# Debian's Chromium is installed for the browser tests (.ci/chromium.sh), and Slurm (.ci/slurm.sh: two
# slurmd "nodes" on this machine) for the Slurm launcher's end-to-end tests
# the suite runs on TEST_WORKERS pytest-xdist workers (-n; 0: in this process), one test file per worker at a
# time (--dist loadfile: a module's fixtures -- seeded servers, multi-process reference runs -- are made once);
# each worker has its own PostgreSQL database (tests/conftest.py), temp dirs and free ports
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/ruff check .
	if [ -n "$$CI" ]; then bash .ci/chromium.sh; fi
	if [ -n "$$CI" ] && [ -z "$$PIPEPLAN_TEST_POSTGRES_URL" ]; then \
	  PIPEPLAN_TEST_POSTGRES_URL=$$(bash .ci/postgres.sh) || exit 1; export PIPEPLAN_TEST_POSTGRES_URL; fi; \
	if [ -n "$$CI" ] && [ -z "$$PIPEPLAN_TEST_SLURM" ]; then \
	  PIPEPLAN_TEST_SLURM=$$(bash .ci/slurm.sh) || exit 1; export PIPEPLAN_TEST_SLURM; fi; \
	$(BIN)/python -m pytest tests --durations=20 -n $(TEST_WORKERS) --dist loadfile

# the quick subset for development: everything not marked slow (README, Tests)
test-quick: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest tests -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/simulate_bench.py

# the API on 127.0.0.1:8000 (SQLite under data/) with one local CPU agent; dev tokens unless set;
# another port: make serve PORT=8123
PORT ?= 8000
PIPEPLAN_ADMIN_TOKEN ?= dev-admin-token
PIPEPLAN_WORKER_TOKEN ?= dev-worker-token
PIPEPLAN_OPEN_READS ?= 1
# one command: it checks that the port is free before it upgrades and seeds the database (a minute on a
# first start), and fails at once naming the port otherwise
serve: $(STAMP)
	@echo "admin token: $(PIPEPLAN_ADMIN_TOKEN)  worker token: $(PIPEPLAN_WORKER_TOKEN)"
	PIPEPLAN_ADMIN_TOKEN=$(PIPEPLAN_ADMIN_TOKEN) PIPEPLAN_WORKER_TOKEN=$(PIPEPLAN_WORKER_TOKEN) \
	PIPEPLAN_OPEN_READS=$(PIPEPLAN_OPEN_READS) $(BIN)/python -m pipeplan.cli serve --upgrade --seed \
	  --host 127.0.0.1 --port $(PORT) --agent

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
