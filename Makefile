# tide's two entry points. `make demo` installs tide and runs its main job, `tide simulate`,
# on the built-in default; `make test` installs what the tests need and runs the whole suite (CI runs it).
#
# Python environment: the one that is active (VIRTUAL_ENV set), else the project's own .venv,
# created on first use with python3 -m venv. Every command below runs that environment's
# python3 and tools, never the system's: Debian's /usr/bin/python3 refuses `pip install`
# (externally-managed-environment, PEP 668).
BOOTSTRAP_PYTHON ?= python3
ifdef VIRTUAL_ENV
VENV := $(VIRTUAL_ENV)
else
VENV := .venv
endif
BIN := $(VENV)/bin
PYTHON := $(BIN)/python3
PIP := $(PYTHON) -m pip
# torch is pinned exactly (tests and the example image are made for this release). From PyPI on
# Linux x86-64 this is the CUDA 13.0 build: about 4.7 GB with its nvidia-* wheels, though the
# tests use only its CPU side.
TORCH := torch==2.13.0
PYTEST_ARGS ?=

.PHONY: venv install install-dev demo test lint typecheck contracts pytest prometheus bench cluster-deps e2e-volcano

ifdef VIRTUAL_ENV
venv:
	@test -x "$(PYTHON)" || { echo "make: VIRTUAL_ENV=$(VIRTUAL_ENV) has no bin/python3" >&2; exit 1; }
else
venv: .venv/bin/python3

# A failed creation (Debian without python3-venv: no ensurepip) leaves no half-made .venv.
.venv/bin/python3:
	$(BOOTSTRAP_PYTHON) -m venv .venv || { rm -rf .venv; \
	  echo "make: '$(BOOTSTRAP_PYTHON) -m venv .venv' failed; on Debian/Ubuntu install python3-venv (apt-get install python3-venv), or activate a virtual environment of your own" >&2; \
	  exit 1; }
endif

install: venv
	$(PIP) install -q -e ".[plots]"

install-dev: venv
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[dev,worker,plots]"

demo: install
	$(BIN)/tide simulate

# Prometheus and the pushgateway come from Debian's packages; the tests start them on loopback.
# Installing them needs apt-get (Debian/Ubuntu) and root; elsewhere install them first.
prometheus:
	@if command -v prometheus >/dev/null && command -v promtool >/dev/null; then exit 0; fi; \
	if ! command -v apt-get >/dev/null; then \
	  echo "make test: needs prometheus and promtool on PATH, and installs them only with apt-get (Debian/Ubuntu), which this machine lacks: install Prometheus first" >&2; exit 1; fi; \
	if [ "$$(id -u)" != 0 ]; then \
	  echo "make test: needs prometheus and promtool; installing Debian's prometheus and prometheus-pushgateway packages needs root: run 'sudo apt-get install prometheus prometheus-pushgateway' first, or make test as root" >&2; exit 1; fi; \
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus prometheus-pushgateway >/dev/null

# The real control plane for the cluster tests (kube-apiserver, KWOK, helm, kustomize from their Go
# modules; etcd from Debian), built once into ~/.cache/tide (TIDE_CACHE) and reused per version.
# When everything is cached it returns at once and prints one line, the cache folder. Building
# needs Go >= 1.26 (first time about 10 min on 2 cores); etcd needs apt-get and root, like prometheus.
cluster-deps:
	@bash scripts/cluster-deps.sh

lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck:
	$(BIN)/mypy --strict scheduler_policy metrics_collector simulations tide worker_runtime

contracts:
	$(BIN)/lint-imports

# pytest's own exit code is make's: 5 ("no tests collected") fails like a failed test.
pytest:
	$(PYTHON) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

test: install-dev prometheus cluster-deps lint typecheck contracts pytest

# The same loop against Volcano v1.15.1's own scheduler, controller manager and webhook manager.
# Volcano's Go module is not served by the module proxy, so nothing here builds them:
# TIDE_VOLCANO_BIN names a folder with vc-scheduler, vc-controller-manager and vc-webhook-manager.
e2e-volcano: install-dev prometheus cluster-deps
	@test -n "$(TIDE_VOLCANO_BIN)" || { echo "make e2e-volcano: set TIDE_VOLCANO_BIN to a folder holding Volcano v1.15.1's vc-scheduler, vc-controller-manager and vc-webhook-manager" >&2; exit 1; }
	$(PYTHON) -m pytest -q -p no:cacheprovider -rA tests/e2e_volcano $(PYTEST_ARGS)

bench: venv
	$(PYTHON) benchmarks/engine_latency.py --json benchmarks/out/engine_latency.json
	$(PYTHON) benchmarks/simulate_speed.py --json benchmarks/out/simulate_speed.json
	$(PYTHON) benchmarks/policy_quality.py --json benchmarks/out/policy_quality.json
	$(PYTHON) benchmarks/bound_resolution.py --json benchmarks/out/bound_resolution.json
	$(PYTHON) benchmarks/pollux_batch_whatif.py --json benchmarks/out/pollux_batch_whatif.json
	$(PYTHON) benchmarks/headroom_tradeoff.py --json benchmarks/out/headroom_tradeoff.json
	$(PYTHON) benchmarks/itp_cluster_size.py --json benchmarks/out/itp_cluster_size.json
	$(PYTHON) benchmarks/checkpoint.py --json benchmarks/out/checkpoint.json
	$(PYTHON) benchmarks/batch_choice.py --json benchmarks/out/batch_choice.json
