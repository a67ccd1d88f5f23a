# headroom — the two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast bench fuzz docs venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

## demo: set everything up and watch a simulated busy fleet (Ctrl-C stops it)
demo: $(STAMP)
	$(VENV)/bin/headroom demo $(DEMO_ARGS)

## test: the whole suite (real Prometheus, Alertmanager, vLLM CPU engine where installed)
test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

## test-fast: everything but the real-engine tests
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not vllm" $(PYTEST_ARGS)

## bench: speed, memory and forecast-skill benchmarks -> benchmarks/results.json
bench: $(STAMP)
	$(PY) benchmarks/run.py

## fuzz: the long property-based run of the parsers and the config loader
fuzz: $(STAMP)
	HEADROOM_FUZZ_EXAMPLES=10000 $(PY) -m pytest -q -m fuzz tests

## docs: regenerate docs/metrics.md from the catalogue
docs: $(STAMP)
	$(PY) -m monitor.catalogue > docs/metrics.md

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
