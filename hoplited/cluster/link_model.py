"""What this daemon has measured about its links: per-hop latency L and bandwidth B.

The reduce's shape, one chain or a binary tree, follows from the cost of a hop, L plus a
forwarding unit at B (docs/design.md §4). The original compiled L and B in; we measure them:
L as the least half round trip among the recent heartbeats, B from completed transfers of at
least 1 MiB.
"""

from __future__ import annotations

from collections import deque

# Until measured: a LAN-ish hop and a 1 Gbit/s link; the first samples replace them. A node
# that only sends (a broadcast's source) may never measure B, and a 10 Gbit/s guess made
# its shard take a binary tree for a 1 MiB broadcast on 1 Gbit/s links (docs/design.md §4).
DEFAULT_LATENCY = 100e-6
DEFAULT_BANDWIDTH = 125e6
SMOOTHING = 0.2  # weight of a new bandwidth sample in its moving average
# L is the least half round trip of this many recent heartbeats (about 5 s of pings to 7
# peers): a ping waits behind whatever the links and the event loop are busy with, which a
# pipelined hop does not pay again; averaged, that wait made L 0.4-4.2 ms on the emulated
# links, and a 1 MiB broadcast's shard took a binary tree (2.6-4.0x S/RATE) where the chain
# runs at 1.6-2.0x (docs/design.md §4, "Tree shape").
LATENCY_WINDOW = 64
# A source that sends nothing for this many slices' worth of link time has stalled...
STALL_SLICES = 8
# ...but never sooner than this: a loaded 2-core host can pause a healthy sender for a few
# hundred milliseconds (8 daemons, their clients and the kernel's copies share the cores).
STALL_MIN = 1.0


class LinkModel:
    """L (seconds per hop), the least recent half round trip, and B (bytes per second),
    exponentially smoothed."""

    def __init__(self) -> None:
        self.latency = DEFAULT_LATENCY
        self.bandwidth = DEFAULT_BANDWIDTH
        self.latency_samples = 0
        self.bandwidth_samples = 0
        self._one_way: deque[float] = deque(maxlen=LATENCY_WINDOW)

    def observe_rtt(self, rtt: float) -> None:
        self._one_way.append(rtt / 2)
        self.latency = min(self._one_way)
        self.latency_samples += 1

    def observe_bandwidth(self, rate: float) -> None:
        self.bandwidth = rate if not self.bandwidth_samples else (
            (1 - SMOOTHING) * self.bandwidth + SMOOTHING * rate)
        self.bandwidth_samples += 1

    def stall_window(self, slice_bytes: int, cap: float) -> float:
        """How long a transfer may receive nothing before its source counts as stalled: a few
        slices at the measured rate, at least ``STALL_MIN``, at most ``cap`` (docs/design.md
        §5). About a second on 1 Gbit/s links, instead of a fixed half minute."""
        return min(cap, max(STALL_MIN, STALL_SLICES * slice_bytes / self.bandwidth))

    def as_dict(self) -> dict[str, float]:
        return {"latency_s": self.latency, "bandwidth_Bps": self.bandwidth,
                "latency_samples": self.latency_samples,
                "bandwidth_samples": self.bandwidth_samples}
