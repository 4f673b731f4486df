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

A third shape, two trees of halves (``two_tree_shape``, ``two_tree_fill``), lets every link
carry the object once over log2(n) levels: each half climbs a complete tree, and the second
tree makes every inner slot of the first a leaf. It costs about S/B + D'·(L + 2u/B),
D' = ceil(log2(n+1)): a hop passes a unit at half the rate, but there are only D' of them
(``two_tree_cost``). Two flows share every link, which the model does not charge, and two
plans run twice the tasks and edges, so two trees are taken only where the model saves a
fifth of the best single tree's time and some milliseconds (docs/design.md §4, "Two trees of
halves").

A broadcast to n receivers that say how many they are can run as two trees of halves too
(``half_parent``): complete binary trees in heap order under the object's holder, the i-th
receiver to ask at heap position i + 1 in tree 0 and, rotated by n // 2, in tree 1, so that
the inner positions 1..n // 2 hold different receivers in the two trees (docs/design.md §3,
"Two trees of halves for a broadcast").

This module gives the shapes and their costs; which shape a reduce or a broadcast takes (one
tree or two trees of halves) is :mod:`~.choose`'s to say (``reduce_shape``,
``broadcast_shape``), with this module's link model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The forwarding unit of a pipelined hop: the test bed's 64 KiB GSO segment (MTU 65000), which
# its tbf qdiscs pass whole (docs/simulation.md §1, "Pipelining").
HOP_UNIT = 64 * 1024
# When a reduce of every input runs as two trees of halves: where ``choose.two_trees_pay`` says
# they pay, always (where the halves are too large to send inline), or never.
TWO_TREE_MODES = ("auto", "always", "never")


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


def one_tree_cost(n: int, size: int, bandwidth: float, latency: float,
                  unit: int = HOP_UNIT) -> float:
    """Seconds the shape ``tree_depth`` picks takes: S/B + n·h for the chain, 2·S/B + D·h for
    the full tree."""
    hop = hop_cost(size, bandwidth, latency, unit)
    transfer = size / max(bandwidth, 1.0)
    depth = tree_depth(n, size, bandwidth, latency, unit)
    return transfer + n * hop if depth == 0 else 2 * transfer + depth * hop


