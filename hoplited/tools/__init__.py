"""Developer tools: the `hoplite` CLI, local clusters, the emulated test bed and the benchmark
scenarios (never imported by the daemon)."""
