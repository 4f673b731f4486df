"""The simulated pair for the last two inputs of a staggered allreduce: the real plans choose
it and shape each half's combiner (docs/design.md §4, "A pair for the last two inputs")."""

from __future__ import annotations

import pytest

from hoplited.sim.scenarios import simulate

pytestmark = pytest.mark.unit

MiB = 1 << 20
S_OVER_RATE = 32 * MiB * 8 / 1e9


def test_the_pair_is_hoplited_s_default_and_can_be_turned_off() -> None:
    assert simulate("allreduce", 8, 32 * MiB, 1e9, interval=0.1).pair
    result = simulate("allreduce", 8, 32 * MiB, 1e9, interval=0.1, pair=False)
    assert result.error is None and not result.pair


@pytest.mark.parametrize("nodes, interval", [(8, 0.1), (8, 0.2), (16, 0.1), (4, 0.15)])
def test_a_pair_beats_the_plain_reduce_for_inputs_further_apart_than_the_ring_waits(
        nodes: int, interval: float) -> None:
    """Every node gets both halves; the last input's bytes cross once each way, where the
    plain reduce's second-to-last node downloads the object about twice."""
    plain = simulate("allreduce", nodes, 32 * MiB, 1e9, interval=interval, pair=False)
    pair = simulate("allreduce", nodes, 32 * MiB, 1e9, interval=interval, pair=True)
    assert pair.error is None and pair.pair and not pair.ring
    assert pair.seconds is not None and plain.seconds is not None
    assert pair.seconds < plain.seconds


def test_a_pair_is_at_the_bound_once_the_early_sum_is_there() -> None:
    """Inputs 0.2 s apart: the partial sum is at both combiners before either puts; after
    the last put its half crosses once, then the result's halves (1.0x and the hops)."""
    result = simulate("allreduce", 8, 32 * MiB, 1e9, interval=0.2)
    assert result.pair and result.ratio is not None and 1.0 <= result.ratio < 1.05


def test_inputs_further_apart_than_a_transfer_go_the_plain_way() -> None:
    """0.3 s apart, more than the 0.268 s a 32 MiB input takes to cross a 1 Gbit/s link:
    the plain reduce, whose last input hangs on the root, is at the bound already."""
    result = simulate("allreduce", 8, 32 * MiB, 1e9, interval=0.3)
    assert not result.pair and result.ratio is not None and 1.0 <= result.ratio < 1.05


def test_inputs_together_still_take_the_ring() -> None:
    result = simulate("allreduce", 8, 32 * MiB, 1e9, pair=True)
    assert result.ring and not result.pair


def test_a_pair_needs_halves_larger_than_a_stripe() -> None:
    result = simulate("allreduce", 8, MiB, 1e9, interval=0.1, pair=True)
    assert result.error is None and not result.pair


def test_no_pair_where_the_early_inputs_would_take_a_tree() -> None:
    """At N = 256 the link model takes a tree for 254 halves of 16 MiB: a pair's chain would
    cost 3.56x where the plain reduce takes 2.23x."""
    result = simulate("allreduce", 256, 32 * MiB, 1e9, interval=0.1, pair=True)
    assert result.error is None and not result.pair
