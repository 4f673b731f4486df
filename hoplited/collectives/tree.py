"""The shape of a reduce or of a broadcast that knows its receivers: one chain, or a binary
tree (docs/design.md §4), slots in order.

A pipelined hop costs h = L + u/B: the latency L plus the time to pass on one forwarding unit
u (a 64 KiB GSO segment on the test bed) at the link bandwidth B. A chain of n slots costs
about S/B + n·h (every link carries the object once); a binary tree of depth D about
2·S/B + D·h (an inner slot's downlink carries two partial sums). A tree with chains for
leaves pays the tree's 2·S/B and more hops than the full tree, so the choice is one or the
other: the chain while it is the cheaper, else the full tree, D = floor(log2(n+1)).
Slots are numbered by in-order traversal and the i-th input to become ready takes slot i:
every slot's left subtree holds only earlier slots, so a new input can start pulling its left
child at once, and late inputs fill the right side. A chain hangs on the left, so in a chain
each input pulls from the one that arrived before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The forwarding unit of a pipelined hop: the test bed's 64 KiB GSO segment (MTU 65000), which
# its tbf qdiscs pass whole (docs/simulation.md §1, "Pipelining").
HOP_UNIT = 64 * 1024


@dataclass(frozen=True)
class TreeShape:
    """Parent and children of every slot; ``root`` is the slot whose output is the result."""

    parent: list[int | None]
    children: list[list[int]]
    root: int

    @property
    def size(self) -> int:
        return len(self.parent)


def hop_cost(size: int, bandwidth: float, latency: float, unit: int = HOP_UNIT) -> float:
    """Seconds a pipelined hop adds: the latency and one forwarding unit at ``bandwidth``."""
    return latency + min(size, unit) / max(bandwidth, 1.0)


def tree_fanout(n: int, size: int, bandwidth: float, latency: float,
                unit: int = HOP_UNIT) -> int:
    """How many receivers each holder should feed when ``n`` nodes get an object of ``size``
    bytes together: 1 (one chain) while the chain is the cheaper, else 2 (a binary tree).
    The costs are the reduce's: an inner node's uplink carries the object twice."""
    return 2 if tree_depth(n, size, bandwidth, latency, unit) else 1


def tree_depth(n: int, size: int, bandwidth: float, latency: float,
               unit: int = HOP_UNIT) -> int:
    """D for ``n`` inputs of ``size`` bytes over links of ``bandwidth`` B/s and ``latency`` s,
    forwarded in units of ``unit`` bytes: 0 (one chain) or the full binary tree's depth."""
    if n <= 2:
        return 0
    hop = hop_cost(size, bandwidth, latency, unit)
    full = math.floor(math.log2(n + 1))
    transfer = size / max(bandwidth, 1.0)
    return 0 if transfer + n * hop <= 2 * transfer + full * hop else full


@dataclass
class _Node:
    left: _Node | None
    right: _Node | None
    slot: int = -1


def _build(count: int, depth: int) -> _Node | None:
    if count == 0:
        return None
    if depth <= 0:  # a chain, hanging on the left; built in a loop: chains may be long
        chain = None
        for _ in range(count):
            chain = _Node(chain, None)
        return chain
    rest = count - 1
    left = (rest + 1) // 2
    return _Node(_build(left, depth - 1), _build(rest - left, depth - 1))


def tree_shape(n: int, depth: int, last_leaf: bool = False) -> TreeShape:
    """The tree for ``n`` slots at ``depth`` (≤ 0: one chain), numbered in order.
    ``last_leaf``: a chain of ``n`` ≥ 3 ends as a chain of ``n - 2`` and a leaf, both children
    of the root, so the last input pulled is pulled by the root itself (an allreduce whose
    root is computed in place, docs/design.md §4, "The last input hangs on the root")."""
    if n < 1:
        raise ValueError("a reduce needs at least one input")
    if last_leaf and depth <= 0 and n >= 3:
        root: _Node | None = _Node(_build(n - 2, 0), _Node(None, None))
    else:
        root = _build(n, depth)
    order: list[_Node] = []
    stack: list[_Node] = []
    node = root
    while stack or node is not None:  # iterative in-order: chains may be long
        while node is not None:
            stack.append(node)
            node = node.left
        node = stack.pop()
        node.slot = len(order)
        order.append(node)
        node = node.right
    parent: list[int | None] = [None] * n
    children: list[list[int]] = [[] for _ in range(n)]
    for nd in order:
        for child in (nd.left, nd.right):
            if child is not None:
                parent[child.slot] = nd.slot
                children[nd.slot].append(child.slot)
    assert root is not None
    return TreeShape(parent, children, root.slot)
