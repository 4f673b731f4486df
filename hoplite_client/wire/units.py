"""Sizes as people write them ('64MiB', '1.5GB'), for the daemon's and the tools' options."""

from __future__ import annotations

import re

from hoplite_client.wire.errors import InvalidArgumentError

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2,
          "mib": 1 << 20, "g": 1000**3, "gb": 1000**3, "gib": 1 << 30, "t": 1000**4,
          "tb": 1000**4, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """'64MiB', '1.5GB', '4096' → bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise InvalidArgumentError(f"not a size: {text!r} (try 64MiB, 1GB, 4096)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
