# Set-up and everyday commands. `make run` and `make test` are the two commands a fresh machine needs.
VENV ?= .venv
PYTHON ?= $(shell command -v python3.11 || command -v python3)
PY := $(VENV)/bin/python
PROMPT ?= Explain in two sentences why the sky is blue.

.PHONY: install run up test bench clean-venv

install: $(VENV)/.installed

# torch 2.13.0 first: on these machines that pin takes the local CPU build (a bare `torch` pulls CUDA wheels).
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@

run: install
	$(VENV)/bin/dhisparse models pull
	$(VENV)/bin/dhisparse generate --chat --max-tokens 96 --prompt "$(PROMPT)"

up: install
	$(VENV)/bin/dhisparse models pull
	$(VENV)/bin/dhisparse up

test: install
	$(VENV)/bin/dhisparse models pull
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

bench: install
	$(VENV)/bin/dhisparse models pull
	$(VENV)/bin/dhisparse bench decode

clean-venv:
	rm -rf $(VENV)
