# tide's two entry points. `make demo` installs tide and runs its main job, `tide simulate`,
# on the built-in default; `make test` installs what the tests need and runs the whole suite (CI runs it).
PYTHON ?= python3
PIP := $(PYTHON) -m pip
# torch is pinned exactly: a CPU build of this release is what these machines carry, and a
# looser requirement lets pip pick a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: install install-dev demo test lint typecheck contracts pytest prometheus bench

install:
	$(PIP) install -q -e ".[plots]"

install-dev:
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e ".[dev,worker,plots]"

demo: install
	tide simulate

# Prometheus and the pushgateway come from Debian's packages; the tests start them on loopback.
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus prometheus-pushgateway >/dev/null)

lint:
	ruff check .
	ruff format --check .

typecheck:
	mypy --strict scheduler_policy metrics_collector simulations tide worker_runtime

contracts:
	lint-imports

pytest:
	$(PYTHON) -m pytest -q -p no:cacheprovider

test: install-dev prometheus lint typecheck contracts pytest

bench:
	$(PYTHON) benchmarks/engine_latency.py --json benchmarks/out/engine_latency.json
	$(PYTHON) benchmarks/simulate_speed.py --json benchmarks/out/simulate_speed.json
	$(PYTHON) benchmarks/policy_quality.py --json benchmarks/out/policy_quality.json
	$(PYTHON) benchmarks/bound_resolution.py --json benchmarks/out/bound_resolution.json
	$(PYTHON) benchmarks/pollux_batch_whatif.py --json benchmarks/out/pollux_batch_whatif.json
	$(PYTHON) benchmarks/headroom_tradeoff.py --json benchmarks/out/headroom_tradeoff.json
	$(PYTHON) benchmarks/itp_cluster_size.py --json benchmarks/out/itp_cluster_size.json
	$(PYTHON) benchmarks/checkpoint.py --json benchmarks/out/checkpoint.json
