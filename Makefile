# Two commands on a fresh machine: `make run` and `make test` (see README.md).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)

.PHONY: run test install install-test lint format browser bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[test,integration]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

install: $(STAMP)

install-test: $(STAMP)

run: install
	$(PY) manage.py bootstrap
	$(PY) manage.py serve

# Chromium drives the dashboard's browser tests (Debian's package; nothing downloads).
browser:
	@test -x /usr/bin/chromium || (apt-get update -qq && apt-get install -y -qq chromium)

test: install-test browser
	$(PY) -m pytest

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

bench: install
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) manage.py bench

clean:
	rm -rf $(VENV) staticfiles bench-results test-*.sqlite3*
