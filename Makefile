# Two commands do all set-up on a fresh machine (see README):
#   make run    plan the bundled example workloads (V100 profile), then run the whole stack
#               locally for 40 s: controller, agent, real Triton on the demo models, load
#   make test   import contracts, ruff (lint + format check), mypy, then the whole test suite
#               (unit, property, integration), printing the 15 slowest tests
#   make test-fast  the pure and in-process tests only (about a minute): no Triton, S3, gRPC servers,
#               subprocesses, long simulations or heavy property searches (markers in pyproject.toml)
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test test-fast tools bench schema cpu-profile clean

# The venv is rebuilt whenever the dependency lists change.
$(BIN)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $@

run: $(BIN)/.installed
	$(BIN)/stoke plan
	$(BIN)/stoke up --seconds 40

# System tools the integration tests need (promtool from Debian's prometheus package; headless chromium,
# Debian's chromium package, which loads `stoke report`'s HTML in tests/stoke/commands/test_report_cli.py).
tools:
	@command -v promtool >/dev/null 2>&1 || { \
	  echo "installing promtool (Debian package prometheus)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null) \
	  || echo "warning: could not install promtool; promtool tests will be skipped"; }
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium (Debian package chromium, headless browser for the report test)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "warning: could not install chromium; the report's browser test will be skipped"; }

test: $(BIN)/.installed tools
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q --durations=15

test-fast: $(BIN)/.installed
	$(BIN)/python -m pytest -q -m "not slow and not triton and not s3 and not e2e and not promtool and not chaos"

bench: $(BIN)/.installed
	for f in benchmarks/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

# The JSON Schemas of the controller config and of workload files, generated from their classes
# (controller/config.py, planner/workload_file.py), and the StokeWorkload CRD from the workload file's
# declarations (deploy/data/stokeworkloads.crd.yaml).
schema: $(BIN)/.installed
	$(BIN)/python -m controller.config
	$(BIN)/python -m planner.workload_file
	$(BIN)/python -m deploy.crd

# The bundled CPU profile that `stoke up` plans with, measured on this machine: `stoke profile run` on Triton 2.51
# on CPU (every batch x whole-core share, a co-location point per model, and each model's serving path through
# the agent's router), then `stoke profile fit` (which refuses a fit that fails its checks). profile run resumes
# the measurements file: delete it to measure everything afresh, or drop its "serving_p99_ms" (or
# "beyond_sli_p99_ms") to measure only the serving path again. The profile drives `stoke up`, whose agent
# reads the SLI every second: the serving path is split with 1 s windows.
CPU_MEASUREMENTS := interference/data/cpu-2core-measurements.json
cpu-profile: $(BIN)/.installed
	$(BIN)/stoke profile run --sli-window 1 -o $(CPU_MEASUREMENTS)
	$(BIN)/stoke profile fit $(CPU_MEASUREMENTS) -o interference/data/cpu-2core-profile.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
