# Two commands on a fresh machine: `make demo` runs the main job, `make test` runs the tests.
# Each installs what it needs into .venv first: the CPU build of torch, then the package with the extra it needs
# (`train` for the demo; `dev`, every extra and pytest, for the tests). `make install` installs the core alone.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: install demo test

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0

# $(VENV)/.installed-EXTRA: the package installed with that extra (`core`: with none).
$(VENV)/.installed-%: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e ".$(if $(filter core,$*),,[$*])"
	touch $@

install: $(VENV)/.installed-core

demo: $(VENV)/.installed-train
	$(VENV)/bin/vanilla-transformer train --overwrite-finished-run  # continues an interrupted demo, replaces a finished one

# One pytest worker a core (pytest-xdist), each test file on one worker so that its fixtures are built once.
test: $(VENV)/.installed-dev
	$(PY) -m pytest -q -n auto --dist loadfile
