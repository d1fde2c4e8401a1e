# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Each creates .venv if it is missing and installs what it needs first.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip

.PHONY: demo test install install-test clean

demo: $(VENV)/.installed
	rm -rf runs/demo
	$(VENV)/bin/shoal demo --run-dir runs/demo --report runs/demo-report.json

test: $(VENV)/.installed-test
	$(PY) -m pytest

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e '.[test]'
	touch $(VENV)/.installed $@

clean:
	rm -rf $(VENV) runs .pytest_cache .hypothesis
