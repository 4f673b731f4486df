"""Links and pulls of the simulated cluster: fair-shared uplinks and downlinks, pipelining.

Every node has an uplink and a downlink of ``rate`` bytes/s. A pull that is sending gets the
smaller of its two fair shares: its source's uplink divided among the pulls sending on it,
its receiver's downlink divided among those receiving on it. Shares change only when a pull
starts or stops sending, so only the pulls on those two links are touched (capacity a pull
leaves unused because it is held back elsewhere is not handed to the others).

Objects move in blocks, the unit of events: at most ``BLOCKS`` per object, none smaller than a
``segment``. Forwarding is cut-through at segment granularity, as the real watermark is
(docs/design.md §3): a pull may start sending block i once the first segment of it is at its
source, and cannot finish before the block's last byte landed there plus one segment's time on
the wire. Each hop adds ``latency``. So a chain of n hops costs about S/rate + n·(latency +
segment/rate), whatever the block size; blocks only bound the number of events.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Literal

from hoplited.sim.clock import Clock
from hoplited.sim.errors import SimulationError

# Blocks per object: 64 keeps N = 1000 at about a million events (seconds of CPU) while a
# block of a 256 MiB object (4 MiB) is the reduce's compute step (collectives/worker.py).
BLOCKS = 64
# The test bed's unit of forwarding: one 64 KiB GSO packet on its MTU 65000 links, which the
# tbf qdiscs pass whole (hoplite_client/tools/testbed.py, MIN_BURST_BYTES).
SEGMENT = 64 * 1024
# One-way latencies before a pull's first byte leaves its source: TCP connect, the Hello /
# Welcome and Auth / Accepted exchanges (hoplite_client/net/handshake.py), then the Pull.
PULL_SETUP_HOPS = 7


class Layout:
    """How an object of ``size`` bytes is cut into blocks of ``block`` bytes."""

    __slots__ = ("size", "block", "segment", "count")

    def __init__(self, size: int, segment: int) -> None:
        self.size, self.segment = size, segment
        self.block = max(segment, -(-size // BLOCKS), 1)
        self.count = max(1, -(-size // self.block))

    def length(self, i: int) -> int:
        """Bytes in block ``i``."""
        return min(self.block, self.size - i * self.block)

    def head(self, i: int) -> int:
        """Bytes of block ``i`` that must land before any of it is forwarded."""
        return min(self.segment, self.length(i))

    def held(self, blocks: int) -> int:
        """Bytes in the first ``blocks`` blocks."""
        return min(self.size, blocks * self.block)


class Copy:
    """One node's copy of an object: for each block, in order, when its first segment
    (``ready``) and all of it (``full``) are here. Times may lie ahead of the clock: they are
    fixed when the block starts (finishes) leaving its source."""

    __slots__ = ("node", "layout", "ready", "full", "_followers")

    def __init__(self, node: str, layout: Layout) -> None:
        self.node, self.layout = node, layout
        self.ready: list[float] = []
        self.full: list[float] = []
        self._followers: list[Callable[[], None]] = []

    @property
    def complete(self) -> bool:
        return len(self.full) == self.layout.count

    def follow(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` whenever a block's time is added."""
        self._followers.append(fn)

    def add_ready(self, when: float) -> None:
        self.ready.append(when)
        self._tell()

    def add_full(self, when: float) -> None:
        self.full.append(when)
        self._tell()

    def fill(self, when: float) -> None:
        """Every block not here yet is here at ``when`` (a put, an inline object)."""
        count = self.layout.count
        self.ready += [when] * (count - len(self.ready))
        self.full += [when] * (count - len(self.full))
        self._tell()

    def when_complete(self, fn: Callable[[float], None]) -> None:
        """Call ``fn(t)`` once, as soon as the time ``t`` the copy is complete is known."""
        called = False

        def check() -> None:
            nonlocal called
            if not called and self.complete:
                called = True
                fn(self.full[-1])
        self.follow(check)
        check()

    def _tell(self) -> None:
        for fn in self._followers:
            fn()


State = Literal["idle", "starting", "sending", "draining", "finishing", "done"]


