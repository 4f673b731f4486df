"""What this daemon has measured about its links: per-hop latency L and bandwidth B.

The reduce's shape, one chain or a binary tree, follows from the cost of a hop, L plus a
forwarding unit at B (docs/design.md §4). The original compiles L and B in; we measure them:
L as the least half round trip among the recent heartbeats, B as the most that recent
transfers of at least 1 MiB got while their bytes flowed (:class:`PullRate`).
"""

from __future__ import annotations

import math
from collections import deque

# Until measured: a LAN-ish hop and a 1 Gbit/s link; the first samples replace them. A node
# that only sends (a broadcast's source) may never measure B, and a 10 Gbit/s guess would
# make its shard take a binary tree for a 1 MiB broadcast on 1 Gbit/s links (docs/design.md §4).
DEFAULT_LATENCY = 100e-6
DEFAULT_BANDWIDTH = 125e6
# B is the largest of this many recent samples: a pull that shares its links with others
# measures its share, not the link, and the shapes are chosen for a link (docs/design.md §4,
# "The links' rate, measured while bytes flow").
BANDWIDTH_WINDOW = 16
# A pull of fewer chunks than this says too little about the link: its bytes may all have
# waited in the socket while the event loop was busy, and come in one read.
MIN_CHUNKS = 8
# Chunk rates are kept in buckets this many to an octave (4.4% wide) to take their median.
BUCKETS_PER_OCTAVE = 16
# L is the least half round trip of this many recent heartbeats (about 5 s of pings to 7
# peers): a ping waits behind whatever the links and the event loop are busy with, which a
# pipelined hop does not pay again; averaged, that wait makes L 0.4-4.2 ms on the emulated
# links, and a 1 MiB broadcast's shard would take a binary tree (2.6-4.0x S/RATE) where the
# chain runs at 1.6-2.0x (docs/design.md §4, "Tree shape").
LATENCY_WINDOW = 64
# A source that sends nothing for this many slices' worth of link time has stalled...
STALL_SLICES = 8
# ...but never sooner than this: a loaded 2-core host can pause a healthy sender for a few
# hundred milliseconds (8 daemons, their clients and the kernel's copies share the cores).
STALL_MIN = 1.0


class PullRate:
    """How fast one pull's bytes came while they flowed: the median, weighted by bytes, of
    its chunks' rates, each chunk's bytes over the time since the one before it (the first
    chunk's since the Pull was sent). A pull whose source is still producing its bytes (a
    partial sum waiting for an input, a result not begun) waits between chunks; the chunk
    after a wait brings few bytes at a low rate and falls below the median, where the whole
    pull's bytes over its time measure the producer, 3-4 times below the link after
    staggered allreduces (docs/design.md §4, "The links' rate, measured while bytes flow")."""

    __slots__ = ("_last", "_received", "_chunks", "_bytes")

    def __init__(self, began: float) -> None:
        self._last = began
        self._received = 0
        self._chunks = 0
        self._bytes: dict[int, int] = {}  # bucket of log2(rate) -> bytes at that rate

    def chunk(self, now: float, received: int) -> None:
        """``received`` bytes in all have come by ``now``."""
        size, gap = received - self._received, now - self._last
        self._last, self._received = now, received
        if size <= 0:
            return
        self._chunks += 1
        key = math.floor(math.log2(size / max(gap, 1e-6)) * BUCKETS_PER_OCTAVE)
        self._bytes[key] = self._bytes.get(key, 0) + size

    def rate(self, least: int) -> float | None:
        """Bytes per second, or None for fewer than ``least`` bytes or :data:`MIN_CHUNKS`
        chunks."""
        if self._received < least or self._chunks < MIN_CHUNKS:
            return None
        half, seen = self._received / 2, 0
        for key in sorted(self._bytes):  # the buckets hold every byte: the loop breaks
            seen += self._bytes[key]
            if seen >= half:
                break
        return float(2 ** ((key + 0.5) / BUCKETS_PER_OCTAVE))


class LinkModel:
    """L (seconds per hop), the least recent half round trip, and B (bytes per second), the
    largest of the recent pulls' rates."""

    def __init__(self) -> None:
        self.latency = DEFAULT_LATENCY
        self.bandwidth = DEFAULT_BANDWIDTH
        self.latency_samples = 0
        self.bandwidth_samples = 0
        self._one_way: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self._rates: deque[float] = deque(maxlen=BANDWIDTH_WINDOW)

    def observe_rtt(self, rtt: float) -> None:
        self._one_way.append(rtt / 2)
        self.latency = min(self._one_way)
        self.latency_samples += 1

    def observe_bandwidth(self, rate: float) -> None:
        self._rates.append(rate)
        self.bandwidth = max(self._rates)
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
