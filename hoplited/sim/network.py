"""Links and pulls of the simulated cluster: shared uplinks and downlinks, pipelining.

Every node has an uplink and a downlink of ``rate`` bytes/s, shared in one of two ways
(docs/simulation.md §7). ``fair``, the default: a pull gets the smaller of its two fair shares,
its source's uplink divided among the pulls active on it, its receiver's downlink divided
among those active on it. Shares change only when a pull starts or stops, so only the pulls on
those two links are touched, and capacity a pull leaves unused (held back elsewhere, or
waiting for its source's next bytes) is not handed to the others. ``maxmin``: the max-min
fair shares of the pulls sending at that moment, as TCP flows roughly settle: a pull held back
on one link leaves the rest of the other to the pulls beside it, and a pull waiting for its
source holds nothing. Every change of a pull's state recomputes every share, so it is meant
for tens of nodes, not a thousand.

Objects move in blocks, the unit of events: at most ``BLOCKS`` per object, none smaller than a
``segment``. Forwarding is cut-through at segment granularity, as the real watermark is
(docs/design.md §3): a pull may start sending block i once the first segment of it is at its
source, and cannot finish before the block's last byte landed there plus one segment's time on
the wire. Each hop adds ``latency``. So a chain of n hops costs about S/rate + n·(latency +
segment/rate), whatever the block size; blocks only bound the number of events.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Literal

from hoplited.sim.clock import Clock
from hoplited.sim.errors import SimulationError

# Blocks per object: 64 keeps N = 1000 at about a million events (seconds of CPU) while a
# block of a 256 MiB object (4 MiB) is the reduce's compute step (collectives/worker.py).
BLOCKS = 64
# The test bed's unit of forwarding: one 64 KiB GSO packet on its MTU 65000 links, which the
# tbf qdiscs pass whole (hoplited/tools/testbed.py, MIN_BURST_BYTES).
SEGMENT = 64 * 1024
# One-way latencies before a pull's first byte leaves its source: TCP connect, the Hello /
# Welcome and Auth / Accepted exchanges (hoplite_client/net/handshake.py), then the Pull.
PULL_SETUP_HOPS = 7
# How the links are shared among the pulls on them (module docstring).
SHARING = ("fair", "maxmin")
# Max-min recomputes every share at every change, so its cost grows with the square of the
# nodes: 14 s of CPU for a broadcast at N = 128, about a minute at this many.
MAX_MIN_NODES = 256


def max_min_shares(pulls: Sequence[tuple[str, str]], rate: float) -> list[float]:
    """The max-min fair rate of each pull (source node, sink node) over uplinks and downlinks
    of ``rate`` each, by progressive filling: the link that offers its pulls the least fixes
    them at that share, which the other link of each then has less of to offer the rest."""
    rates = [0.0] * len(pulls)
    links: dict[tuple[str, str], set[int]] = {}
    for i, (source, sink) in enumerate(pulls):
        links.setdefault(("up", source), set()).add(i)
        links.setdefault(("down", sink), set()).add(i)
    left = dict.fromkeys(links, rate)
    offer = {key: rate / len(flows) for key, flows in links.items()}
    heap = [(share, key) for key, share in offer.items()]
    heapq.heapify(heap)
    while heap:
        share, key = heapq.heappop(heap)
        flows = links[key]
        if not flows or share != offer[key]:
            continue  # stale: the link lost pulls to another since this entry
        for i in flows:
            rates[i] = share
            source, sink = pulls[i]
            other = ("down", sink) if key[0] == "up" else ("up", source)
            left[other] -= share
            links[other].discard(i)
            if links[other]:  # never below this share: rounding must not undo the order
                offer[other] = max(left[other] / len(links[other]), share)
                heapq.heappush(heap, (offer[other], other))
        flows.clear()
    return rates


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


State = Literal["idle", "starting", "sending", "draining", "finishing", "done", "stopped"]


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
        if self.state == "stopped":
            return
        self.source.follow(self._poke)
        if self.i == self.sink.layout.count:
            self._end()
        else:
            self._poke()

    def stop(self) -> None:
        """Cancel the pull where it is, as a daemon cancels a pull task: a block on the wire
        does not land, and a new pull of the sink resumes from its watermark."""
        if self.state in ("done", "stopped"):
            return
        sending = self.state == "sending"
        if self in self.net.up[self.source.node]:
            self.net.deactivate(self)
        self.state = "stopped"
        self.gen += 1
        if len(self.sink.ready) > len(self.sink.full):
            self.sink.ready.pop()  # its first segment was announced; it never lands whole
        if sending:
            self.net.sending_changed()

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
        if self.state == "stopped":
            return
        if self.state == "idle" and i < len(src.ready):
            self.state = "starting"
            clock.at(src.ready[i], self._start)
        elif self.state == "draining" and i < len(src.full):
            self.state = "finishing"
            head = self.sink.layout.head(i)
            clock.at(src.full[i] + head / self.rate, self._finish)

    def _start(self) -> None:
        if self.state == "stopped":
            return
        self.net.activate(self)
        self._send()

    def _send(self) -> None:
        """Put block i on the wire; its first segment lands one segment and a hop later."""
        now, layout = self.net.clock.now, self.sink.layout
        self.state, self.left, self.since = "sending", float(layout.length(self.i)), now
        self.net.sending_changed()
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
        self.net.sending_changed()
        self._poke()

    def _finish(self) -> None:
        """Block i left; it is whole at the sink a hop later. Go on with the next one."""
        if self.state == "stopped":
            return
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

    def __init__(self, clock: Clock, rate: float, latency: float, segment: int,
                 sharing: str = "fair") -> None:
        if rate <= 0 or latency < 0 or segment < 1:
            raise SimulationError(f"rate {rate}, latency {latency} or segment {segment} "
                                  f"out of range")
        if sharing not in SHARING:
            raise SimulationError(f"links shared {sharing!r}: one of {', '.join(SHARING)}")
        self.clock, self.rate, self.latency, self.segment = clock, rate, latency, segment
        self.max_min = sharing == "maxmin"
        # insertion-ordered (dicts, not sets): same-time events then happen in one order,
        # whatever the streams' addresses
        self.up: defaultdict[str, dict[Stream, None]] = defaultdict(dict)
        self.down: defaultdict[str, dict[Stream, None]] = defaultdict(dict)

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
        self.up[s.source.node][s] = None
        self.down[s.sink.node][s] = None
        self._reshare(s)

    def deactivate(self, s: Stream) -> None:
        self.up[s.source.node].pop(s, None)
        self.down[s.sink.node].pop(s, None)
        self._reshare(s)

    def sending_changed(self) -> None:
        """A pull put a block on the wire, or its block left and it waits (for the block's
        end at its source, or the next block): under max-min every share is recomputed, as it
        now takes one or gives its own back."""
        if not self.max_min:
            return
        sending = [t for ts in self.up.values() for t in ts if t.state == "sending"]
        rates = max_min_shares([(t.source.node, t.sink.node) for t in sending], self.rate)
        for t, r in zip(sending, rates):
            t.reshare(r)

    def _reshare(self, s: Stream) -> None:
        """New shares for the pulls on ``s``'s two links (``s`` included); under max-min the
        pulls' states decide, not their activity."""
        if self.max_min:
            return
        up, down, rate = self.up, self.down, self.rate
        for t in {**up[s.source.node], **down[s.sink.node], s: None}:
            t.reshare(rate / max(len(up[t.source.node]), len(down[t.sink.node]), 1))
