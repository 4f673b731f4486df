"""The simulator's network model: times of pulls alone, sharing links, and in a chain."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest
from helpers import top_level_imports

import hoplited.sim
from hoplited.sim.clock import Clock
from hoplited.sim.errors import SimulationError
from hoplited.sim.network import (
    BLOCKS,
    PULL_SETUP_HOPS,
    Copy,
    Layout,
    Network,
    max_min_shares,
)

pytestmark = pytest.mark.unit

MiB = 1 << 20
RATE = 125e6  # bytes/s: 1 Gbit/s
SEG = 64 * 1024


def network(latency: float = 1e-4, rate: float = RATE, sharing: str = "fair") -> Network:
    return Network(Clock(), rate, latency, SEG, sharing)


def full_copy(net: Network, node: str, size: int) -> Copy:
    copy = Copy(node, net.layout(size))
    copy.fill(0.0)
    return copy


def run_pulls(net: Network, pairs: list[tuple[Copy, Copy]]) -> list[float]:
    """Start every pull at t = 0; the time each sink holds every byte."""
    ends = [-1.0] * len(pairs)

    def ended(i: int) -> None:
        ends[i] = net.clock.now
    for i, (source, sink) in enumerate(pairs):
        net.pull(source, sink, functools.partial(ended, i))
    net.clock.run()
    return ends


@pytest.mark.parametrize("size, rate, latency", [
    (256 * MiB, 125e6, 1e-4),
    (32 * MiB, 125e6, 1e-3),
    (32 * MiB, 62.5e6, 0.0),
    (100 * 1000 + 7, 125e6, 1e-4),  # a short last block
    (1000, 125e6, 1e-4),  # one block, shorter than a segment
])
def test_one_pull_takes_size_over_rate_plus_the_hops(size: int, rate: float,
                                                      latency: float) -> None:
    net = network(latency, rate)
    [end] = run_pulls(net, [(full_copy(net, "a", size), Copy("b", net.layout(size)))])
    assert end == pytest.approx(PULL_SETUP_HOPS * latency + size / rate + latency)


# (pulls as (source node, sink node), expected end of each in units of S/RATE)
SHARING = [
    ([("a", "b"), ("c", "d")], [1, 1]),  # disjoint links: each at the full rate
    ([("a", "b"), ("a", "c")], [2, 2]),  # one uplink: each gets half
    ([("a", "c"), ("b", "c")], [2, 2]),  # one downlink: each gets half
    # a's uplink gives each of its three a third; e -> d gets d's downlink's half, not the
    # two thirds a -> d leaves unused (the smaller fair share, not max-min)
    ([("a", "b"), ("a", "c"), ("a", "d"), ("e", "d")], [3, 3, 3, 2]),
]


@pytest.mark.parametrize("pulls, units", SHARING)
def test_pulls_share_each_link_fairly(pulls: list[tuple[str, str]], units: list[int]) -> None:
    net = network(latency=0.0)
    size = 8 * MiB
    pairs = [(full_copy(net, src, size), Copy(dst, net.layout(size))) for src, dst in pulls]
    assert run_pulls(net, pairs) == pytest.approx([u * size / RATE for u in units])


# (pulls as (source node, sink node), each one's max-min share of a link of 1)
MAX_MIN = [
    ([], []),
    ([("a", "b")], [1]),
    ([("a", "b"), ("a", "b")], [1 / 2, 1 / 2]),  # two pulls of one pair split both links
    ([("a", "b"), ("a", "c")], [1 / 2, 1 / 2]),
    ([("a", "c"), ("b", "c")], [1 / 2, 1 / 2]),
    # a's uplink holds its three at a third; e -> d takes the two thirds of d's downlink
    # that a -> d leaves (the fair model gives it half)
    ([("a", "b"), ("a", "c"), ("a", "d"), ("e", "d")], [1 / 3, 1 / 3, 1 / 3, 2 / 3]),
    # a bottleneck passes its leftover on: b's uplink then splits between b -> x and b -> w
    ([("a", "x"), ("a", "y"), ("a", "z"), ("b", "x"), ("b", "w")],
     [1 / 3, 1 / 3, 1 / 3, 1 / 2, 1 / 2]),
    # every link offers a half, and one half of x's and of c's goes unused
    ([("a", "x"), ("a", "y"), ("b", "y"), ("b", "z"), ("c", "z")], [1 / 2] * 5),
    # a node's uplink and downlink are two links: a -> b and b -> a do not meet
    ([("a", "b"), ("b", "a")], [1, 1]),
]


@pytest.mark.parametrize("pulls, shares", MAX_MIN)
def test_max_min_shares_fill_every_link_they_can(pulls: list[tuple[str, str]],
                                                 shares: list[float]) -> None:
    rates = max_min_shares(pulls, 1.0)
    assert rates == pytest.approx(shares)
    for node in {n for pull in pulls for n in pull}:  # no link carries more than its rate
        assert sum(r for (s, _), r in zip(pulls, rates) if s == node) <= 1 + 1e-12
        assert sum(r for (_, d), r in zip(pulls, rates) if d == node) <= 1 + 1e-12


def test_max_min_shares_scale_with_the_rate() -> None:
    pulls = [("a", "b"), ("a", "c"), ("a", "d"), ("e", "d")]
    assert max_min_shares(pulls, RATE) == pytest.approx([RATE / 3] * 3 + [2 * RATE / 3])


def test_under_max_min_a_pull_takes_what_another_leaves() -> None:
    """The fair model's last case again: e -> d runs at two thirds and ends at 1.5 units."""
    net = network(latency=0.0, sharing="maxmin")
    size = 8 * MiB
    pulls = [("a", "b"), ("a", "c"), ("a", "d"), ("e", "d")]
    pairs = [(full_copy(net, src, size), Copy(dst, net.layout(size))) for src, dst in pulls]
    assert run_pulls(net, pairs) == pytest.approx([u * size / RATE for u in (3, 3, 3, 1.5)])


