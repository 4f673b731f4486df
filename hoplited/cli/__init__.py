"""The ``hoplite`` command line: cluster status, a local cluster launcher, benchmarks."""
