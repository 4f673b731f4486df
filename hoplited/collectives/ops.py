"""Reduce operators and the block combine step every tree node runs.

Ops are numpy ufuncs applied in place on byte views of equal length, so a node combines each
block of its children's prefix into its output without allocating (docs/design.md §4).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

from hoplite_client.wire.errors import InvalidArgumentError
from hoplite_client.wire.ids import ObjectID
from hoplited.memory.store import parse_dtype

OPS: dict[str, Any] = {"sum": np.add, "min": np.minimum, "max": np.maximum, "prod": np.multiply}
NUMERIC_KINDS = "biufc"  # bool, signed, unsigned, float, complex


def derived_id(result: ObjectID, slot: int, tag: bytes) -> ObjectID:
    """The id of a reduce's temporary object (slot output or child buffer)."""
    digest = hashlib.blake2b(result.binary() + slot.to_bytes(4, "big") + tag, digest_size=20)
    return ObjectID(digest.digest())


def check_op(op: str) -> None:
    """Refuse an unknown reduce op with the list of known ones."""
    if op not in OPS:
        raise InvalidArgumentError(f"unknown reduce op {op!r}; ops: {', '.join(OPS)}")


def check_reducible(op: str, dtype: str) -> None:
    """Refuse an unknown op or a dtype that is not numeric."""
    check_op(op)
    if parse_dtype(dtype).kind not in NUMERIC_KINDS:
        raise InvalidArgumentError(f"cannot reduce dtype {dtype}: numeric types only")


def combine(op: str, dtype: np.dtype[Any], own: memoryview, others: list[memoryview],
            out: memoryview) -> None:
    """out = own ⊕ others[0] ⊕ ... elementwise (all byte views of equal length)."""
    o = np.frombuffer(out, dtype=dtype)
    a = np.frombuffer(own, dtype=dtype)
    if not others:
        o[...] = a
        return
    ufunc = OPS[op]
    ufunc(a, np.frombuffer(others[0], dtype=dtype), out=o)
    for other in others[1:]:
        ufunc(o, np.frombuffer(other, dtype=dtype), out=o)
