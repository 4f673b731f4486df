"""The reduce tree's shape: chains, depth formula, in-order slots."""

from __future__ import annotations

import pytest

from hoplited.collectives.tree import tree_depth, tree_shape


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


def test_depth_formula() -> None:
    """Large objects on fast links give chains; tiny objects give trees of log depth."""
    assert tree_depth(8, 64 << 20, 125e6, 1e-4) == 0
    assert tree_depth(15, 1024, 125e6, 1e-4) == 4  # log2(16): a perfect tree
    assert tree_depth(2, 1024, 125e6, 1e-4) == 0


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


def test_the_last_leaf_leaves_trees_alone() -> None:
    """A tree (depth > 0) already hangs late inputs on the right: unchanged."""
    assert tree_shape(15, 3, last_leaf=True) == tree_shape(15, 3)
