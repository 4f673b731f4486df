"""Benchmarks of hoplite and of the systems it is compared with (this package is not installed).

Run them from the repository root as modules, e.g. ``python -m bench.compare``: ``python -m``
puts the working directory first on ``sys.path``, which is how ``bench`` is found (see
:mod:`bench.baselines.common`); ``hoplited`` and ``hoplite_client`` come from the install.
The single-file benchmarks (``loopback_throughput``, ``small_roundtrip``,
``broadcast_memory``) import only the installed packages and also run as plain scripts.
"""
