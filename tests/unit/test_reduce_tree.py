"""The reduce tree's shape: chains, the chain-or-tree choice, in-order slots."""

from __future__ import annotations

import pytest

from hoplited.collectives.choose import two_trees_pay
from hoplited.collectives.tree import (
    HOP_UNIT,
    TreeShape,
    complementary,
    complete_shape,
    hop_cost,
    one_tree_cost,
    pair_shape,
    tree_depth,
    tree_fanout,
    tree_shape,
    two_tree_cost,
)


@pytest.mark.parametrize("n", [1, 2, 3, 8, 100])
def test_a_chain_pulls_from_the_previous_arrival(n: int) -> None:
    """Depth 0: slot i's only child is slot i-1 and the last slot is the root."""
    shape = tree_shape(n, 0)
    assert shape.root == n - 1
    assert shape.children == [[]] + [[i - 1] for i in range(1, n)]


@pytest.mark.parametrize("n,depth", [(7, 2), (15, 3), (8, 1), (20, 2), (64, 6)])
def test_left_subtree_always_holds_earlier_slots(n: int, depth: int) -> None:
    """Every child of a slot that is its left child has a smaller number (already placed)."""
    shape = tree_shape(n, depth)
    assert shape.parent.count(None) == 1 and shape.parent[shape.root] is None
    for slot, kids in enumerate(shape.children):
        assert len(kids) <= 2
        if kids:
            assert kids[0] < slot  # the left child
        for kid in kids[1:]:
            assert kid > slot


def test_balanced_tree_at_full_depth() -> None:
    """Seven slots at depth 2 form a perfect tree rooted at slot 3."""
    shape = tree_shape(7, 2)
    assert shape.root == 3
    assert shape.children[3] == [1, 5] and shape.children[1] == [0, 2]


GBIT = 125e6  # bytes per second
MiB = 1 << 20


@pytest.mark.parametrize("n, size, latency, depth, why", [
    (8, 64 * MiB, 1e-4, 0, "large object: hops are cheap next to S/B"),
    (8, 1 * MiB, 1e-4, 0, "8 hops (5 ms) cost less than a second S/B (8.4 ms)"),
    (8, 1 * MiB, 1e-3, 0, "8 hops of 1.5 ms (12.2 ms) still beat S/B + 3 hops (13 ms)"),
    (16, 1 * MiB, 1e-3, 4, "16 hops (24 ms) against S/B + 4 hops (14.5 ms): the full tree"),
    (15, 1024, 1e-4, 4, "tiny object: log2(16), a perfect tree"),
    (1000, 32 * MiB, 1e-4, 9, "1000 hops (620 ms) against S/B + 9 hops (274 ms)"),
    (256, 32 * MiB, 1e-4, 0, "256 hops (159 ms) are cheaper than a second S/B (268 ms)"),
    (1000, 256 * MiB, 1e-4, 0, "1000 hops (620 ms) against a second S/B (2.1 s)"),
    (2, 1024, 1e-4, 0, "two inputs: nothing to split"),
    (3, 1024, 1e-2, 2, "three tiny inputs over slow hops: both under the root"),
])
def test_chain_or_full_tree(n: int, size: int, latency: float, depth: int, why: str) -> None:
    """One chain (S/B + n·h) while it is the cheaper, else the full binary tree
    (2·S/B + D·h), with h the latency plus a 64 KiB unit at the link's rate."""
    assert tree_depth(n, size, GBIT, latency) == depth, why


@pytest.mark.parametrize("n, size, fanout", [
    (8, 32 * MiB, 1), (8, 1 * MiB, 1), (1000, 32 * MiB, 2), (1000, 256 * MiB, 1),
    (64, 1 * MiB, 2), (2, 1024, 1),
])
def test_gets_that_know_their_number_feed_one_or_two_each(n: int, size: int,
                                                         fanout: int) -> None:
    """The broadcast's fan-out follows the reduce's choice: 1 for a chain, 2 for a tree."""
    assert tree_fanout(n, size, GBIT, 1e-4) == fanout


