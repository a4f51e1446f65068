# probe: the two commands of the README are `make probe` and `make test`.
# Both create or reuse .venv and install what they need from PyPI.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
MODEL  ?= tiny
EXPERIMENT ?= yesno
RUN    ?= runs/$(EXPERIMENT)-$(notdir $(MODEL))
ARGS   ?=
# The CPU wheel of torch when none is installed yet (a CUDA box may pre-install its own build).
TORCH_SPEC ?= torch==2.13.0

STAMP := $(VENV)/.installed

.PHONY: probe test test-slow check bench install clean help

help:
	@echo "make probe [MODEL=tiny|tiny-hybrid|<hf id>|<path>] [RUN=runs/NAME] [ARGS='--think --salts 4']"
	@echo "make test        fast tests (CI)"
	@echo "make test-slow   slow tests too"
	@echo "make check       ruff + mypy"
	@echo "make bench       benchmarks"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]" 2>&1 | grep -v -e "^WARNING: Location" || true
	$(PY) -c "import probe.cli, engines.hf, transformers" # fail here, not later, if the install is broken
	touch $(STAMP)

install: $(STAMP)

probe: $(STAMP)
	$(VENV)/bin/probe run $(EXPERIMENT) --model $(MODEL) --out $(RUN) $(ARGS)
	@echo; cat $(RUN)/report/summary.md

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m "slow or not slow"

check: $(STAMP)
	$(VENV)/bin/ruff check probe engines experiments analysis tests scripts
	$(VENV)/bin/mypy probe engines experiments analysis

bench: $(STAMP)
	$(PY) scripts/bench.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
