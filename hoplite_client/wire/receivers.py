"""The receivers hint: how many nodes will get an object together, as a get or a producer says.

The directory shard answers gets one at a time and cannot tell how many more will come; given
the count, it shapes their transfers as a binary tree where that beats a chain
(docs/design.md §3, "Who sends to whom"). 0 means unknown.
"""

from __future__ import annotations

from hoplite_client.wire.errors import InvalidArgumentError

# Far above any cluster (the emulated test bed stops at 999 hosts): a larger count is garbage.
MAX_RECEIVERS = 1 << 16


def check_receivers(value: object) -> int:
    """``value`` as a receivers count, 0 to ``MAX_RECEIVERS``; else InvalidArgumentError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentError(f"receivers must be a whole number, not "
                                   f"{type(value).__name__}")
    if not 0 <= value <= MAX_RECEIVERS:
        raise InvalidArgumentError(f"receivers must be 0 (unknown) to {MAX_RECEIVERS}, "
                                   f"not {value}")
    return value
