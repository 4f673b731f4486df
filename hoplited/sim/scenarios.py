"""The collectives of ``hoplite bench``, simulated: who puts what, who gets what, how long.

Each scenario sets up what its benchmark does (hoplited/tools/scenarios.py) and times
it the same way: from the moment every input exists until the last participant holds its
result. Broadcast: node 0 holds the object, every other node gets it. Reduce: every node
holds an input, node 0 reduces (sum) and gets the result. Allreduce: every node holds an
input, node 0 calls it and every node gets the result: a ring where hoplited's plan takes one
(:mod:`hoplited.sim.allreduce`), else the reduce whose result the gets chain behind while it
grows. Gather: every node holds an object, node 0 gets them all, ``concurrency`` at a time.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.ids import ObjectID
from hoplited.cluster.link_model import DEFAULT_LATENCY
from hoplited.collectives import choose
from hoplited.config import DaemonConfig
from hoplited.sim.allreduce import AllreduceRun
from hoplited.sim.cluster import Cluster, node_name
from hoplited.sim.errors import SimulationError
from hoplited.sim.fetch import Fetch
from hoplited.sim.network import MAX_MIN_NODES, SEGMENT
from hoplited.sim.reduce import ReduceRun

OPS = ("broadcast", "reduce", "allreduce", "gather")
# Objects are bytes: the reduce plan checks only that the dtype reduces, and compute is not
# modelled, so the element type does not matter.
DTYPE = "uint8"


@dataclass
class SimResult:
    """One simulated run: its settings, its latency (None if it failed) and its cost."""

    op: str
    nodes: int
    size: int
    rate_bps: float
    latency: float
    segment: int
    fanout: int
    seconds: float | None
    error: str | None
    events: int
    depth: int | None = None  # of the reduce tree (0: one chain)
    two_trees: bool = False  # the reduce ran, or the broadcast was taken, as two trees of halves
    ring: bool = False  # the allreduce ran as a ring
    combiners: int = 0  # the allreduce ran as a pair (2) or trio (3) of them (docs/design.md §4)
    interval: float = 0.0  # between the inputs' puts; the latency runs from the last
    sharing: str = "fair"  # how the links were shared (network.SHARING)

    @property
    def s_over_rate(self) -> float:
        """S/RATE in seconds: the time one link takes to carry the object once."""
        return self.size * 8 / self.rate_bps

    @property
    def ratio(self) -> float | None:
        """The latency as a multiple of S/RATE (docs/design.md §7)."""
        return None if self.seconds is None else self.seconds / self.s_over_rate


def object_id(name: str) -> ObjectID:
    """A fixed id per name: a simulation draws nothing at random."""
    return ObjectID(hashlib.blake2b(name.encode(), digest_size=20).digest())


def simulate(op: str, nodes: int, size: int, rate_bps: float, *,
             latency: float = DEFAULT_LATENCY, segment: int = SEGMENT,
             fanout: int = DaemonConfig.fanout, concurrency: int | None = None,
             two_trees: str = "auto", interval: float = 0.0,
             pair: bool = DaemonConfig.pair, sharing: str = "fair") -> SimResult:
    """Run ``op`` on ``nodes`` nodes with objects of ``size`` bytes over links of ``rate_bps``
    bit/s and ``latency`` s per hop; ``concurrency`` bounds a gather's gets (None: none);
    ``two_trees``: when the reduce runs, or a broadcast is taken, as two trees of halves, as
    hoplited's ``--two-trees`` decides (``choose.reduce_shape``, ``choose.broadcast_shape``
    on the simulated links; docs/simulation.md §6); ``interval`` > 0: a reduce's or an
    allreduce's inputs are put that far apart, as ``hoplite bench --arrival-interval`` puts
    them (the collective is called first, each node asks for the result once it has put its
    input, and the latency runs from the last put); ``pair``: an allreduce's plan may hold
    late inputs for a pair, as hoplited's ``--pair`` (docs/design.md §4); ``sharing``: how
    the links are shared among the pulls on them (``network.SHARING``, docs/simulation.md
    §7)."""
    if op not in OPS:
        raise SimulationError(f"unknown collective {op!r}; one of {', '.join(OPS)}")
    if nodes < 2 or size < 1 or fanout < 1 or (concurrency is not None and concurrency < 1):
        raise SimulationError(f"{nodes} nodes, {size} bytes, fan-out {fanout}, concurrency "
                              f"{concurrency}: need 2 nodes, 1 byte, 1 and 1 at least")
    if sharing == "maxmin" and nodes > MAX_MIN_NODES:
        raise SimulationError(f"max-min sharing recomputes every share at every change: at "
                              f"most {MAX_MIN_NODES} nodes, not {nodes}")
    if not 0 <= interval < math.inf or (interval and op not in ("reduce", "allreduce")):
        raise SimulationError(f"an arrival interval of {interval} s: staggered inputs are "
                              f"a reduce's or an allreduce's, at least 0 s apart")
    links, settings = (rate_bps / 8, latency), choose.Settings(two_trees=two_trees)
    halves = choose.bounds(choose.reduce_shape(choose.Known(
        nodes, size, DTYPE, "sum", links, settings))) if op == "reduce" else None
    if two_trees == "always" and (
            op not in ("reduce", "broadcast") or (op == "reduce" and halves is None)
            or (op == "broadcast" and isinstance(choose.broadcast_shape(choose.Known(
                nodes - 1, size, DTYPE, link=links, settings=settings)), choose.Tree))):
        raise SimulationError(f"two trees of halves are a shape of the reduce and of a "
                              f"broadcast to two receivers or more, for halves of more than "
                              f"{INLINE_MAX} bytes")
    c = Cluster.build(rate_bps / 8, latency, segment, fanout, two_trees, sharing)
    runs: list[ReduceRun] = []
    allreduce: AllreduceRun | None = None
    gets: list[Fetch] = []
    ring_done: dict[str, float] = {}
    put_times = [i * interval for i in range(nodes)]
    if op == "broadcast":
        oid = object_id("broadcast")
        c.put(node_name(0), oid, size, DTYPE, (size,))
        wanted = [(node_name(i), oid) for i in range(1, nodes)]
    else:
        ids = [object_id(f"{op}-{i}") for i in range(nodes)]
        for i, oid in enumerate(ids):
            if interval:
                c.put_at(put_times[i], node_name(i), oid, size, DTYPE, (size,))
            else:
                c.put(node_name(i), oid, size, DTYPE, (size,))
        if op == "gather":
            wanted = [(node_name(0), oid) for oid in ids]
        elif op == "allreduce":
            result = object_id(f"{op}-result")
            wanted = [(node_name(i), result) for i in range(nodes)]

            def get_result(node: str, oid: ObjectID) -> None:
                gets.extend(_start_gets(c, [(node, oid)], None, 0))
            allreduce = AllreduceRun(c, node_name(0), result, ids,
                                     {node: put_times[i] for i, (node, _) in enumerate(wanted)},
                                     DaemonConfig.ring_wait, get_result, ring_done.__setitem__,
                                     pair=pair)
            allreduce.start()
        else:
            result = object_id(f"{op}-result")
            if halves is not None:  # node 0 gets both halves
                runs = [ReduceRun(c, node_name(0), object_id(f"{op}-half-{h}"), ids,
                                  window=w, half=h)
                        for h, w in enumerate(halves)]
                wanted = [(node_name(0), run.result) for run in runs]
            else:
                runs = [ReduceRun(c, node_name(0), result, ids)]
                wanted = [(node_name(0), result)]
            for run in runs:
                run.start()
    if allreduce is None:  # a broadcast's gets say how many they are, as the bench's do
        gets = _start_gets(c, wanted, concurrency if op == "gather" else None,
                           len(wanted) if op == "broadcast" else 0)
    c.clock.run()
    if allreduce is not None:
        runs = allreduce.runs
    failed = [str(g.error) for g in gets if g.error is not None]
    for run in runs:
        if run.error is not None:
            failed.insert(0, f"the reduce failed: {run.error}")
    done = [g.done_at for g in gets if g.done_at is not None] + list(ring_done.values())
    if len(done) < len(wanted) and not failed:
        failed.append(f"the simulation stopped with {len(wanted) - len(done)} gets "
                      f"unfinished ({c.shard.waiting} waiting at the shard)")
    split = op == "broadcast" and c.shard.state.entries[wanted[0][1]].trees is not None
    return SimResult(op, nodes, size, rate_bps, latency, segment, fanout,
                     None if failed else max(done) - put_times[-1],
                     failed[0] if failed else None,
                     c.clock.events, runs[0].depth if runs else None,
                     halves is not None or split,
                     ring=allreduce is not None and bool(allreduce.ring), interval=interval,
                     sharing=sharing,
                     combiners=len(allreduce.runs) if allreduce is not None
                     and allreduce.plan.paired else 0)


def _start_gets(c: Cluster, wanted: list[tuple[str, ObjectID]],
                limit: int | None, receivers: int) -> list[Fetch]:
    """Start a get of each (node, id) in order, at most ``limit`` at a time (the next as one
    ends, like ``Client.gather``), each saying ``receivers``; the list grows as they start."""
    pending = list(reversed(wanted))
    gets: list[Fetch] = []

    def start_next(_: Fetch | None = None) -> None:
        if pending:
            node, oid = pending.pop()
            fetch = Fetch(c, node, oid, start_next, receivers)
            gets.append(fetch)
            fetch.start()

    for _ in range(len(wanted) if limit is None else min(limit, len(wanted))):
        start_next()
    return gets
