"""A simulated allreduce: the real ``AllreducePlan`` chooses, the ring's real schedule runs.

The driver mirrors ``collectives/allreduce.py``: the caller's node waits for the inputs at
the shard and feeds them to the plan, which holds them for up to ``ring_wait`` and runs a
ring where ``ring_pays`` says so (docs/design.md §4, "Ring allreduce"), else the plain reduce
(:class:`~hoplited.sim.reduce.ReduceRun`) whose result every node gets. With ``pair`` (as
hoplited's ``--pair``) the plan may instead hold late inputs for a pair (docs/design.md §4,
"A pair for the last two inputs"): two reduces of halves, each coordinated on its combiner's
node, and every node gets both halves (hoplited's members fetch them into one composite).
A ring member's get returns once its own copy is whole, as hoplited's does, so the allreduce
ends when the last member's last segment lands.

The ring is timed from ``ring.ring_schedule`` segment by segment: a member sends its own
chunk, then each received segment once the whole of it is here (the input is added in place
before it goes on), one segment after another at the link's rate; a segment lands a hop after
its last byte leaves. Each member's stream is the only one on its uplink and its
successor's downlink (checked: the network carries no pull when the ring starts), so no
sharing is modelled. Failures are not modelled (docs/simulation.md §2).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives import stripes as s
from hoplited.collectives.layout import stripe_bounds
from hoplited.collectives.ring import ring_schedule
from hoplited.directory.state import Entry
from hoplited.sim.cluster import Cluster
from hoplited.sim.errors import SimulationError
from hoplited.sim.plan_driver import PlanDriver
from hoplited.sim.reduce import ReduceRun

# Hops from StartRing to a member's first byte: RingTask reaches the member, its RingOpen the
# successor, and the successor's answer comes back (the data connection is a standing one).
RING_SETUP_HOPS = 3
NOT_MODELLED = "is not modelled: the stripes or a failure"


def ring_times(sizes: tuple[int, int], n: int, rate: float, latency: float,
               start: float) -> list[float]:
    """When each member of a ring of ``n`` holds the whole result, if every member starts
    sending at ``start``; ``sizes``: the object's bytes and its item size."""
    size, itemsize = sizes
    plans = [ring_schedule(size, itemsize, n, p) for p in range(n)]
    sends = [[(lo, hi) for lo, hi in plan.first]
             + [(seg.lo, seg.hi) for seg in plan.receive if seg.forward] for plan in plans]
    for p in range(n):
        got = [(seg.lo, seg.hi) for seg in plans[p].receive]
        if got != sends[p - 1]:
            raise SimulationError(f"ring member {p} expects other segments than its "
                                  f"predecessor sends")
    ends: list[list[float]] = [[] for _ in range(n)]  # when segment k left member p
    for k in range(max(map(len, sends))):
        for p in range(n):
            if k >= len(sends[p]):
                continue
            first = len(plans[p].first)
            here = start if k < first else ends[p - 1][k - first] + latency
            begin = max(here, ends[p][-1] if ends[p] else start)
            lo, hi = sends[p][k]
            ends[p].append(begin + (hi - lo) / rate)
    return [ends[p - 1][-1] + latency for p in range(n)]


