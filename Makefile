# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Each creates .venv if it is missing and installs what it needs first.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip

.PHONY: demo test check docs install install-test clean

# Some shells here set PYTHONDONTWRITEBYTECODE=1; then pytest rewrites and compiles every
# test module's assertions again in each of its workers, every run. Measured on 2 cores:
# collecting the `check` tests takes 14.2 s a process without the cache, 6.2 s with it.
unexport PYTHONDONTWRITEBYTECODE

demo: $(VENV)/.installed
	rm -rf runs/demo
	$(VENV)/bin/shoal demo --run-dir runs/demo --report runs/demo-report.json

# The suite in two parts (pytest-xdist). First everything that neither times itself nor
# races real processes against deadlines, TEST_JOBS tests at a time (three keep two cores
# busy: the tests wait on sockets and subprocesses a quarter of the time); then the
# end-to-end tests (`slow`), SLOW_JOBS at a time: they fence stalled workers and time out
# lost agents, and their deadlines leave room for one neighbour's load (an agent is lost
# after 6 s of silence, not 3: tests/coordinator/e2e.py). Measured on 2 cores: the second
# part took 22:45 one at a time, 11:42 two at a time. Both parts always run (a failure in
# the first still shows the second's); either failing fails the target.
TEST_JOBS ?= 3
SLOW_JOBS ?= 2
test: $(VENV)/.installed-test
	$(PY) -m pytest -m "not slow or parallel_ok" -n $(TEST_JOBS); first=$$?; \
	$(PY) -m pytest -m "slow and not parallel_ok" -n $(SLOW_JOBS); second=$$?; \
	[ $$first -eq 0 ] && [ $$second -eq 0 ]

# The loop for an edit: every test not marked slow (none over ~10 s), CHECK_JOBS at a time.
# Measured on 2 cores, same tree: 5:57 and 6:00 two at a time, 4:22 and 4:17 three at a
# time, 5:07, 6:17 and 6:05 four at a time (more CPU spent, and load flakes).
CHECK_JOBS ?= 3
check: $(VENV)/.installed-test
	$(PY) -m pytest -m "not slow" -n $(CHECK_JOBS) -q

# The documentation site into site/ (mkdocs.yml); the reference pages and the bench figures
# are generated from the code and bench/results/ as it builds. Any warning fails it.
docs: $(VENV)/.installed-test
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e '.[test,docs]'
	touch $(VENV)/.installed $@

clean:
	rm -rf $(VENV) runs site .pytest_cache .hypothesis
