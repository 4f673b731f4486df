"""Baselines measured in the same emulated test bed as hoplite (DESIGN.md §7)."""
