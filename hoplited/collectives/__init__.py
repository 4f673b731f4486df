"""Collectives beyond broadcast: reduce (and allreduce, gather built on it)."""
