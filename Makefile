# Everything runs from the project's own virtualenv in .venv; `make run` and `make test` build it when missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CONFIG ?= configs/demo.yaml
HOST   ?= 127.0.0.1
PYTEST_ARGS ?=

.PHONY: setup run test test-fast test-integration test-browser bench lint audit serve stop clean help

help:
	@echo "make setup | run | test | test-fast | test-integration | test-browser | bench | serve | stop | audit | clean"

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0          # the CPU wheel first: a newer torch pulls CUDA
	$(BIN)/python -m pip install -q -e ".[test]"
	$(BIN)/python -m pip install -q --no-deps torch-ttt==0.0.2   # reference engine, tests and benches only
	$(BIN)/python -m pip check
	@touch $(STAMP)

run: setup
	$(BIN)/ttt-pipeline run --config $(CONFIG)

# The whole suite, as CI runs it: unit, end-to-end, integration (real servers) and browser tests.
test: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow and not integration and not browser" $(PYTEST_ARGS)

test-integration: setup
	$(BIN)/python -m pytest -q -m integration $(PYTEST_ARGS)

test-browser: setup
	$(BIN)/python -m pytest -q -m browser $(PYTEST_ARGS)

bench: setup
	$(BIN)/python bench/corruption_speed.py
	$(BIN)/python bench/ttt_engine.py --json
	$(BIN)/python bench/accuracy.py --json

audit: setup
	$(BIN)/python -m pip_audit --skip-editable --progress-spinner off || true

serve: setup
	@bash scripts/serve.sh start

stop:
	@bash scripts/serve.sh stop

clean:
	rm -rf .cache .pytest_cache .hypothesis mlflow.db test-output
	find mlruns -mindepth 1 ! -name .gitkeep -exec rm -rf {} + 2>/dev/null || true
