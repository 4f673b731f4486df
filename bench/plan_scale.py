"""CPU time of the collectives' pure choices at scale, up to the 10,000 inputs a reduce takes.

A reduce's plan places every input and links every slot (a chain, a binary tree, and a
stripe's chain placed in ring order), then completes; a chain again with the inputs that
share a node merged into one slot (docs/design.md §4, "Several inputs on one node"); a ring's
members are matched over the inputs' holders (each input on its own node, and each on 50 of
300 nodes); and a chain whose every input was on one node that died is repaired, every input
put again on another. All of it runs on the caller's event loop, so its time is time no
heartbeat, frame or transfer is served (docs/design.md §4). No daemon: the plan gets the
events a daemon would feed it.

Usage: python bench/plan_scale.py --inputs 1000,3000,10000
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence

from hoplite_client.wire.errors import PeerUnavailableError
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives.plan import (
    ChildLost,
    InputReady,
    Published,
    ReducePlan,
    ReduceSpec,
    ResultComplete,
    StartTask,
    TaskStarted,
)
from hoplited.collectives.ring import ring_members

SIZE = 1 << 20  # bytes per input: large enough for a tree (not combined inline)
NODES = 500  # the inputs' holders, round robin


def plan_seconds(k: int, depth: int, ring: Sequence[str] = (), merge: bool = False) -> float:
    """Seconds to place ``k`` ready inputs, start and link every task, and complete
    (``merge``: inputs on a node with a slot are added by it)."""
    inputs = [ObjectID.random() for _ in range(k)]
    window = (0, SIZE) if ring else None
    plan = ReducePlan(ObjectID.random(), inputs, k, "sum", "me", depth=lambda n, s: depth,
                      spec=ReduceSpec(window=window, ring=tuple(ring), merge=merge))
    start = time.perf_counter()
    tasks: list[StartTask] = []
    for i, oid in enumerate(inputs):
        holders = ("me",) if i == 0 else (f"n{i % NODES}",)
        out = plan.handle(InputReady(oid, holders, holders, SIZE, "<f4", (SIZE // 4,), b"v"))
        tasks += [ins for ins in out if isinstance(ins, StartTask)]
    for task in tasks:
        plan.handle(TaskStarted(task.slot, task.gen, b"t%d" % task.slot))
    plan.handle(ResultComplete())
    plan.handle(Published())
    return time.perf_counter() - start


def repair_seconds(k: int) -> float:
    """Seconds to repair a chain of ``k`` inputs, all on one node and each in a slot of its
    own (no merges), once the root's pull breaks with that node dead, and to place every
    slot again as the inputs are put again on another node."""
    inputs = [ObjectID.random() for _ in range(k)]
    plan = ReducePlan(ObjectID.random(), inputs, k, "sum", "me", depth=lambda n, s: 0,
                      spec=ReduceSpec(merge=False))
    for oid in inputs:
        for ins in plan.handle(InputReady(oid, ("n1",), ("n1",), SIZE, "<f4", (SIZE // 4,),
                                          b"v")):
            if isinstance(ins, StartTask):
                plan.handle(TaskStarted(ins.slot, ins.gen, b"t%d" % ins.slot))
    assert plan.shape is not None
    root = plan.slots[plan.shape.root]
    assert root.version is not None
    start = time.perf_counter()
    plan.handle(ChildLost(None, plan.shape.root, root.version, 0, True,
                          PeerUnavailableError("n1 died")))
    for oid in inputs:
        plan.handle(InputReady(oid, ("n2",), ("n2",), SIZE, "<f4", (SIZE // 4,), b"w"))
    return time.perf_counter() - start


def members_seconds(k: int, dense: bool) -> float:
    """Seconds to match ``k`` inputs to ring members."""
    rng = random.Random(1)
    pool = [f"n{j}" for j in range(300)]
    ready = {i: rng.sample(pool, 50) if dense else [f"n{i}"] for i in range(k)}
    start = time.perf_counter()
    ring_members(ready, k)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", default="1000,3000,10000",
                        help="comma-separated input counts (at most 10000)")
    counts = [int(x) for x in parser.parse_args().inputs.split(",")]
    ring = tuple(["me"] + [f"n{j}" for j in range(NODES)])
    print(f"{'inputs':>7} {'chain':>9} {'tree':>9} {'ring order':>11} {'merged':>9} "
          f"{'members':>9} {'members, dense':>15} {'repaired, put again':>20}")
    for k in counts:
        cells = [plan_seconds(k, 0), plan_seconds(k, max(1, k.bit_length() - 1)),
                 plan_seconds(k, 0, ring), plan_seconds(k, 0, merge=True),
                 members_seconds(k, False), members_seconds(k, True), repair_seconds(k)]
        widths = (8, 8, 10, 8, 8, 14, 19)
        print(f"{k:>7} " + " ".join(f"{c:>{w}.3f}" for c, w in zip(cells, widths, strict=True))
              + "  (s)")


if __name__ == "__main__":
    main()
