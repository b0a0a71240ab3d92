# Two entry points: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint setup

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# torch first, from the CPU wheel pinned in constraints.txt; energon would otherwise pull a CUDA build
	$(PY) -m pip install --quiet -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) examples/demo/demo.py

test: setup
	$(PY) -m pytest -q -p no:cacheprovider tests prep cookers

lint: setup
	$(VENV)/bin/ruff check .
