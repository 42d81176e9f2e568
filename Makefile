# Every target creates .venv on first use and reuses it afterwards.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: venv demo test lint bench stress clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra

lint: $(STAMP)
	$(BIN)/ruff check aioelastic tests examples bench
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m bench

stress: $(STAMP)
	$(BIN)/python -m pytest -q stress

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
