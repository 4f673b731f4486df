# make demo: install into .venv, then (as root) a 64 MiB broadcast to 7 emulated nodes with
# hoplite and with a naive star, side by side (without root: on loopback); make test: every test
# tier this machine allows; make test-unit: the pure cores and codecs in seconds; make lint.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo apps test test-unit fuzz soak lint bench-loopback bench-failures bench-deps bench-compare bench-failures-compare clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,lint]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(BIN)/python -m bench.demo

# The paper's applications (async SGD, RL weight broadcast, ensemble serving) on plain Ray and
# on Ray + Hoplite, smoke-sized in one local Ray cluster of 3 nodes: a table of their results.
apps: install
	$(BIN)/python -m bench.apps --smoke

# Tiers (tests/unit, net, cluster, emulated, integrations): the emulated tier skips itself,
# saying why, without root or iproute2. No soak (make soak) and a short fuzz (make fuzz).
# Two workers (pytest-xdist): most tests wait on daemons and timers, not on a core; the
# emulated and integration tiers run one test at a time on one of them (tests/conftest.py).
test: install
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup --durations 10

test-unit: install
	$(BIN)/python -m pytest -q tests/unit

# The client- and peer-protocol fuzzers, long: 100,000 hostile requests each (make test: 300,
# every request kind among them).
fuzz: install
	HOPLITE_FUZZ_REQUESTS=100000 $(BIN)/python -m pytest -q -s --timeout 7200 \
	    tests/net/test_fuzz_client.py \
	    tests/net/test_fuzz_peer.py

# The soak, long: 30 minutes of puts, broadcasts, reduces, deletes and clients leaving mid-get
# at twice the stores' capacity, then the memory, error and leftover checks; then the tests
# marked soak (make test leaves them out: setup.cfg's addopts), the two-minute form in pytest.
soak: install
	$(BIN)/hoplite soak --duration 1800
	$(BIN)/python -m pytest -q -m soak

lint: install
	$(BIN)/ruff check hoplited hoplite_client tests bench
	$(BIN)/mypy --strict hoplited hoplite_client

bench-loopback: install
	$(BIN)/python bench/loopback_throughput.py --size 1GiB

# Every collective with node 3 of 8 SIGKILLed or SIGSTOPped 1 s in, on emulated 1 Gbit links
# (root: network namespaces), its input put again by a plain client (a killed node's once its
# own client sees the connection close); then reduce and allreduce whose lost input
# a backup replaces; then the same signals where node 3's shard owns the id that matters; then
# a broadcast whose original holder (node 0) dies once node 1 has a copy. The tables in
# docs/benchmarks.md "Failures".
FAILURE_RUNS := broadcast:KILL broadcast:STOP reduce:KILL allreduce:KILL gather:KILL reduce:STOP allreduce:STOP
BACKUP_RUNS := reduce allreduce
OWNER_RUNS := broadcast:STOP reduce:STOP allreduce:STOP reduce:KILL
FAILURE_SIZE := --nodes 8 --size 256MiB --repeat 3 --emulate 1Gbit --capacity 2GiB --kill-after 1
FAILURE_ARGS := $(FAILURE_SIZE) --kill-node 3
bench-failures: install
	@for run in $(FAILURE_RUNS); do \
	  $(BIN)/hoplite bench $${run%%:*} $(FAILURE_ARGS) --signal $${run##*:} || exit 1; \
	done
	@for op in $(BACKUP_RUNS); do $(BIN)/hoplite bench $$op $(FAILURE_ARGS) --backup || exit 1; done
	@for run in $(OWNER_RUNS); do \
	  $(BIN)/hoplite bench $${run%%:*} $(FAILURE_ARGS) --victim-owns --signal $${run##*:} || exit 1; \
	done
	@for sig in KILL STOP; do \
	  $(BIN)/hoplite bench broadcast $(FAILURE_SIZE) --kill-node 0 --victim-owns --signal $$sig || exit 1; \
	done

# Heavy, optional: OpenMPI from Debian, then torch (gloo), mpi4py, Ray, Dask and matplotlib.
bench-deps: install
	@if [ "$$(id -u)" != 0 ]; then echo "bench-deps needs root (apt-get, network namespaces)"; exit 1; fi
	command -v mpirun >/dev/null || (apt-get update -qq && apt-get install -y -qq openmpi-bin libopenmpi-dev)
	$(BIN)/pip install --quiet -e '.[plot,baselines]'

# Hoplite against every baseline on emulated 1 Gbit links, N = 4 and 8; writes docs/benchmarks.md.
bench-compare: bench-deps
	$(BIN)/python -m bench.compare --nodes 4 8 --rate 1Gbit --repeat 5

# The same failures with gloo and OpenMPI next to hoplite; writes docs/benchmarks.md.
bench-failures-compare: bench-deps
	$(BIN)/python -m bench.failures --nodes 8 --size 256MiB --rate 1Gbit --victim 3 --after 1

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