class AllreduceRun(PlanDriver[s.AllreducePlan, s.Event]):
    """One allreduce of ``inputs`` into ``result``, called on node ``me``; ``getters``: when
    each node (every one of the cluster's) asks for the result; ``start_get(node, oid)``
    starts a get of ``oid`` there (the plain reduce's result, or a pair's half);
    ``on_done(node, t)`` runs as a ring member holds it; ``pair``: the plan may choose a
    pair."""

    def __init__(self, cluster: Cluster, me: str, result: ObjectID, inputs: list[ObjectID],
                 getters: dict[str, float], ring_wait: float,
                 start_get: Callable[[str, ObjectID], None],
                 on_done: Callable[[str, float], None], pair: bool = True) -> None:
        self.cluster, self.me, self.result, self.getters = cluster, me, result, getters
        net = cluster.net
        super().__init__(s.AllreducePlan(result, inputs, "sum", ring_wait=ring_wait,
                                         striped=False, link=(net.rate, net.latency),
                                         pair=pair, nodes=tuple(getters)),
                         cluster.clock.after)
        self._inputs = list(dict.fromkeys(inputs))
        self._start_get, self._on_done = start_get, on_done
        self._ready_entries: dict[ObjectID, Entry] = {}  # the inputs ready so far, in order
        self.runs: list[ReduceRun] = []  # the plain reduce, or a pair's halves
        self.ring: tuple[str, ...] = ()  # the ring's members, if one ran
        self._arms = 0  # Arm instructions so far: only the last one's timer counts
        self.on(s.Arm, self._arm)
        self.on(s.StartRing, self._start_ring)
        self.on(s.Plain, self._plain)
        self.on(s.Assign, self._assign)
        self.ignore(s.Commit)  # members' gets end on their own copies
        self.refuse(NOT_MODELLED, s.Cleanup, s.Fail, s.Restart, s.Withdraw, s.WaitAgain,
                    s.Watch)

    @property
    def error(self) -> HopliteError | None:
        return next((run.error for run in self.runs if run.error is not None), None)

    def start(self) -> None:
        for oid in self._inputs:
            self.cluster.shard.wait_object(oid, functools.partial(self._ready, oid))

    def _ready(self, oid: ObjectID, entry: Entry) -> None:
        self._ready_entries[oid] = entry
        self.feed(s.InputReady(oid, tuple(entry.complete_holders()), entry.size,
                               entry.dtype, tuple(entry.shape), at=self.cluster.clock.now))

    def _arm(self, ins: s.Arm) -> None:
        """``GatherOver`` in ``ins.delay``, unless a later Arm replaces this one's timer."""
        self._arms += 1
        arm = self._arms
        self.later(ins.delay, lambda: self.feed(s.GatherOver()) if arm == self._arms
                   else None)

    def _start_ring(self, ins: s.StartRing) -> None:
        self._run_ring(tuple(node for node, _ in ins.members))

    def _plain(self, ins: s.Plain) -> None:
        """The plain reduce, coordinated here, fed the inputs heard ready so far; each node
        gets its result."""
        c = self.cluster
        here = any(copy.complete for oid in self._inputs
                   if (copy := c.copies.get((self.me, oid))) is not None)
        run = ReduceRun(c, self.me, self.result, list(self.plan.listed), everyone=True,
                        here=here)
        self.runs = [run]
        run.start(self._ready_entries)
        for node, when in self.getters.items():
            c.clock.at(when, functools.partial(self._start_get, node, self.result))

    def _assign(self, ins: s.Assign) -> None:
        """A pair's half to reduce (its first placement), or a member of a pair, whose gets
        start with each half's reduce."""
        if ins.pair and ins.stripe >= 0 and not ins.gen:
            self._run_half(ins.stripe, ins.node)
        elif ins.stripe >= 0:
            raise SimulationError(f"{ins} {NOT_MODELLED}")

    def _run_half(self, half: int, root: str) -> None:
        """``root`` coordinates the reduce of stripe ``half`` of a pair or trio (the plan's
        instruction reaches it a hop later), fed the inputs heard ready so far; each node
        gets that stripe."""
        c, entry = self.cluster, next(iter(self._ready_entries.values()))
        m = self.plan.stripes
        bounds = stripe_bounds(entry.size, np.dtype(entry.dtype).itemsize, m)
        run = ReduceRun(c, root, s.stripe_id(self.result, half), list(self.plan.listed),
                        window=bounds[half], combiner=True, late=m)
        self.runs.append(run)
        c.clock.after(c.net.latency, functools.partial(run.start, dict(self._ready_entries)))
        for node, when in self.getters.items():
            c.clock.at(max(when, c.clock.now + c.net.latency),
                       functools.partial(self._start_get, node, run.result))

    def _run_ring(self, members: tuple[str, ...]) -> None:
        """Time the ring from the moment StartRing leaves the caller's node."""
        c, entry = self.cluster, next(iter(self._ready_entries.values()))
        if any(c.net.up.values()) or any(c.net.down.values()):
            raise SimulationError("a ring sharing its links with pulls is not modelled")
        others = [node for node in self.getters if node not in members]
        if others:
            raise SimulationError(f"gets of a ring's result off the ring ({others}) are not "
                                  f"modelled")
        self.ring = members
        itemsize = np.dtype(entry.dtype).itemsize
        start = c.clock.now + RING_SETUP_HOPS * c.net.latency
        for node, t in zip(members, ring_times((entry.size, itemsize), len(members),
                                               c.net.rate, c.net.latency, start)):
            if node in self.getters:
                done = max(t, self.getters[node])
                c.clock.at(done, functools.partial(self._on_done, node, done))
