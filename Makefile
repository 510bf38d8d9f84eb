# One entry point for newcomers and CI. Every target creates .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# What `make run` and `make demo` need: the server and the SDK, without the dev tool chain.
RUNTIME_STAMP := $(VENV)/.runtime
# The SDK's folder is its package (sdk/ is inference_auctions.sdk), which setuptools installs
# editable only through an import hook, with a note about the layout on every install; the
# note says nothing a newcomer can act on. (The checkout's own layout needs no hook.)
PIP_INSTALL := PYTHONWARNINGS="ignore:Editable installation" $(BIN)/python -m pip install --quiet

.PHONY: demo run run-sglang sglang-env test test-cluster test-deploy lint types check bench experiments clean

# `make test` leaves out the scale-out tests (SMG in front of several servers), the packaging
# tests (they build both wheels and install the SDK's alone), the tests against the real
# SGLang (its CPU environment takes minutes to build once) and the container image's (podman
# builds it in minutes); CI sets INFERENCE_AUCTION_FULL_SUITE=1, builds that environment first
# and runs everything but the image, which `make test-deploy` builds and runs where podman can.
ifeq ($(INFERENCE_AUCTION_FULL_SUITE),1)
TEST_SELECTION := -m "not deploy"
TEST_PREREQUISITES := sglang-env
else
TEST_SELECTION := -m "not cluster and not packaging and not sglang and not deploy"
TEST_PREREQUISITES :=
endif

$(STAMP): pyproject.toml sdk/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(PIP_INSTALL) -e ./sdk -e '.[dev,experiments]'
	touch $(STAMP)

$(RUNTIME_STAMP): pyproject.toml sdk/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(PIP_INSTALL) -e ./sdk -e .
	touch $(RUNTIME_STAMP)

demo: $(RUNTIME_STAMP)  ## Four users bid for one batch on a real server; then the dashboard
	$(BIN)/inference-auction demo

run: $(RUNTIME_STAMP)  ## Start the auction server with the embedded engine and an SQLite ledger
	$(BIN)/inference-auction serve

run-sglang: $(STAMP) sglang-env  ## The same in front of the real SGLang on this CPU (MODEL=dir: another model)
	$(BIN)/python -m bench.sglang_cpu.launcher $(if $(MODEL),--model $(MODEL))

sglang-env:  ## Build the real SGLang's CPU environment once (in ~/.cache/inference-auctions)
	bench/setup_sglang_reference.sh

test: $(STAMP) $(TEST_PREREQUISITES)  ## Run the test suite (PostgreSQL tests run when reachable); see TEST_SELECTION
	$(BIN)/python -m pytest $(TEST_SELECTION)

test-cluster: $(STAMP)  ## Run the scale-out tests: SMG in front of several auction servers
	$(BIN)/python -m pytest -m cluster

test-deploy: $(STAMP)  ## Build the container image with podman, run it, drain it (BASE_IMAGE=...)
	$(BIN)/python -m pytest -m deploy

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
