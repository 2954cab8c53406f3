# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs the tests.
# Each installs what it needs into .venv first (CPU build of torch, then the package with its dev extra).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(VENV)/bin/vanilla-transformer train

test: install
	$(PY) -m pytest -q
