"""Object bytes this node moved, in total and per peer: what status and metrics report."""

from __future__ import annotations

from collections import Counter
from typing import Any


class Traffic:
    """Bytes received from and sent to each peer (object data only, not control frames)."""

    def __init__(self) -> None:
        self.received: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()

    def add_received(self, peer: str, nbytes: int) -> None:
        if nbytes > 0:
            self.received[peer] += nbytes

    def add_sent(self, peer: str, nbytes: int) -> None:
        if nbytes > 0:
            self.sent[peer] += nbytes

    def as_dict(self) -> dict[str, Any]:
        """The totals (``bytes_in``, ``bytes_out``) and ``peers``: {peer: {in, out}}."""
        peers = sorted(set(self.received) | set(self.sent))
        return {"bytes_in": sum(self.received.values()), "bytes_out": sum(self.sent.values()),
                "peers": {p: {"in": self.received[p], "out": self.sent[p]} for p in peers}}
