"""Developer tools: the `hoplite` CLI, local clusters and the emulated test bed (never imported by the daemon)."""