def test_a_hop_costs_its_latency_and_one_unit() -> None:
    """h = L + u/B; an object smaller than the unit is forwarded whole."""
    assert hop_cost(MiB, GBIT, 1e-4) == pytest.approx(1e-4 + HOP_UNIT / GBIT)
    assert hop_cost(1000, GBIT, 1e-4) == pytest.approx(1e-4 + 1000 / GBIT)
    assert hop_cost(MiB, GBIT, 1e-4, unit=9000) == pytest.approx(1e-4 + 9000 / GBIT)


def test_a_chain_of_thousands_of_slots_is_built() -> None:
    """One chain is what large objects get; its length is the number of inputs, unbounded."""
    shape = tree_shape(5000, 0)
    assert shape.root == 4999 and shape.parent[0] == 1 and shape.children[4999] == [4998]


@pytest.mark.parametrize("n, root, children", [
    (1, 0, [[]]),
    (2, 1, [[], [0]]),  # too short to split: a chain
    (3, 1, [[], [0, 2], []]),
    (8, 6, [[], [0], [1], [2], [3], [4], [5, 7], []]),
])
def test_the_last_leaf_hangs_on_the_root(n: int, root: int,
                                         children: list[list[int]]) -> None:
    """``last_leaf``: a chain of n - 2 and the last slot, a leaf, both under the root, so the
    input that arrives last is pulled by the root itself; slots stay in order."""
    shape = tree_shape(n, 0, last_leaf=True)
    assert shape.root == root and shape.children == children


@pytest.mark.parametrize("n, root, children", [
    (2, 0, [[1, 2], [], []]),
    (3, 1, [[], [0, 2, 3], [], []]),
    (8, 6, [[], [0], [1], [2], [3], [4], [5, 7, 8], [], []]),
])
def test_a_combiner_root_takes_the_chain_and_the_last_two(n: int, root: int,
                                                         children: list[list[int]]) -> None:
    """``pair_shape``: n + 1 slots, the root adding no input; a chain of n - 2, then the
    root, then a leaf for each of the last two, in order."""
    shape = pair_shape(n)
    assert shape.root == root and shape.children == children
    assert all(shape.parent[c] == p for p, cs in enumerate(children) for c in cs)


@pytest.mark.parametrize("n, root, children", [
    (3, 0, [[1, 2, 3], [], [], []]),
    (8, 5, [[], [0], [1], [2], [3], [4, 6, 7, 8], [], [], []]),
])
def test_a_trio_s_combiner_root_takes_the_chain_and_the_last_three(
        n: int, root: int, children: list[list[int]]) -> None:
    shape = pair_shape(n, 3)
    assert shape.root == root and shape.children == children
    assert all(shape.parent[c] == p for p, cs in enumerate(children) for c in cs)


@pytest.mark.parametrize("n, leaves", [(1, 2), (2, 3), (4, 1)])
def test_a_combiner_needs_two_late_inputs_at_least_and_no_more_than_it_has(
        n: int, leaves: int) -> None:
    with pytest.raises(ValueError):
        pair_shape(n, leaves)


def test_the_last_leaf_leaves_trees_alone() -> None:
    """A tree (depth > 0) already hangs late inputs on the right: unchanged."""
    assert tree_shape(15, 3, last_leaf=True) == tree_shape(15, 3)


# --- two trees of halves (docs/simulation.md §6) ---
def _depth(shape: TreeShape) -> int:
    """Levels below the root on the longest path."""
    def below(slot: int) -> int:
        return max((1 + below(c) for c in shape.children[slot]), default=0)
    return below(shape.root)


