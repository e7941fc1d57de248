# hydrax: make demo | make test | make test-all | make fuzz | make bench | make docs | make constraints
# Each target creates .venv with the interpreter in $(PYTHON) when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hydrax-installed

# Every install here takes its versions from constraints.txt, so a new machine gets the packages
# the suite last passed with, not whatever the registry has today. pip reads PIP_CONSTRAINT in
# the build environments it makes too (Cython, numpy, setuptools for hydrax/_core and for the
# wheel tests), which its -c option does not reach. `make constraints` renews the file.
export PIP_CONSTRAINT := $(CURDIR)/constraints.txt
# uv resolves constraints.txt for every Python and Linux at once (pyproject.toml's [tool.uv])
UV_VERSION := 0.13.9

.PHONY: demo test test-all lint fuzz bench docs constraints clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python constraints.txt pyproject.toml setup.py hydrax/_core.pyx $(wildcard hydrax/*.pxi) $(wildcard hydrax/*.h)
	$(BIN)/python -m pip install --quiet pip setuptools wheel
	$(BIN)/python -m pip install --quiet -e '.[test]'
	# tensorcom 0.1.0, for the interoperability tests: its declared torch and webdataset are
	# not needed by the modules the tests use (tenbin and zcom import numpy, pyzmq, braceexpand)
	$(BIN)/python -m pip install --quiet --no-deps tensorcom==0.1.0
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m hydrax.demo

# Test files run in JOBS pytest processes at once (pytest-xdist, a file's tests in one process, so
# a module's servers and built wheels are made once): most tests wait on processes, sockets and
# timeouts, so two at a time fill two cores, and every test holds on a busy machine anyway.
# JOBS=0 runs them in this process, one after the other.
JOBS   ?= 2
XDIST  := $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile)

# The fast tier: every test without a tier mark (pyproject.toml lists them: slow, fuzz,
# multiprocess, wheel)
test: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "not slow and not fuzz and not multiprocess and not wheel"

# Every test (12.5 minutes on 2 cores, 17.5 one at a time); CI runs this one
test-all: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST)

lint: $(STAMP)
	$(BIN)/python -m ruff check hydrax tests tools examples

# The mutation fuzzers at length (make test-all runs a few hundred mutants each, make test none);
# no -m here, so the fuzz mark selects nothing away
fuzz: $(STAMP)
	HYDRAX_FUZZ=100000 $(BIN)/python -m pytest -q tests/test_fuzz_*.py

bench: $(STAMP)
	$(BIN)/python tools/bench/bench_loader.py

docs: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	$(BIN)/python -m sphinx -q -b html docs docs/_build/html

# Resolve the newest versions the requirements in pyproject.toml allow (the build's, every extra's,
# and pip's own) into constraints.txt, for Python 3.10-3.12 on Linux (run it from a .venv of
# Python 3.11 or later: it reads pyproject.toml with tomllib). Run it on purpose, then run
# `make test-all` on the result and commit both together.
constraints: $(BIN)/python
	PIP_CONSTRAINT= $(BIN)/python -m pip install --quiet uv==$(UV_VERSION)
	$(BIN)/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'], 'pip', sep='\\n')" > $(VENV)/build-requires.in
	$(BIN)/uv pip compile --quiet --universal --python-version 3.10 --upgrade --custom-compile-command "make constraints" \
		--extra test --extra docs --extra all --extra examples pyproject.toml $(VENV)/build-requires.in -o constraints.txt
	@echo "constraints.txt renewed: git diff constraints.txt shows what moved"

clean:
	rm -rf build docs/_build hydrax/_core.c hydrax/_core*.so *.egg-info
