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

# $(call timed,NAME,COMMAND): run COMMAND, print how long it took, and add "NAME SECONDS" to $(TIMES)
# (.ci/run sets TIMES and prints every phase's time at the end)
TIMES ?=
timed = start=$$(date +%s); $(2); rc=$$?; t=$$(( $$(date +%s) - start )); echo "== $(1): $$t s"; \
	$(if $(TIMES),echo "$(1) $$t $$rc" >> $(TIMES);) exit $$rc

ifeq ($(PYTHON),$(VENV)/bin/python)
SETUP := $(VENV)/.tinytf-setup
else
SETUP :=
endif

# both editions: notebooks/zh/ and solutions/zh/ hold the Chinese twins
NOTEBOOKS := $(sort $(wildcard notebooks/*.ipynb notebooks/zh/*.ipynb))
SOLUTIONS := $(sort $(wildcard solutions/*.ipynb solutions/zh/*.ipynb))
# pytest-xdist's "-n JOBS" when the interpreter has it (PYTHON=python3 may not); expanded only when used
XDIST      = $(shell $(PYTHON) -c "import xdist" >/dev/null 2>&1 && echo "-n $(JOBS) --dist loadfile")
# With JOBS>1 parallel workers, one torch thread each: two 2-thread kernels on a 2-core machine
# oversubscribe the CPU and slow tiny-tensor notebooks many times over.
THREADS_ENV = $(if $(filter-out 1,$(JOBS)),OMP_NUM_THREADS=1)
# The package's bytecode, brought up to date before the runs that start hundreds of processes (each kernel,
# grading job and test worker imports tinytf): where PYTHONDONTWRITEBYTECODE is set (this kind of machine sets it), no
# process writes it, so each one compiled the modules it imports again (0.1-0.2 s a kernel). Cheap when fresh.
BYTECODE = $(PYTHON) -m compileall -q -j 0 tinytf >/dev/null

.PHONY: help setup lab lab-zh lab-instructor book test-book test test-fast lint unit notebooks clean run test-cuda test-ui bench release grade messages

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# make setup installs with uv (from PyPI into the venv): 40 s where pip takes 110 s on 2 cores, the same packages.
# INSTALLER=pip uses pip only; pip is also the fallback when uv cannot install. uv reads no pip.conf, so the
# find-links pip is configured with (where a machine keeps its CPU torch wheel) are handed to it.
INSTALLER  ?= uv
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(BOOTSTRAP_PYTHON) -m pip config get global.find-links 2>/dev/null))
UV_INSTALL  = $(VENV)/bin/uv pip install -q --compile-bytecode --python $(VENV)/bin/python $(foreach l,$(FIND_LINKS),--find-links $(l))
PIP_INSTALL = $(VENV)/bin/python -m pip install -q

$(VENV)/.tinytf-setup: pyproject.toml
	$(BOOTSTRAP_PYTHON) -m venv $(VENV)
	@if [ "$(INSTALLER)" = uv ] && $(PIP_INSTALL) uv && $(UV_INSTALL) "torch==$(TORCH_VERSION)" numpy $(TORCH_PIP_ARGS) \
	    && $(UV_INSTALL) -e ".[dev]"; then echo "installed with uv"; \
	else [ "$(INSTALLER)" = pip ] || echo "uv could not install: installing with pip"; \
	  $(PIP_INSTALL) "torch==$(TORCH_VERSION)" numpy $(TORCH_PIP_ARGS) && $(PIP_INSTALL) -e ".[dev]"; fi
	$(VENV)/bin/python -m ipykernel install --sys-prefix --name tinytf --display-name "Python (tinytf)" >/dev/null
	@touch $@
	@echo "set-up done: $(VENV) (torch $(TORCH_VERSION))"

setup: $(SETUP) ## create .venv: torch first, then tinytf[dev], and a Jupyter kernel (idempotent)

ROOT_FLAG := $(shell [ "$$(id -u)" = 0 ] && echo --allow-root)

# the student's Lab has no nbgrader instructor tools (lab/README.md); lab-instructor has them all
LAB_TREE = notebooks
LAB = $(PYTHON) -m jupyterlab --ServerApp.root_dir=. --LabApp.default_url=/lab/tree/$(LAB_TREE) --port=$(PORT) $(ROOT_FLAG) $(LAB_ARGS)

lab: $(SETUP) ## open the student's JupyterLab on notebooks/ (exercises/ one folder up; no nbgrader instructor tools)
	JUPYTER_CONFIG_PATH=$(CURDIR)/lab/student $(LAB)

lab-zh: $(SETUP) ## the student's JupyterLab in Chinese (menus from jupyterlab-language-pack-zh-CN) on notebooks/zh/
	JUPYTER_CONFIG_PATH=$(CURDIR)/lab/student $(LAB) --LabApp.app_settings_dir=$(CURDIR)/lab/zh/settings
lab-zh: LAB_TREE = notebooks/zh

lab-instructor: $(SETUP) ## the same JupyterLab with nbgrader's instructor tools (create assignment, formgrader)
	JUPYTER_CONFIG_PATH=$(CURDIR)/lab/instructor $(LAB)

# import-linter's command line (lint-imports) run by $(PYTHON), so PYTHON=python3 works too; the contracts
# (layers, model code below the course, no import loops) are in pyproject.toml under [tool.importlinter]
LINT_IMPORTS = $(PYTHON) -c "from importlinter.cli import lint_imports_command; lint_imports_command()" --no-cache

lint: $(SETUP) ## ruff on the package, tests and notebooks; import-linter on the package's layers
	$(call timed,lint,$(PYTHON) -m ruff check . && $(LINT_IMPORTS))

unit: $(SETUP) ## unit tests (tests/), the grading and validate runs included
	$(call timed,unit,$(BYTECODE) && $(THREADS_ENV) $(PYTHON) -m pytest -q -n $(JOBS) --dist loadfile --durations=10 -m "not ui and not book" --ignore=tests/ui tests)

test-fast: lint $(SETUP) ## the edit-test loop: lint + unit tests without grading runs and notebooks (a few minutes)
	$(BYTECODE) && $(THREADS_ENV) $(PYTHON) -m pytest -q -n $(JOBS) --dist loadfile --durations=5 -m "not ui and not book and not grading and not slow" --ignore=tests/ui tests

notebooks: $(SETUP) ## execute every chapter and solution (both editions) once into build/executed/; any error fails (the book reuses the copies)
	@$(call timed,notebooks,$(BYTECODE) && $(PYTHON) -m tinytf.course.build.executed --jobs $(JOBS) --device $(DEVICE) $(NOTEBOOKS) $(SOLUTIONS))

test: lint unit notebooks ## everything CI runs: lint + unit tests + every notebook executed

run: $(SETUP) ## papermill every notebook into build/executed/ (DEVICE=cpu|cuda), then HTML into build/html/
	@mkdir -p build/executed build/html
	@set -e; for nb in $(NOTEBOOKS) $(SOLUTIONS); do \
	  out=build/executed/$${nb#notebooks/}; \
	  mkdir -p $$(dirname $$out); start=$$(date +%s); \
	  TINYTF_HEADLESS=1 TINYTF_DEVICE=$(DEVICE) $(PYTHON) -m papermill --no-progress-bar --log-level WARNING -k python3 \
	    --cwd $$(dirname $$nb) -p device $(DEVICE) $$nb $$out; \
	  echo "ran $$nb on $(DEVICE) in $$(( $$(date +%s) - start )) s -> $$out"; \
	done
	@for d in . zh solutions solutions/zh; do \
	  if ls build/executed/$$d/*.ipynb >/dev/null 2>&1; then \
	    $(PYTHON) -m nbconvert --to html --log-level WARN --output-dir build/html/$$d build/executed/$$d/*.ipynb; fi; \
	done
	@echo "executed notebooks: build/executed/   HTML: build/html/"

# make test-cuda refuses to start (exit 1, one clear line) unless torch sees a CUDA GPU.
define CUDA_CHECK
import sys
try:
    import torch
except ImportError:
    sys.exit(f"make test-cuda: {sys.executable} cannot import torch; install it or pass PYTHON=<an interpreter with torch>")
if not torch.cuda.is_available():
    sys.exit(f"make test-cuda needs a CUDA GPU, but torch.cuda.is_available() is False here (torch {torch.__version__}, "
             f"built for CUDA {torch.version.cuda}). Run make test for the CPU checks.")
missing = [m for m in ("pytest", "nbval", "ipykernel", "tinytf") if __import__("importlib.util").util.find_spec(m) is None]
if missing:
    sys.exit(f"make test-cuda: {sys.executable} lacks {missing}; pip install -e '.[dev]' into it first")
print(f"make test-cuda: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
endef
export CUDA_CHECK

test-cuda: $(SETUP) ## unit tests + every notebook on the GPU (TINYTF_DEVICE=cuda); fails clearly without CUDA
	@$(PYTHON) -c "$$CUDA_CHECK"
	TINYTF_DEVICE=cuda $(PYTHON) -m pytest -q $(XDIST) -m "not ui and not book" --ignore=tests/ui tests
	$(MAKE) --no-print-directory notebooks DEVICE=cuda PYTHON=$(PYTHON)

# the browser tests wait on Lab, kernel and browser a third of the time: two at once (each its own server and port)
test-ui: $(SETUP) ## real-browser test: JupyterLab + Chromium (Playwright) drive chapter 01's attention explorer
	env -u TINYTF_HEADLESS $(PYTHON) -m pytest -q -p no:cacheprovider $(if $(XDIST),-n $(JOBS) --dist load) -m ui tests/ui

book: $(SETUP) ## two books, build/book/en/ and build/book/zh/: every chapter executed (reusing build/executed/), offline
	$(PYTHON) -m tinytf.course.build.book --jobs $(JOBS)

test-book: $(SETUP) ## open every page of both books in Chromium (pages in parallel, outside requests blocked), search them (make book first)
	$(PYTHON) -m pytest -q -s -p no:cacheprovider -m book tests/ui/test_book.py

BENCHES := $(sort $(wildcard benchmarks/*.py))

bench: $(SETUP) ## run every benchmarks/*.py in turn (DEVICE=cpu|cuda|auto): JSON + plots in build/bench/
	@mkdir -p build/bench
	@n=$(words $(BENCHES)); i=0; for f in $(BENCHES); do i=$$((i+1)); \
	  echo "== [$$i/$$n] $$f (TINYTF_DEVICE=$(DEVICE))"; \
	  TINYTF_DEVICE=$(DEVICE) MPLBACKEND=Agg $(PYTHON) $$f || exit 1; \
	done; echo "== bench done: $$(ls build/bench | tr '\n' ' ')"

release: $(SETUP) ## regenerate exercises/ from solutions/ with nbgrader (byte-identical when nothing changed)
	$(PYTHON) -m tinytf.course.cli release

SUBMISSIONS ?=
OUT         ?= build/grades
GRADE_ARGS  ?=

grade: $(SETUP) ## grade SUBMISSIONS=<dir>/<student>/<exercise>.ipynb [OUT=build/grades] [JOBS=2] [GRADE_ARGS=--timeout 60]
	@if [ -z "$(SUBMISSIONS)" ]; then echo "usage: make grade SUBMISSIONS=path/to/submissions [OUT=build/grades]"; exit 2; fi
	$(PYTHON) -m tinytf.course.cli grade "$(SUBMISSIONS)" --out "$(OUT)" --jobs $(JOBS) $(GRADE_ARGS)

# the message catalog (tinytf/translation.py): every _("...") in tinytf/ -> build/tinytf.pot -> the zh_CN .po (update
# keeps its translations; new msgids arrive empty, changed ones fuzzy) -> the compiled .mo shipped with the package
POT := build/tinytf.pot
PYBABEL = $(PYTHON) -m babel.messages.frontend -q

messages: $(SETUP) ## extract every _("...") of tinytf/, update the zh_CN catalog, compile it (Babel); translate what is new
	@mkdir -p build
	$(PYBABEL) extract -F babel.cfg --no-location --sort-output --project=tinytf --copyright-holder=tinytf -o $(POT) tinytf
	$(PYBABEL) update -i $(POT) -d tinytf/locale -D tinytf -l zh_CN --no-fuzzy-matching --ignore-obsolete --ignore-pot-creation-date
	$(PYBABEL) compile -d tinytf/locale -D tinytf --statistics

clean: ## remove build outputs and caches (keeps .venv)
	rm -rf build .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -not -path "./$(VENV)/*" -exec rm -rf {} +

distclean: clean ## also remove .venv
	rm -rf $(VENV)
