"""What the simulated drivers share: the clock, the links, the directory and the stores."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives import choose as c
from hoplited.collectives.tree import tree_fanout
from hoplited.sim.clock import Clock
from hoplited.sim.network import Copy, Network, Stream
from hoplited.sim.shard import Shard

# Every simulated put has this version: nothing is put twice without failures.
VERSION = b"sim-put"


def node_name(i: int) -> str:
    """The id of simulated node ``i``."""
    return f"n{i}"


@dataclass(eq=False)
class SlotPull:
    """A reduce slot's pull of a child's output into ``sink``, a buffer on the slot's node;
    ``input``: the input the slot adds (the other stripes' slots there add the same one).
    ``behind``: the pulls paused until this one is done (``Hurry``, docs/design.md §4, "The
    first combiner's chain goes first")."""

    input: ObjectID
    source: Copy
    sink: Copy
    stream: Stream | None = None
    done: bool = False
    paused: bool = False
    behind: list[SlotPull] = field(default_factory=list)


@dataclass
class Cluster:
    """The simulated cluster: ``copies`` is every node's store, by (node, object id);
    ``slot_pulls``: every reduce slot's pull of a child, by the slot's node."""

    clock: Clock
    net: Network
    shard: Shard
    copies: dict[tuple[str, ObjectID], Copy] = field(default_factory=dict)
    slot_pulls: defaultdict[str, list[SlotPull]] = field(
        default_factory=lambda: defaultdict(list))

    @classmethod
    def build(cls, rate: float, latency: float, segment: int, fanout: int,
              two_trees: str = "auto", sharing: str = "fair") -> Cluster:
        """Links of ``rate`` bytes/s and ``latency`` s per hop, shared as ``sharing`` says
        (``network.SHARING``); the shard lives on node 0. ``two_trees``: when a broadcast is
        taken as two trees of halves, as hoplited's ``--two-trees``."""
        clock = Clock()
        return cls(clock, Network(clock, rate, latency, segment, sharing),
                   Shard(clock, latency, fanout, node_name(0), lambda n, size: tree_fanout(
                       n, size, rate, latency, segment),
                       lambda n, size, dtype: c.bounds(c.broadcast_shape(c.Known(
                           n, size, dtype, link=(rate, latency),
                           settings=c.Settings(two_trees=two_trees))))))

    def put(self, node: str, oid: ObjectID, size: int, dtype: str,
            shape: tuple[int, ...]) -> None:
        """``oid`` exists on ``node`` before the clock starts, published at its shard (with
        its bytes if it is small, as a put does)."""
        inline = self._store(node, oid, size, self.clock.now)
        self.shard.state.publish(oid, node, size, dtype, list(shape), VERSION, inline)

    def put_at(self, when: float, node: str, oid: ObjectID, size: int, dtype: str,
               shape: tuple[int, ...]) -> None:
        """``oid`` is put on ``node`` at ``when``: whole there at once, published at its shard
        a hop later, which wakes whoever waits for it."""
        def put() -> None:
            inline = self._store(node, oid, size, when)
            self.shard.publish(oid, node, size, dtype, list(shape), VERSION, inline)
        self.clock.at(when, put)

    def _store(self, node: str, oid: ObjectID, size: int, when: float) -> bytes | None:
        """A whole copy of ``oid`` on ``node`` from ``when``; its bytes if it travels inline."""
        self.copies[(node, oid)] = copy = Copy(node, self.net.layout(size))
        copy.fill(when)
        return bytes(size) if size <= INLINE_MAX else None
