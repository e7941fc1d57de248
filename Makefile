# hydrax: make demo | make test | make fuzz | make bench | make docs
# Each target creates .venv with the interpreter in $(PYTHON) when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.hydrax-installed

.PHONY: demo test lint fuzz bench docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): $(BIN)/python pyproject.toml setup.py hydrax/_core.pyx
	$(BIN)/python -m pip install --quiet -e '.[test]'
	# tensorcom 0.1.0, for the interoperability tests: its declared torch and webdataset are
	# not needed by the modules the tests use (tenbin and zcom import numpy, pyzmq, braceexpand)
	$(BIN)/python -m pip install --quiet --no-deps tensorcom==0.1.0
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m hydrax.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/python -m ruff check hydrax tests tools

# The mutation fuzzers at length (make test runs a few hundred mutants each)
fuzz: $(STAMP)
	HYDRAX_FUZZ=100000 $(BIN)/python -m pytest -q tests/test_fuzz_*.py

bench: $(STAMP)
	$(BIN)/python tools/bench_loader.py

docs: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	$(BIN)/python -m sphinx -q -b html docs docs/_build/html

clean:
	rm -rf build docs/_build hydrax/_core.c hydrax/_core*.so *.egg-info
