# pipeplan: `make test` and `make serve` do all set-up on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test lint bench venv clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned: any other spec pulls gigabytes of CUDA wheels (DEVELOPERS.md)
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest tests

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python benchmarks/simulate_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
