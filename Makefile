# Every target creates .venv on first use and reuses it afterwards.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
DOCS_STAMP := $(VENV)/.docs-stamp

.PHONY: venv demo test lint bench stress docs clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,dev]'
	touch $(STAMP)

venv: $(STAMP)

# One worker hangs once under a watchdog timer, is reaped, and the restarted group finishes.
demo: $(STAMP)
	$(BIN)/aioelastic run --standalone --nproc-per-node 4 --max-restarts 1 examples/agent_watchdog.py

test: $(STAMP)
	$(BIN)/python -m pytest -q -ra

lint: $(STAMP)
	$(BIN)/ruff check aioelastic tests examples bench docs/_gen
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python -m bench

stress: $(STAMP)
	$(BIN)/python -m pytest -q stress

# The documentation site, from docs/ into site/ (the docs extra is installed on first use).
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e '.[docs]'
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
