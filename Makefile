# Two commands: `make book` builds the site, `make test` builds it and runs every test.
# Both create .venv when it is missing and install requirements.txt under the exact pins of constraints.txt.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
JB     := $(VENV)/bin/jupyter-book

.PHONY: book test install sync clean help

help:
	@echo "make book   install, then build the HTML site from a clean _build (every chapter executed, warnings = errors)"
	@echo "make test   make book, then pytest (library, chapter pairs, the built site)"
	@echo "make sync   re-pair notebooks/*.ipynb from notebooks/*.md with jupytext"

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip>=23"

install: $(PY)
	$(PY) -m pip install --quiet -r requirements.txt -c constraints.txt

book: install
	rm -rf _build
	$(JB) build . --builder html -W -n --keep-going
	@echo
	@echo "Open the book: $(CURDIR)/_build/html/index.html"

test: book
	$(PY) -m pytest

sync: install
	$(VENV)/bin/jupytext --to ipynb --update notebooks/[0-9]*.md

clean:
	rm -rf _build