def two_tree_cost(n: int, size: int, bandwidth: float, latency: float,
                  unit: int = HOP_UNIT) -> float:
    """Seconds two trees of halves take: S/B + ceil(log2(n+1))·(L + 2u/B), each hop passing
    one unit of a half at half the link's rate."""
    half_hop = latency + 2 * min(size // 2, unit) / max(bandwidth, 1.0)
    return size / max(bandwidth, 1.0) + math.ceil(math.log2(n + 1)) * half_hop


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


def pair_shape(n: int, leaves: int = 2) -> TreeShape:
    """A combiner's tree for ``n`` inputs, ``leaves`` of them late (2 ≤ leaves ≤ n): a root
    that adds no input of its own, over a chain of the first ``n - leaves`` inputs and a leaf
    for each of the last ``leaves`` (no chain when they are all). Slots in order: the chain
    0..n-leaves-1, the root n-leaves, the leaves after it. It lets a stripe's partial sum
    reach a node before that node puts its input (docs/design.md §4, "A pair for the last
    two inputs", "Three combiners")."""
    if not 2 <= leaves <= n:
        raise ValueError(f"a combiner's tree of {n} inputs cannot have {leaves} late leaves")
    root = n - leaves
    parent: list[int | None] = [root] * (n + 1)
    children: list[list[int]] = [[] for _ in range(n + 1)]
    for slot in range(1, root):  # the chain hangs on the left: each pulls the one before
        parent[slot - 1] = slot
        children[slot].append(slot - 1)
    parent[root] = None
    children[root] = ([root - 1] if root else []) + list(range(root + 1, n + 1))
    return TreeShape(parent, children, root)


# --- two trees of halves (docs/simulation.md §6, "Two trees of halves") ---
def complete_shape(n: int) -> TreeShape:
    """The complete binary tree of ``n`` slots (every level full but the last, which fills
    from the left), numbered in order. It has floor(n/2) inner slots, never more than leaves,
    so a second tree can make every inner slot of the first a leaf (``complementary``);
    ``tree_shape``'s even split has more (511 of 999)."""
    if n < 1:
        raise ValueError("a tree needs at least one slot")
    order: list[int] = []  # heap positions 1..n, in order
    stack: list[int] = []
    pos = 1
    while stack or pos <= n:
        while pos <= n:
            stack.append(pos)
            pos *= 2
        pos = stack.pop()
        order.append(pos)
        pos = 2 * pos + 1
    slot = {heap: i for i, heap in enumerate(order)}
    parent: list[int | None] = [None] * n
    children: list[list[int]] = [[] for _ in range(n)]
    for heap in range(2, n + 1):  # left child (even) before right child (odd)
        parent[slot[heap]] = slot[heap // 2]
        children[slot[heap // 2]].append(slot[heap])
    return TreeShape(parent, children, slot[1])


def complementary(shape: TreeShape) -> list[int]:
    """A bijection of slots, ``b[s]``: the slot in a second tree of the same shape for the
    input at slot ``s`` of the first, so that no input is an inner slot in both. Inner slots
    of the first go to leaves of the second, in order; the first's leaves fill the second's
    inner slots, then its remaining leaves."""
    inner = [s for s in range(shape.size) if shape.children[s]]
    leaves = [s for s in range(shape.size) if not shape.children[s]]
    if len(inner) > len(leaves):
        raise ValueError(f"{len(inner)} inner slots and {len(leaves)} leaves: no second tree "
                         f"can make every inner slot a leaf")
    b = [0] * shape.size
    for s, t in zip(inner, leaves, strict=False):
        b[s] = t
    for s, t in zip(leaves, inner + leaves[len(inner):], strict=True):
        b[s] = t
    return b


def two_tree_shape(n: int) -> TreeShape:
    """One of two trees of halves for ``n`` inputs: a complete tree of the first ``n - 1``
    slots under a root (slot ``n - 1``) with that tree as its only child. The root is the
    coordinator's own input where it has one, so its downlink carries one half per tree."""
    if n < 2:
        return tree_shape(n, 0)
    below = complete_shape(n - 1)
    parent = [*below.parent, None]
    parent[below.root] = n - 1
    return TreeShape(parent, [*below.children, [below.root]], n - 1)


def two_tree_fill(n: int, half: int) -> list[int]:
    """The non-root slots of ``two_tree_shape(n)`` in the order inputs take them in tree
    ``half`` (0 or 1): the i-th input placed takes slot i in tree 0 and its complementary slot
    in tree 1, so no input is inner in both."""
    if half not in (0, 1):
        raise ValueError(f"half {half} is not 0 or 1")
    order = list(range(n - 1))
    if half == 0 or n < 2:
        return order
    b = complementary(complete_shape(n - 1))
    return [b[s] for s in order]


# --- two trees of halves for a broadcast (docs/design.md §3) ---
def half_position(n: int, half: int, index: int) -> int:
    """The heap position (1 is the top) of the ``index``-th of ``n`` receivers in the tree of
    ``half``: tree 0 in order, tree 1 rotated by n // 2, so the receivers inner in tree 0
    (positions 1..n // 2) are leaves in tree 1."""
    if half not in (0, 1) or not 0 <= index < n:
        raise ValueError(f"receiver {index} of {n}, half {half}: out of range")
    return index + 1 if half == 0 else (index - n // 2) % n + 1


def half_receiver(n: int, half: int, position: int) -> int:
    """The index of the receiver at heap ``position`` of the tree of ``half`` (the inverse of
    ``half_position``)."""
    if half not in (0, 1) or not 1 <= position <= n:
        raise ValueError(f"position {position} of {n}, half {half}: out of range")
    return position - 1 if half == 0 else (position - 1 + n // 2) % n


def half_parent(n: int, half: int, index: int) -> int | None:
    """The index of the receiver the ``index``-th of ``n`` receivers pulls ``half`` from, or
    None: from a holder of the whole object (it is the top of that tree)."""
    up = half_position(n, half, index) // 2
    return None if up == 0 else half_receiver(n, half, up)
