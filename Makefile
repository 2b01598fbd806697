# Verbs used by people and CI alike. `make setup` then `make test` on a fresh clone.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | sha256sum | cut -c1-12)

.PHONY: setup test lint typecheck importlint pytest clean

setup: $(STAMP)

$(STAMP): requirements.txt requirements-dev.txt
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: install Python 3.11+ or run 'make PYTHON=python3 ...'"; exit 1; }
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	@rm -f $(VENV)/.installed-*
	@touch $@

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

importlint: setup
	$(VENV)/bin/lint-imports

pytest: setup
	$(PY) -m pytest

test: lint typecheck importlint pytest

clean:
	rm -rf $(VENV) build .mypy_cache .ruff_cache .pytest_cache