@pytest.mark.parametrize("n, root, inner, depth", [
    (1, 0, 0, 0),
    (2, 1, 1, 1),
    (3, 1, 1, 1),
    (7, 3, 3, 2),
    (8, 4, 4, 3),
    (999, 511, 499, 9),
    (1000, 511, 500, 9),
])
def test_complete_shape(n: int, root: int, inner: int, depth: int) -> None:
    """Heap-shaped, in order: floor(n/2) inner slots, depth floor(log2 n), and every left
    child numbered before its parent (inputs can pull their left subtree at once)."""
    shape = complete_shape(n)
    assert shape.root == root and shape.parent[root] is None
    assert sum(1 for kids in shape.children if kids) == inner == n // 2
    assert _depth(shape) == depth
    for slot, kids in enumerate(shape.children):
        assert len(kids) <= 2
        if kids:
            assert kids[0] < slot
        assert all(kid > slot for kid in kids[1:])
        assert all(shape.parent[kid] == slot for kid in kids)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 100, 999, 1000])
def test_complementary_trees_share_no_inner_slot(n: int) -> None:
    """Every input inner in one tree is a leaf in the other: no downlink carries more than
    two halves."""
    shape = complete_shape(n)
    b = complementary(shape)
    assert sorted(b) == list(range(n))
    inner = {s for s in range(n) if shape.children[s]}
    assert not [s for s in range(n) if s in inner and b[s] in inner]


def test_no_complement_for_an_evenly_split_tree() -> None:
    """tree_shape's even split of 999 slots has 511 inner slots and 488 leaves."""
    with pytest.raises(ValueError, match="511 inner slots and 488 leaves"):
        complementary(tree_shape(999, 9))


@pytest.mark.parametrize("n, size, bandwidth, latency, pay, why", [
    (1000, 32 * MiB, GBIT, 1e-4, True, "the tree's second S/B (542 ms) against 280 ms"),
    (256, 32 * MiB, GBIT, 1e-4, True, "256 hops of the chain (428 ms) against 279 ms"),
    (64, 32 * MiB, GBIT, 1e-4, False, "64 hops (308 ms) against 277 ms: 10% saved, less "
                                     "than two flows per link lose on the test bed"),
    (1000, 256 * MiB, GBIT, 1e-4, True, "1000 hops (2.77 s) against 2.16 s: 22% saved"),
    (64, 256 * MiB, GBIT, 1e-4, False, "64 hops are 1.5% of 2.15 s: not worth a second plan"),
    (8, 32 * MiB, GBIT, 1e-4, False, "8 hops: the chain is as good (273 ms either way)"),
    (16, 1 * MiB, GBIT, 1e-4, False, "23% saved, but 4.3 ms: under the control it costs"),
    (64, 1 * MiB, 125e5, 1e-4, True, "100 Mbit/s: 200 ms against 158 ms, 42 ms saved"),
    (64, 1 * MiB, GBIT, 1e-2, False, "slow hops: two trees' 7 (86 ms) against the full "
                                     "tree's 6 and a second S/B (80 ms)"),
    (8, 64 * MiB, 2e9, 5e-5, False, "loopback: hops are nothing next to S/B"),
    (2, 256 * MiB, GBIT, 1e-2, False, "two inputs: nothing to split"),
])
def test_two_trees_pay_where_they_save_a_fifth_and_some_milliseconds(
        n: int, size: int, bandwidth: float, latency: float, pay: bool, why: str) -> None:
    """Two trees of halves (S/B + ceil(log2(n+1))·(L + 2u/B)) replace the best single shape
    only where they save a fifth of its time and 10 ms."""
    assert two_trees_pay(n, size, bandwidth, latency) is pay, why


def test_the_two_costs_follow_their_formulas() -> None:
    """The chain is S/B + n·h; two trees pay ceil(log2(n+1)) hops of a unit at half rate."""
    size, hop = 8 * MiB, hop_cost(8 * MiB, GBIT, 1e-3)
    assert one_tree_cost(4, size, GBIT, 1e-3) == pytest.approx(size / GBIT + 4 * hop)
    assert two_tree_cost(4, size, GBIT, 1e-3) == pytest.approx(
        size / GBIT + 3 * (1e-3 + 2 * HOP_UNIT / GBIT))
