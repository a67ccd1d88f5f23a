# headroom — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test

.PHONY: demo test test-unit test-live test-engine test-image test-fast lint image bench bench-engine fuzz docs venv clean chart-sync

# two distributions: headroom (the daemon, monitor/) and headroom-lab (lab/: simulator, load tester, demo)
$(STAMP): pyproject.toml lab/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e . -e ./lab
	touch $(STAMP)

$(TSTAMP): $(STAMP)
	$(PIP) install -q -e '.[test]' -e ./lab
	touch $(TSTAMP)

venv: $(STAMP)

## demo: set everything up and watch a simulated busy fleet (Ctrl-C stops it)
demo: $(STAMP)
	$(VENV)/bin/headroom demo $(DEMO_ARGS)

## test: set-up + the whole suite, every tier (SKIP_ENGINES=1 leaves the engine tier out, and says so)
# Tiers (tests/tiers.py holds them by what each test does; tests/run_tiers.py runs them):
#   test-unit    no subprocess, no socket, no binary
#   test-live    real Prometheus / promtool / Alertmanager / VictoriaMetrics / Chromium, daemons on loopback
#   test-engine  the real vLLM CPU engine and the LiteLLM proxy in front of it
#   test-image   the container image (make image) run with podman the way the chart's Deployment runs it
# Set-up (.ci/setup.sh) installs what a tier needs when it is missing: Debian packages (as root), the npm
# models of the chart tests, the vLLM and LiteLLM venvs (under ~/.cache/headroom, shared by every clone).
HEADROOM_CACHE ?= $(or $(HOME),/root)/.cache/headroom
export HEADROOM_VLLM_VENV ?= $(HEADROOM_CACHE)/venv-vllm
export HEADROOM_LITELLM_VENV ?= $(HEADROOM_CACHE)/venv-litellm
export HEADROOM_VLLM_PYTHON ?= $(HEADROOM_VLLM_VENV)/bin/python
export HEADROOM_LITELLM_BIN ?= $(HEADROOM_LITELLM_VENV)/bin/litellm
TIERS := tests/run_tiers.py

# The image is built in the background (niced) while the other tiers run; the image tier waits for it.
test: $(TSTAMP)
	bash .ci/setup.sh $(if $(SKIP_ENGINES),live image,all)
	$(PY) helm/sync.py --check
	$(PY) $(TIERS) --build-image unit live $(if $(SKIP_ENGINES),--not-run engine,engine) image -- $(PYTEST_ARGS)

## test-unit: the pure tests, two pytest processes (about 110 s of CPU; a bare `pytest` runs the same in one); the loop to run while working
test-unit: $(TSTAMP)
	$(PY) $(TIERS) unit -- $(PYTEST_ARGS)

## test-live: the tests against real binaries and servers on loopback
test-live: $(TSTAMP)
	bash .ci/setup.sh live
	$(PY) $(TIERS) live -- $(PYTEST_ARGS)

## test-engine: the real vLLM CPU engine tests (one engine session, about 12 minutes)
test-engine: $(TSTAMP)
	bash .ci/setup.sh engine
	$(PY) $(TIERS) engine -- $(PYTEST_ARGS)

## image: build the container image localhost/headroom:dev with buildah (no registry; base cached)
image: $(STAMP)
	bash .ci/setup.sh image
	PYTHON=$(PY) bash image/build.sh

## test-image: run that image with podman the way the Helm chart's Deployment runs it
test-image: image $(TSTAMP)
	$(PY) $(TIERS) image -- $(PYTEST_ARGS)

## test-fast: unit + live (no engine)
test-fast: $(TSTAMP)
	bash .ci/setup.sh live
	$(PY) $(TIERS) unit live -- $(PYTEST_ARGS)

## lint: ruff over the repository and mypy over monitor/ (pyproject.toml; tests/suite/test_lint.py runs both too)
lint: $(TSTAMP)
	$(PY) -m ruff check .
	$(PY) -m mypy

## bench-engine: accuracy against the real engine over repeated trials -> benchmarks/engine_results.json
bench-engine: $(TSTAMP)
	bash .ci/setup.sh engine
	$(PY) benchmarks/engine_bench.py $(BENCH_ARGS)

## bench: speed, memory and forecast-skill benchmarks -> benchmarks/results.json
bench: $(TSTAMP)
	$(PY) benchmarks/run.py

## fuzz: the long property-based run of the parsers and the config loader
fuzz: $(TSTAMP)
	HEADROOM_FUZZ_EXAMPLES=10000 HEADROOM_FUZZ_RANDOM=1 $(PY) -m pytest -q -m fuzz tests

## chart-sync: copy rules/ and grafana/dashboards/ into the Helm chart (commit the result)
chart-sync: $(STAMP)
	$(PY) helm/sync.py

## docs: regenerate docs/metrics.md (the catalogue), docs/configuration.md and docs/loadtest-mix.md (the declarations)
docs: $(STAMP)
	$(PY) -m monitor.model.catalogue > docs/metrics.md
	$(PY) -m monitor.config > docs/configuration.md
	$(PY) -m headroom_lab.loadtest.docs > docs/loadtest-mix.md

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info lab/build lab/*.egg-info
