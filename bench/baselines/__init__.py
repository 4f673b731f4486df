"""Baselines measured in the same emulated test bed as hoplite (docs/design.md §7)."""
