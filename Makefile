# The two commands: `make run` (the wine pipeline on the embedded local stack) and `make test`.
# `make run SOURCE=rent.csv LABEL=rent` runs it on your table (served at /rent; APP= names it
# otherwise; TASK=classification predicts the label's classes); `CONF='{"num_trials": 8}'` sets any
# other Params; `RAY_CPUS=4 RAY_GPUS=0` sizes the local Ray head (default: what Ray detects).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONSTRAINTS := constraints.txt
CONF ?= {}
SOURCE ?=
LABEL ?=
TASK ?=
APP ?=
RAY_CPUS ?=
RAY_GPUS ?=

LOWEST ?= yes
# pytest-xdist workers for `make test` and its lowest-versions unit tests (0: one process): each its
# own Airflow home and 2-CPU Ray head, the modules that share a session fixture in one
# (tests/conftest.py). Two keep 2 cores busy: the suite takes about 900 s instead of about 1200 s.
TEST_WORKERS ?= 2

.PHONY: install run stop test test-unit test-lowest test-gpu clean

install: $(STAMP)

# Reinstall only when the project's dependencies or the tested versions change. Every package,
# pip and the build backend included, takes its version from constraints.txt (torch: the CPU wheel).
$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade -c $(CONSTRAINTS) pip
	$(BIN)/pip install --quiet -c $(CONSTRAINTS) --build-constraint $(CONSTRAINTS) -e ".[ml,dev,bench]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python scripts/stack.py up --ray-cpus '$(RAY_CPUS)' --ray-gpus '$(RAY_GPUS)'
	$(BIN)/python scripts/stack.py trigger --conf '$(CONF)' --source '$(SOURCE)' --label '$(LABEL)' --task '$(TASK)' --app '$(APP)'

stop:
	@if [ -x $(BIN)/python ]; then $(BIN)/python scripts/stack.py down; else echo "nothing to stop"; fi

# `make test LOWEST=no` leaves out the lowest-versions run below.
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup
	$(if $(filter yes,$(LOWEST)),$(MAKE) --no-print-directory test-lowest)

test-unit: $(STAMP)
	$(BIN)/python -m pytest -m "not integration"

# The lowest versions pyproject.toml allows, in a second venv: uv's lowest-direct resolution puts
# each direct dependency at its lower bound, every other package at its tested version
# (constraints.txt) but for what constraints-lowest.txt holds back; scripts/lowest_bounds.py writes
# those constraints and then checks that nothing raised a bound. It is an Airflow-only worker's
# venv, the runtime and the suite's runner (the `test` extra) without the `ml` extra, as the lowest
# Airflow (3.1.1) cannot share a venv with Ray Serve; its Ray clusters run on .venv's interpreter
# (RAYML_TEST_RAY_PYTHON), a separate environment as in a deployment. The unit tests and one real
# stage job (a preprocess run through dag.test(), marked `lowest`) run there, in one pytest run;
# the tests that need the `ml` extra skip, and those of the suite's own machinery (marked
# `harness`) do not depend on the package's bounds. Rebuilt only when a dependency file changes.
# Its bytecode is compiled at install, as pip does for .venv: uv does not by default, and where
# PYTHONDONTWRITEBYTECODE is set no process caches it, so each one compiled what it imported again.
LOWEST_VENV := .venv-lowest
LOWEST_STAMP := $(LOWEST_VENV)/.installed
LOWEST_CONSTRAINTS := constraints-lowest.txt

$(LOWEST_STAMP): pyproject.toml $(CONSTRAINTS) $(LOWEST_CONSTRAINTS) scripts/lowest_bounds.py | $(STAMP)
	rm -rf $(LOWEST_VENV)
	$(BIN)/uv venv --quiet --python $(PYTHON) $(LOWEST_VENV)
	$(BIN)/python scripts/lowest_bounds.py --constraints > $(LOWEST_VENV)/constraints-tested.txt
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(LOWEST_VENV)/bin/python --resolution lowest-direct \
		$$({ echo "$${PIP_FIND_LINKS:-}"; $(BIN)/pip config get global.find-links 2>/dev/null; } | xargs -r -n1 printf -- '--find-links=%s ') \
		-c $(LOWEST_VENV)/constraints-tested.txt -c $(LOWEST_CONSTRAINTS) -e ".[test]"
	$(LOWEST_VENV)/bin/python scripts/lowest_bounds.py
	touch $(LOWEST_STAMP)

test-lowest: $(LOWEST_STAMP)
	RAYML_TEST_RAY_PYTHON=$(abspath $(BIN))/python $(LOWEST_VENV)/bin/python -m pytest -p no:randomly -n $(TEST_WORKERS) --dist loadgroup -m "(not integration or lowest) and not harness"

# The GPU tests, on a machine with a CUDA GPU (`make test` skips them elsewhere). The rest of the
# suite pins its clusters to --num-gpus=0, so `make test` passes on a GPU machine as well.
# Where `make install` has not run (a GPU host), this installs only what they need, the runtime, the
# `ml` extra and pytest (the `test-gpu` extra), into a venv that sees the host's packages, at the
# tested versions less torch's CPU wheel: the host's CUDA build of torch stays.
GPU_STAMP := $(VENV)/.installed-gpu
GPU_CONSTRAINTS := $(VENV)/constraints-gpu.txt

$(GPU_STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PYTHON) -m venv --system-site-packages $(VENV)
	grep -v '^torch==' $(CONSTRAINTS) > $(GPU_CONSTRAINTS)
	$(BIN)/pip install --quiet -c $(GPU_CONSTRAINTS) -e ".[ml,test-gpu]"
	touch $(GPU_STAMP)

test-gpu: $(if $(wildcard $(STAMP)),$(STAMP),$(GPU_STAMP))
	@$(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else \
	'make test-gpu needs a CUDA GPU and a CUDA build of torch (this one is ' + torch.__version__ + '): ' \
	'see docs/deployment.md, GPU nodes and torch')"
	$(BIN)/python -m pytest -m gpu -v

clean: stop
	rm -rf .airflow .run artifacts
