# One entry point for newcomers and CI. Every target creates .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test test-cluster lint types check bench experiments clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)  ## Start the auction server with the embedded engine and an SQLite ledger
	$(BIN)/inference-auction serve

test: $(STAMP)  ## Run the test suite but the scale-out tests (PostgreSQL tests run when reachable)
	$(BIN)/python -m pytest -m "not cluster"

test-cluster: $(STAMP)  ## Run the scale-out tests: SMG in front of several auction servers
	$(BIN)/python -m pytest -m cluster

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

types: $(STAMP)
	$(BIN)/mypy

check: lint types test  ## Lint, type-check and test

bench: $(STAMP)  ## Benchmark the auction core against the naive oracle
	$(BIN)/python -m bench.auction_speed

experiments: $(STAMP)  ## Reproduce the paper's experiments (about 4 minutes on 2 cores)
	$(BIN)/inference-auction experiment all --out results

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
