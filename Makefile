# make demo: install into .venv and broadcast on a local 4-node cluster; make test: the suite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test bench-loopback clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/hoplite bench broadcast --nodes 4 --size 64MiB --repeat 5

test: install
	$(BIN)/python -m pytest -q

bench-loopback: install
	$(BIN)/python bench/loopback_throughput.py --size 1GiB

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
