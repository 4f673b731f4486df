"""Simulated time: a heap of (time, callback), run in order, FIFO among equal times."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable


class Clock:
    """The simulation's only notion of time; ``now`` moves as callbacks run."""

    def __init__(self) -> None:
        self.now = 0.0
        self.events = 0  # callbacks run so far (the cost of a simulation)
        self._heap: list[tuple[float, int, Callable[[], object]]] = []
        self._seq = itertools.count()

    def at(self, when: float, fn: Callable[[], object]) -> None:
        """Run ``fn`` at ``when`` (at once, after what is due now, if ``when`` has passed)."""
        heapq.heappush(self._heap, (max(when, self.now), next(self._seq), fn))

    def after(self, delay: float, fn: Callable[[], object]) -> None:
        """Run ``fn`` ``delay`` seconds from now."""
        self.at(self.now + delay, fn)

    def run(self) -> None:
        """Run callbacks in time order until none is left."""
        heap = self._heap
        while heap:
            self.now, _, fn = heapq.heappop(heap)
            self.events += 1
            fn()
