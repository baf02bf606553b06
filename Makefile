# tinytf attention workbook. `make help` lists the targets.
# Two commands on a fresh machine:  make lab  (work)  |  make test  (check everything)

SHELL := /bin/bash
.DEFAULT_GOAL := help

BOOTSTRAP_PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV          ?= .venv
TORCH_VERSION ?= 2.13.0
TORCH_PIP_ARGS ?=
# PYTHON=python3 runs every target with an interpreter you prepared yourself (no venv, no set-up),
# e.g. `make test-cuda PYTHON=python3` on a GPU machine that already has torch.
PYTHON        ?= $(VENV)/bin/python
JOBS          ?= 2
DEVICE        ?= cpu
PORT          ?= 8888

ifeq ($(PYTHON),$(VENV)/bin/python)
SETUP := $(VENV)/.tinytf-setup
else
SETUP :=
endif

NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb))
SOLUTIONS := $(sort $(wildcard solutions/*.ipynb))
NBVAL     := -p no:cacheprovider --nbval-lax --nbval-current-env -n $(JOBS) --dist loadfile

.PHONY: help setup lab test lint unit notebooks clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(VENV)/.tinytf-setup: pyproject.toml
	$(BOOTSTRAP_PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q "torch==$(TORCH_VERSION)" numpy $(TORCH_PIP_ARGS)
	$(VENV)/bin/python -m pip install -q -e ".[dev]"
	$(VENV)/bin/python -m ipykernel install --sys-prefix --name tinytf --display-name "Python (tinytf)" >/dev/null
	@touch $@
	@echo "set-up done: $(VENV) (torch $(TORCH_VERSION))"

setup: $(SETUP) ## create .venv: torch first, then tinytf[dev], and a Jupyter kernel (idempotent)

ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

lab: $(SETUP) ## open JupyterLab on notebooks/ (exercises/ and solutions/ are one folder up)
	$(PYTHON) -m jupyterlab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/notebooks --port=$(PORT) $(ROOT_FLAG) $(LAB_ARGS)

lint: $(SETUP) ## ruff on the package, tests and notebooks
	$(PYTHON) -m ruff check .

unit: $(SETUP) ## unit tests (tests/)
	$(PYTHON) -m pytest -q -n $(JOBS) --dist loadfile tests

notebooks: $(SETUP) ## execute every chapter and solution notebook with nbval (CPU)
	@if [ -n "$(strip $(NOTEBOOKS) $(SOLUTIONS))" ]; then \
	  TINYTF_HEADLESS=1 TINYTF_DEVICE=$(DEVICE) MPLBACKEND=Agg $(PYTHON) -m pytest -q $(NBVAL) $(NOTEBOOKS) $(SOLUTIONS); \
	else echo "no notebooks yet"; fi

test: lint unit notebooks ## everything CI runs: lint + unit tests + every notebook executed

clean: ## remove build outputs and caches (keeps .venv)
	rm -rf build .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -not -path "./$(VENV)/*" -exec rm -rf {} +

distclean: clean ## also remove .venv
	rm -rf $(VENV)
