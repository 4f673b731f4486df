"""The simulated pair (or trio) for the last inputs of a staggered allreduce: the real plans
choose it and shape each stripe's combiner (docs/design.md §4, "A pair for the last two
inputs", "Three combiners")."""

from __future__ import annotations

import pytest

from hoplited.sim.scenarios import simulate

pytestmark = pytest.mark.unit

MiB = 1 << 20
S_OVER_RATE = 32 * MiB * 8 / 1e9


def test_the_pair_is_hoplited_s_default_and_can_be_turned_off() -> None:
    assert simulate("allreduce", 8, 32 * MiB, 1e9, interval=0.15).combiners == 2
    result = simulate("allreduce", 8, 32 * MiB, 1e9, interval=0.1, pair=False)
    assert result.error is None and not result.combiners


@pytest.mark.parametrize("nodes, interval, combiners", [
    (8, 0.1, 3), (8, 0.12, 3), (8, 0.13, 2), (8, 0.2, 2), (16, 0.1, 3), (4, 0.1, 2),
    (4, 0.15, 2)])
def test_combiners_beat_the_plain_reduce_for_inputs_further_apart_than_the_ring_waits(
        nodes: int, interval: float, combiners: int) -> None:
    """Every node gets every stripe; the last input's bytes cross once each way, where the
    plain reduce's second-to-last node downloads the object about twice. Inputs closer than
    0.45 transfers (0.12 s at 32 MiB) get three combiners, further apart two; four nodes
    leave a single early input, no gap to measure: two."""
    plain = simulate("allreduce", nodes, 32 * MiB, 1e9, interval=interval, pair=False)
    paired = simulate("allreduce", nodes, 32 * MiB, 1e9, interval=interval, pair=True)
    assert paired.error is None and paired.combiners == combiners and not paired.ring
    assert paired.seconds is not None and plain.seconds is not None
    assert paired.seconds < plain.seconds


def test_three_combiners_end_the_early_chain_before_the_last_put() -> None:
    """0.1 s apart: the early inputs' chain starts one input sooner, at the third-to-last
    put, and no longer sends a quarter of the object after the last (1.30x with two); the
    combiner that puts last holds the second late input until its own (1.18x without)."""
    result = simulate("allreduce", 8, 32 * MiB, 1e9, interval=0.1)
    assert result.combiners == 3 and result.ratio is not None and result.ratio < 1.15


@pytest.mark.parametrize("nodes, interval, bound", [(8, 0.12, 1.06), (16, 0.12, 1.12)])
def test_the_second_late_input_feeds_the_combiner_that_put_first(
        nodes: int, interval: float, bound: float) -> None:
    """The last combiner holds the second late input (docs/design.md §4, "Who pulls a late
    input first"), whose node then sends the first combiner its stripe alone: 1.14x and 1.18x
    without."""
    result = simulate("allreduce", nodes, 32 * MiB, 1e9, interval=interval)
    assert result.combiners == 3 and result.ratio is not None and result.ratio < bound


@pytest.mark.parametrize("nodes", [8, 16])
def test_under_max_min_sharing_the_trio_loses_less_after_the_last_put(nodes: int) -> None:
    """With the links shared max-min, as TCP flows settle (docs/simulation.md §7), a stream
    waiting for its source gives its share to the streams beside it: 0.1 s apart the trio's
    plan runs at 1.085x (N = 8) and 1.13x (N = 16), against 1.137x and 1.204x."""
    fair = simulate("allreduce", nodes, 32 * MiB, 1e9, interval=0.1)
    max_min = simulate("allreduce", nodes, 32 * MiB, 1e9, interval=0.1, sharing="maxmin")
    assert fair.ratio is not None and max_min.ratio is not None
    assert max_min.combiners == 3 and 1.0 < max_min.ratio < fair.ratio - 0.04


def test_a_pair_is_at_the_bound_once_the_early_sum_is_there() -> None:
    """Inputs 0.2 s apart: the partial sum is at both combiners before either puts; after
    the last put its half crosses once, then the result's halves (1.0x and the hops)."""
    result = simulate("allreduce", 8, 32 * MiB, 1e9, interval=0.2)
    assert result.combiners == 2 and result.ratio is not None and 1.0 <= result.ratio < 1.05


def test_inputs_further_apart_than_a_transfer_go_the_plain_way() -> None:
    """0.3 s apart, more than the 0.268 s a 32 MiB input takes to cross a 1 Gbit/s link:
    the plain reduce, whose last input hangs on the root, is at the bound already."""
    result = simulate("allreduce", 8, 32 * MiB, 1e9, interval=0.3)
    assert not result.combiners and result.ratio is not None and 1.0 <= result.ratio < 1.05


def test_inputs_together_still_take_the_ring() -> None:
    result = simulate("allreduce", 8, 32 * MiB, 1e9, pair=True)
    assert result.ring and not result.combiners


def test_a_pair_needs_halves_larger_than_a_stripe() -> None:
    result = simulate("allreduce", 8, MiB, 1e9, interval=0.1, pair=True)
    assert result.error is None and not result.combiners


def test_no_pair_where_the_early_inputs_would_take_a_tree() -> None:
    """At N = 256 the link model takes a tree for 254 halves of 16 MiB: a pair's chain would
    cost 3.56x where the plain reduce takes 2.23x."""
    result = simulate("allreduce", 256, 32 * MiB, 1e9, interval=0.1, pair=True)
    assert result.error is None and not result.combiners
