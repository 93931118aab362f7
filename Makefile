# Two commands on a fresh machine: `make demo` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup demo test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: setup
	$(BIN)/agentcas drill

test: setup
	$(BIN)/python -m pytest -n 2 tests

bench: setup
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
