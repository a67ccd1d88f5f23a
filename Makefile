# headroom — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test

.PHONY: demo test test-fast bench fuzz docs venv clean chart-sync

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $(STAMP)

$(TSTAMP): $(STAMP)
	$(PIP) install -q -e '.[test]'
	touch $(TSTAMP)

# npm models of the Prometheus Operator CRDs, for the chart tests (skipped when npm is absent)
tests/k8s-models/node_modules: tests/k8s-models/package-lock.json
	-command -v npm >/dev/null && npm ci --prefix tests/k8s-models --no-audit --no-fund --silent

venv: $(STAMP)

## demo: set everything up and watch a simulated busy fleet (Ctrl-C stops it)
demo: $(STAMP)
	$(VENV)/bin/headroom demo $(DEMO_ARGS)

## test: the whole suite (real Prometheus, Alertmanager, vLLM CPU engine where installed)
# The real-engine tests run in their own pytest sessions: idle vLLM CPU engines kept alive by an
# earlier session's fixtures take the 2 cores the next one's latency checks need. ENGINE_TESTS share
# one engine (small model, 8 slots; the LiteLLM gateway sits in front of it) and start a 4-slot one for
# the compare test; the knee sweep starts its own engine with every other one stopped.
ENGINE_TESTS := tests/test_vllm_pipeline.py tests/test_vllm_sim_calibration.py tests/test_capacity_vllm.py \
                tests/test_loadtest_vllm.py
KNEE_TESTS := tests/test_knee_vllm.py

# The tests without an engine mostly wait (real Prometheus, promtool, simulated fleets in real time):
# their slowest files run in a second pytest process beside the others (tests/parallel.py).
SIDE_SHARD := tests/test_demo.py tests/test_loadtest_sim.py tests/test_restarts.py

test: $(TSTAMP) tests/k8s-models/node_modules
	$(PY) helm/sync.py --check
	$(PY) tests/parallel.py $(SIDE_SHARD) -- -q -m "not vllm" $(PYTEST_ARGS)
	$(PY) -m pytest -q -m vllm $(ENGINE_TESTS) $(PYTEST_ARGS)
	$(PY) -m pytest -q -m vllm $(KNEE_TESTS) $(PYTEST_ARGS)

## test-fast: everything but the real-engine tests
test-fast: $(TSTAMP)
	$(PY) tests/parallel.py $(SIDE_SHARD) -- -q -m "not vllm" $(PYTEST_ARGS)

## bench: speed, memory and forecast-skill benchmarks -> benchmarks/results.json
bench: $(TSTAMP)
	$(PY) benchmarks/run.py

## fuzz: the long property-based run of the parsers and the config loader
fuzz: $(TSTAMP)
	HEADROOM_FUZZ_EXAMPLES=10000 HEADROOM_FUZZ_RANDOM=1 $(PY) -m pytest -q -m fuzz tests

## chart-sync: copy rules/ and grafana/dashboards/ into the Helm chart (commit the result)
chart-sync: $(STAMP)
	$(PY) helm/sync.py

## docs: regenerate docs/metrics.md from the catalogue
docs: $(STAMP)
	$(PY) -m monitor.catalogue > docs/metrics.md

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