def test_under_max_min_a_pull_waiting_for_its_source_holds_no_share() -> None:
    """b forwards what it receives from a at a third of the rate (a's uplink has three
    pulls); b -> c waits for each of its blocks, and the pull beside it on b's uplink,
    b -> d, takes the rest of that uplink instead of half of it."""
    size = 8 * MiB

    def ends(sharing: str) -> list[float]:
        net = network(latency=0.0, sharing=sharing)
        relay = Copy("b", net.layout(size))
        pairs = [(full_copy(net, "a", size), relay),
                 (full_copy(net, "a", size), Copy("x", net.layout(size))),
                 (full_copy(net, "a", size), Copy("y", net.layout(size))),
                 (relay, Copy("c", net.layout(size))),
                 (full_copy(net, "b", size), Copy("d", net.layout(size)))]
        return run_pulls(net, pairs)
    fair, max_min = ends("fair"), ends("maxmin")
    assert max_min[4] < fair[4] and max_min[4] < 1.6 * size / RATE
    assert max_min[3] == pytest.approx(fair[3], rel=0.05)  # the relay still ends with a


def test_links_shared_some_other_way_are_refused() -> None:
    with pytest.raises(SimulationError, match="shared 'fifo'"):
        network(sharing="fifo")


def test_a_share_grows_when_the_other_pull_ends() -> None:
    """Two pulls from one uplink, one half the size: half rate until it ends, then full."""
    net = network(latency=0.0)
    small, big = 4 * MiB, 8 * MiB
    ends = run_pulls(net, [(full_copy(net, "a", small), Copy("b", net.layout(small))),
                           (full_copy(net, "a", big), Copy("c", net.layout(big)))])
    assert ends == pytest.approx([2 * small / RATE, (small + big) / RATE])


