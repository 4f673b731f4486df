"""The simulated allreduce: the real plan's choice of a ring, timed from the real schedule;
staggered inputs, as `hoplite bench --arrival-interval` puts them."""

from __future__ import annotations

import pytest

from hoplited.collectives.ring import SEGMENT, ring_cost
from hoplited.sim.allreduce import RING_SETUP_HOPS, ring_times
from hoplited.sim.errors import SimulationError
from hoplited.sim.scenarios import simulate

pytestmark = pytest.mark.unit

MiB = 1 << 20
RATE = 125e6  # bytes/s: 1 Gbit/s
L = 1e-4


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_one_segment_per_chunk_waits_a_hop_at_every_step(n: int) -> None:
    """Chunks of one segment: a member forwards what it received only once the whole of it
    landed, so each of the 2(n-1) steps costs a segment's time and a hop."""
    size = n * SEGMENT
    t = SEGMENT / RATE
    assert ring_times((size, 4), n, RATE, L, 1.0) == pytest.approx([1.0 + 2 * (n - 1) * (t + L)]
                                                                    * n)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_several_segments_per_chunk_keep_the_link_busy(n: int) -> None:
    """With four segments a chunk, the next received segment is whole before the member's
    uplink is free: no gaps, only the last segment's hop."""
    size = 4 * n * SEGMENT
    expected = 2 * (n - 1) / n * size / RATE + L
    assert ring_times((size, 4), n, RATE, L, 0.0) == pytest.approx([expected] * n)


def test_uneven_chunks_end_no_later_than_the_model_says() -> None:
    """An object that does not split evenly (chunks on element boundaries, a short last
    segment) still takes about what ``ring_cost`` charges."""
    size, n = 10 * MiB + 12, 7
    times = ring_times((size, 4), n, RATE, L, 0.0)
    assert max(times) <= ring_cost(n, size, RATE, L) * 1.01
    assert min(times) >= 2 * (n - 1) / n * size / RATE


def test_the_allreduce_runs_as_a_ring_where_the_plan_takes_one() -> None:
    result = simulate("allreduce", 8, 32 * MiB, 1e9)
    assert result.error is None and result.ring and result.depth is None
    setup = 3 * L + RING_SETUP_HOPS * L  # the input waits' round trips, then the ring's opening
    expected = setup + ring_times((32 * MiB, 1), 8, RATE, L, 0.0)[0]
    assert result.seconds == pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize("nodes, size", [
    (1000, MiB),  # a thousand members' 2(n-1) hops cost more than the trees' depth
    (8, 16 * 1024),  # small enough to travel inline: the plain reduce
])
def test_no_ring_means_the_plain_reduce_then_gets(nodes: int, size: int) -> None:
    result = simulate("allreduce", nodes, size, 1e9)
    assert result.error is None and not result.ring and result.seconds is not None


S_OVER_RATE = 32 * MiB / RATE  # 32 MiB over 1 Gbit/s


@pytest.mark.parametrize("op, interval, low, high", [
    # 0.1 s apart: the second-to-last input's node still downloads the rest of its partial sum
    # while the result streams through it, 1 + (1 - interval / (S/RATE)) (docs/design.md §4)
    ("allreduce", 0.1, 2 - 0.1 / S_OVER_RATE, (2 - 0.1 / S_OVER_RATE) * 1.03),
    ("allreduce", 0.3, 1.0, 1.05),  # apart by more than S/RATE: only the last input is late
    ("reduce", 0.1, 1.0, 1.03),  # one getter, the root: the last input hangs on it
    ("reduce", 0.3, 1.0, 1.03),
])
def test_staggered_inputs_cost_what_the_floor_says(op: str, interval: float, low: float,
                                                   high: float) -> None:
    result = simulate(op, 8, 32 * MiB, 1e9, interval=interval, pair=False)
    assert result.error is None and not result.ring and result.interval == interval
    assert result.ratio is not None and low <= result.ratio < high


@pytest.mark.parametrize("op, interval", [
    ("broadcast", 0.1), ("gather", 0.1), ("allreduce", -0.1), ("reduce", float("nan")),
    ("reduce", float("inf")),
])
def test_an_arrival_interval_is_a_reduce_s_and_a_number(op: str, interval: float) -> None:
    with pytest.raises(SimulationError, match="arrival interval"):
        simulate(op, 8, 32 * MiB, 1e9, interval=interval)
