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
	$(BIN)/pip install --quiet -e '.[test,mcp]' --config-settings editable_mode=compat
	touch $(STAMP)

demo: setup
	$(BIN)/agentcas drill

test: setup
	$(BIN)/python -m pytest -n 2 tests

bench: setup
	@command -v restic >/dev/null && command -v borg >/dev/null && command -v b3sum >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq restic borgbackup b3sum; }
	$(BIN)/pip install --quiet -e '.[bench]' --config-settings editable_mode=compat
	$(BIN)/python bench/run.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
