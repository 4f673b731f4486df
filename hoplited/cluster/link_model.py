"""What this daemon has measured about its links: per-hop latency L and bandwidth B.

The reduce tree's chain length is S / (B·L) (docs/design.md §4); the original compiled L and B in,
we measure them: L from heartbeat round trips, B from completed transfers of at least 1 MiB.
"""

from __future__ import annotations

# Until measured: a LAN-ish hop and a 10 Gbit/s-class link; the first samples replace them.
DEFAULT_LATENCY = 100e-6
DEFAULT_BANDWIDTH = 1.25e9
SMOOTHING = 0.2  # weight of a new sample in the moving averages


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

    def as_dict(self) -> dict[str, float]:
        return {"latency_s": self.latency, "bandwidth_Bps": self.bandwidth,
                "latency_samples": self.latency_samples,
                "bandwidth_samples": self.bandwidth_samples}