class Stream:
    """A pull of ``source`` into ``sink`` from the sink's watermark on, block by block:
    idle (waiting for a block's first segment at the source) → sending (its bytes at the
    fair share) → draining (waiting for the block's end at the source) → the next block."""

    __slots__ = ("net", "source", "sink", "on_end", "i", "state", "rate", "left", "since",
                 "gen")

    def __init__(self, net: Network, source: Copy, sink: Copy,
                 on_end: Callable[[], None]) -> None:
        self.net, self.source, self.sink, self.on_end = net, source, sink, on_end
        self.i = len(sink.full)  # resume where the sink stopped
        self.state: State = "idle"
        self.rate = net.rate
        self.left = 0.0  # bytes of block i still to send
        self.since = 0.0  # when ``left`` was last brought up to date
        self.gen = 0  # bumped when the pending "sent" event is replaced

    def begin(self) -> None:
        """The pull reached its source: send what is there, follow the rest."""
        self.source.follow(self._poke)
        if self.i == self.sink.layout.count:
            self._end()
        else:
            self._poke()

    def reshare(self, rate: float) -> None:
        """The fair share changed: a block being sent finishes sooner or later."""
        if rate == self.rate:
            return
        if self.state == "sending":
            now = self.net.clock.now
            self.left = max(0.0, self.left - (now - self.since) * self.rate)
            self.since = now
            self._schedule_sent(rate)
        self.rate = rate

    def _poke(self) -> None:
        """The source has more: start or finish the current block if it was waiting."""
        src, i, clock = self.source, self.i, self.net.clock
        if self.state == "idle" and i < len(src.ready):
            self.state = "starting"
            clock.at(src.ready[i], self._start)
        elif self.state == "draining" and i < len(src.full):
            self.state = "finishing"
            head = self.sink.layout.head(i)
            clock.at(src.full[i] + head / self.rate, self._finish)

    def _start(self) -> None:
        self.net.activate(self)
        self._send()

    def _send(self) -> None:
        """Put block i on the wire; its first segment lands one segment and a hop later."""
        now, layout = self.net.clock.now, self.sink.layout
        self.state, self.left, self.since = "sending", float(layout.length(self.i)), now
        self.sink.add_ready(now + layout.head(self.i) / self.rate + self.net.latency)
        self._schedule_sent(self.rate)

    def _schedule_sent(self, rate: float) -> None:
        self.gen += 1
        gen = self.gen
        self.net.clock.after(self.left / rate, lambda: self._sent(gen))

    def _sent(self, gen: int) -> None:
        if gen != self.gen or self.state != "sending":
            return  # superseded by a change of share
        self.state = "draining"
        self._poke()

    def _finish(self) -> None:
        """Block i left; it is whole at the sink a hop later. Go on with the next one."""
        now = self.net.clock.now
        self.sink.add_full(now + self.net.latency)
        self.i += 1
        if self.i == self.sink.layout.count:
            self.net.deactivate(self)
            self._end()
        elif self.i < len(self.source.ready) and self.source.ready[self.i] <= now:
            self._send()  # still sending: the shares stay as they are
        else:
            self.net.deactivate(self)
            self.state = "idle"
            self._poke()

    def _end(self) -> None:
        self.state = "done"
        self.net.clock.at(self.sink.full[-1], self.on_end)


class Network:
    """Every node's uplink and downlink (``rate`` bytes/s each) and the pulls sending on them;
    ``latency``: seconds per hop, for data and control messages alike."""

    def __init__(self, clock: Clock, rate: float, latency: float, segment: int) -> None:
        if rate <= 0 or latency < 0 or segment < 1:
            raise SimulationError(f"rate {rate}, latency {latency} or segment {segment} "
                                  f"out of range")
        self.clock, self.rate, self.latency, self.segment = clock, rate, latency, segment
        self.up: defaultdict[str, set[Stream]] = defaultdict(set)
        self.down: defaultdict[str, set[Stream]] = defaultdict(set)

    def layout(self, size: int) -> Layout:
        return Layout(size, self.segment)

    def pull(self, source: Copy, sink: Copy, on_end: Callable[[], None]) -> Stream:
        """Start pulling ``source`` into ``sink`` (from its watermark): the first byte leaves
        after the connection's handshake; ``on_end`` runs when the sink holds every byte."""
        if source.node == sink.node:
            raise SimulationError(f"a pull within node {source.node} is not modelled")
        stream = Stream(self, source, sink, on_end)
        self.clock.after(PULL_SETUP_HOPS * self.latency, stream.begin)
        return stream

    def activate(self, s: Stream) -> None:
        self.up[s.source.node].add(s)
        self.down[s.sink.node].add(s)
        self._reshare(s)

    def deactivate(self, s: Stream) -> None:
        self.up[s.source.node].discard(s)
        self.down[s.sink.node].discard(s)
        self._reshare(s)

    def _reshare(self, s: Stream) -> None:
        """New shares for the pulls on ``s``'s two links (``s`` included)."""
        up, down, rate = self.up, self.down, self.rate
        for t in up[s.source.node] | down[s.sink.node] | {s}:
            t.reshare(rate / max(len(up[t.source.node]), len(down[t.sink.node]), 1))
