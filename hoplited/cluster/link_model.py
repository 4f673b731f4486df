"""What this daemon has measured about its links: per-hop latency L and bandwidth B.

The reduce's shape, one chain or a binary tree, follows from the cost of a hop, L plus a
forwarding unit at B (docs/design.md §4). The original compiled L and B in; we measure them:
L from heartbeat round trips, B from completed transfers of at least 1 MiB.
"""

from __future__ import annotations

# Until measured: a LAN-ish hop and a 10 Gbit/s-class link; the first samples replace them.
DEFAULT_LATENCY = 100e-6
DEFAULT_BANDWIDTH = 1.25e9
SMOOTHING = 0.2  # weight of a new sample in the moving averages
# A source that sends nothing for this many slices' worth of link time has stalled...
STALL_SLICES = 8
# ...but never sooner than this: a loaded 2-core host can pause a healthy sender for a few
# hundred milliseconds (8 daemons, their clients and the kernel's copies share the cores).
STALL_MIN = 1.0


class LinkModel:
    """Exponentially smoothed L (seconds per hop) and B (bytes per second)."""

    def __init__(self) -> None:
        self.latency = DEFAULT_LATENCY
        self.bandwidth = DEFAULT_BANDWIDTH
        self.latency_samples = 0
        self.bandwidth_samples = 0

    def observe_rtt(self, rtt: float) -> None:
        one_way = rtt / 2
        self.latency = one_way if not self.latency_samples else (
            (1 - SMOOTHING) * self.latency + SMOOTHING * one_way)
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
