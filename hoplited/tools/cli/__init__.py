"""The `hoplite` command line: status, a local cluster, benchmarks and the test bed."""
