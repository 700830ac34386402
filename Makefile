# Everything runs from the project's own virtualenv in .venv; `make run` and `make test` build it when missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
CONFIG ?= configs/demo.yaml
HOST   ?= 127.0.0.1
PYTEST_ARGS ?=

.PHONY: setup lock run test test-slow test-all test-integration test-browser test-bench bench lint audit servers serve-model stop clean help

help:
	@echo "make setup | run | lint | test | test-slow | test-integration | test-browser | test-bench | bench | servers | serve-model | stop | audit | clean"

setup: $(STAMP)

# Torch by choice: TORCH=cpu (default) installs the CPU build (`pip show torch`: 2.13.0+cpu; no CUDA libraries),
# from a local wheel where the machine has one, else from PyTorch's CPU index; TORCH=cuda installs PyPI's default
# build, which on Linux carries CUDA (several GB). Everything else is pinned by constraints.txt (make lock).
TORCH ?= cpu
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@case "$(TORCH)" in \
	  cpu) $(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)+cpu" 2>/dev/null \
	       || $(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)+cpu" --extra-index-url $(TORCH_CPU_INDEX) ;; \
	  cuda) $(BIN)/python -m pip install -q "torch==$(TORCH_VERSION)" ;; \
	  *) echo "error: TORCH=$(TORCH) is not a torch build"; echo "hint: make setup TORCH=cpu (default) or TORCH=cuda"; \
	     exit 2 ;; \
	esac
	$(BIN)/python -m pip install -q -e ".[test,external,attribution,gdrive]" -c constraints.txt   # every extra: CI tests them
	$(BIN)/python -m pip install -q --no-deps torch-ttt==0.0.2   # reference engine, tests and benches only
	$(BIN)/python -m pip check
	@touch $(STAMP)

# constraints.txt from the current .venv (after changing pyproject.toml and passing make test-all)
lock: setup
	@{ sed -n '1,3p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable \
		| grep -v -i -E '^(torch|torch-ttt)=='; } > constraints.txt.tmp && mv constraints.txt.tmp constraints.txt

RUN_ARGS ?=
run: setup
	$(BIN)/ttt-pipeline run --config $(CONFIG) $(RUN_ARGS)

# Unit tests and smoke runs (offline, seconds each; <= 10 min on 2 cores): what a developer runs on every change.
# The end-to-end runs (the demo preset, crash and stop safety, the benches' quick modes) carry the `slow` marker:
# `make test-slow`, which CI runs once after it. CI also runs test-integration and test-browser.
# The benches' smoke runs in test-slow train a tiny random BERT (TTT_BENCH_MODEL, bench/common.py); the few checks
# that need the real MiniLM encoder carry the `bench` marker: `make test-bench` (minutes each; CI does not run them).
# make test and make test-slow run two test files at a time (pytest-xdist, one file per worker), each worker and the
# processes it starts on its own share of the cores (TTT_TEST_PIN_WORKERS, tests/workers.py), so torch's threads do
# not oversubscribe them; unpinned workers each took every core and ran slower than one file at a time.
# TEST_WORKERS=0 / SLOW_WORKERS=0: one at a time, in this process (for --pdb).
PINNED_PYTEST = TTT_TEST_PIN_WORKERS=1 $(BIN)/python -m pytest -q --dist loadfile
TEST_WORKERS ?= 2
SLOW_WORKERS ?= 2
test: setup
	$(PINNED_PYTEST) -n $(TEST_WORKERS) -m "not slow and not integration and not browser and not bench" $(PYTEST_ARGS)

test-slow: setup
	$(PINNED_PYTEST) -n $(SLOW_WORKERS) -m "slow and not integration and not browser and not bench" $(PYTEST_ARGS)

test-bench: setup
	$(BIN)/python -m pytest -q -m bench $(PYTEST_ARGS)

test-all: test test-slow test-integration test-browser test-bench

# ruff (rules in pyproject.toml), the import contracts (import-linter: the layers of docs/architecture.md),
# functions that fit on a screen (<= 80 lines) in the library, the tasks, the flows, the CLI and the benches, and
# reports that name no defense (scoring, robustness, plots read labels and headline keys from the registry).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/python scripts/function_length.py ttt_pipeline bench --max 80
	$(BIN)/python scripts/defense_names.py

# Two test files at a time (pytest-xdist, one file per worker: a file's servers and module fixtures stay in one
# process): the tier waits on servers, pip and subprocesses more than it computes, so two files overlap their waits.
# INTEGRATION_WORKERS=0 runs them in this process, one after another.
INTEGRATION_WORKERS ?= 2
test-integration: setup
	$(BIN)/python -m pytest -q -m integration -n $(INTEGRATION_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-browser: setup
	$(BIN)/python -m pytest -q -m browser $(PYTEST_ARGS)

bench: setup
	$(BIN)/python -m bench.corruption_speed
	$(BIN)/python -m bench.ttt_engine --json
	$(BIN)/python -m bench.accuracy --json

# Known vulnerabilities of the installed packages (pip-audit: PyPI JSON API + PyPA advisories). Prints the
# findings and a verdict line; an unreachable advisory service says INCOMPLETE and never fails the build.
# Triage: docs/security.md (accepted findings go into AUDIT_FLAGS as --ignore-vuln ID). AUDIT_STRICT=1 fails
# the target on findings.
AUDIT_FLAGS ?=
AUDIT_STRICT ?= 0
audit: setup
	@log=$$(mktemp); rc=0; \
	timeout 300 $(BIN)/python -m pip_audit --skip-editable --progress-spinner off --desc on $(AUDIT_FLAGS) \
		>$$log 2>&1 || rc=$$?; \
	grep -vE '^(Traceback|  File |    )' $$log | tail -n 300; \
	skipped=$$(grep -c 'could not be audited' $$log || true); \
	if grep -qE 'Found [0-9]+ known vulnerabilit' $$log; then \
		echo "audit: FINDINGS above; triage them in docs/security.md"; \
	elif [ $$rc -ne 0 ]; then \
		echo "audit: INCOMPLETE: pip-audit exited $$rc (advisory service unreachable?); nothing was checked"; rc=0; \
	elif [ "$$skipped" -gt 0 ]; then \
		echo "audit: INCOMPLETE: $$skipped packages could not be audited (no PyPI JSON API on this network)"; \
	else echo "audit: no known vulnerabilities"; fi; \
	rm -f $$log; \
	if [ "$(AUDIT_STRICT)" = 1 ]; then exit $$rc; fi

# The Prefect and MLflow servers and a worker per pool, on 127.0.0.1 (scripts/serve.sh; `make stop` stops them).
# Serving a model is `make serve-model` and `ttt-pipeline serve`.
servers: setup
	@bash scripts/serve.sh start

# The registered champion of a task as a REST endpoint on 127.0.0.1 (mlflow models serve, a foreground process):
# make serve-model [MODEL=ttt-<task>-<labels>] [PORT=5001]; tracking URI: TTT_TRACKING_URI, MLFLOW_TRACKING_URI
# (`source .run/env` after make servers) or sqlite:///mlflow.db. scripts/serve_model.sh says more.
MODEL ?= ttt-demo-reviews-negative-positive
PORT ?= 5001
serve-model: setup
	@TTT_SERVE_MODEL=$(MODEL) TTT_SERVE_PORT=$(PORT) bash scripts/serve_model.sh

stop:
	@bash scripts/serve.sh stop

clean:
	rm -rf .cache .pytest_cache .hypothesis mlflow.db test-output
	find mlruns -mindepth 1 ! -name .gitkeep -exec rm -rf {} + 2>/dev/null || true