@pytest.mark.parametrize("hops", [1, 2, 8, 64])
def test_a_chain_costs_one_segment_and_one_hop_per_extra_hop(hops: int) -> None:
    """Cut-through: each hop adds latency + segment/rate, not a block's time."""
    latency, size = 1e-4, 256 * MiB
    net = network(latency)
    copies = [full_copy(net, "n0", size)] + [Copy(f"n{i}", net.layout(size))
                                             for i in range(1, hops + 1)]
    ends = run_pulls(net, list(zip(copies, copies[1:])))
    first = PULL_SETUP_HOPS * latency + size / RATE + latency
    assert ends[-1] == pytest.approx(first + (hops - 1) * (latency + SEG / RATE))


def test_a_pull_resumes_from_the_sinks_watermark() -> None:
    net = network(latency=0.0)
    size = 64 * MiB
    sink = Copy("b", net.layout(size))
    for _ in range(BLOCKS // 2):
        sink.add_ready(0.0)
        sink.add_full(0.0)
    [end] = run_pulls(net, [(full_copy(net, "a", size), sink)])
    assert end == pytest.approx(size / 2 / RATE)


@pytest.mark.parametrize("size, blocks, block", [
    (256 * MiB, BLOCKS, 4 * MiB),
    (1 * MiB, 16, SEG),  # never below a segment
    (SEG + 1, 2, SEG),
    (1, 1, SEG),
])
def test_layout_bounds_the_events_per_object(size: int, blocks: int, block: int) -> None:
    layout = Layout(size, SEG)
    assert (layout.count, layout.block) == (blocks, block)
    assert sum(layout.length(i) for i in range(layout.count)) == size


def test_a_pull_within_one_node_is_refused() -> None:
    net = network()
    with pytest.raises(SimulationError, match="within node a"):
        net.pull(full_copy(net, "a", MiB), Copy("a", net.layout(MiB)), lambda: None)


def test_equal_times_run_in_the_order_they_were_scheduled() -> None:
    clock, seen = Clock(), list[str]()
    for name in "abc":
        clock.at(1.0, functools.partial(seen.append, name))
    clock.at(0.5, lambda: seen.append("first"))
    clock.run()
    assert (seen, clock.now, clock.events) == (["first", "a", "b", "c"], 1.0, 4)


SIM_MODULES = [importlib.import_module(f"hoplited.sim.{m.name}")
               for m in pkgutil.iter_modules(hoplited.sim.__path__)]


@pytest.mark.parametrize("module", SIM_MODULES, ids=lambda m: m.__name__)
def test_the_simulator_does_no_io(module: ModuleType) -> None:
    assert not top_level_imports(module) & {"asyncio", "socket", "time", "random", "uvloop"}


def test_nothing_in_the_daemon_imports_the_simulator() -> None:
    """Only the simulator itself and the developer tools (its CLI) use it."""
    daemon = Path(hoplited.sim.__file__).parent.parent
    users = [str(p) for p in daemon.rglob("*.py")
             if not {"sim", "tools"} & set(p.relative_to(daemon).parts)
             and "hoplited.sim" in p.read_text()]
    assert users == []


@pytest.mark.parametrize("blocks", [16, 256])
def test_the_block_count_sets_the_cost_not_the_latency(monkeypatch: pytest.MonkeyPatch,
                                                      blocks: int) -> None:
    """Pipelining is set by the segment: coarser or finer blocks give the same latency."""
    base = hoplited.sim.scenarios.simulate("reduce", 8, 32 * MiB, 1e9)
    monkeypatch.setattr(hoplited.sim.network, "BLOCKS", blocks)
    other = hoplited.sim.scenarios.simulate("reduce", 8, 32 * MiB, 1e9)
    assert other.seconds == pytest.approx(base.seconds, rel=1e-4)
    assert (other.events < base.events) == (blocks < BLOCKS)
