"""Which schedule a reduce, a broadcast or an allreduce runs (``hoplited.collectives.choose``):
one table, facts in, the strategy named out, a row per outcome and per boundary."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from helpers import top_level_imports

import hoplited.collectives.choose as choose_module
from hoplite_client.wire.errors import InvalidArgumentError
from hoplite_client.wire.frames import INLINE_MAX
from hoplited.collectives.choose import (
    RING_WAIT_FLOOR,
    Combiners,
    Halves,
    Known,
    Ready,
    Ring,
    Settings,
    Strategy,
    Stripes,
    Tree,
    Wait,
    at_first_input,
    broadcast_shape,
    reduce_shape,
    when_pair_wait_ends,
    when_wait_ends,
    while_gathering,
    while_pairing,
)

pytestmark = pytest.mark.unit

KIB, MIB = 1 << 10, 1 << 20
GBIT = (125e6, 1e-4)  # 1 Gbit/s: 16 MiB cross a link in 0.134 s
SLOW = (4e6, 1e-4)  # 4 MB/s: a ring of 4 MiB saves far more than its wait
ONE_S = (4.0 * MIB, 1e-4)  # 4 MiB cross a link in one second exactly
RING = Settings(ring_wait=0.5)
PAIR = Settings(ring_wait=0.1, pair=True)
NODES = ("n0", "n1", "n2", "n3", "n4", "n5")
# what a ring of 4 inputs of 16 MiB saves at 1 Gbit/s: between the floor and RING's wait
SAVING_16 = 0.071503168
HALVES_32 = Halves(((0, 16 * MIB), (16 * MIB, 32 * MIB)))


def held(*nodes: str, at: tuple[float | None, ...] = ()) -> tuple[Ready, ...]:
    """Input i ready on ``nodes[i]`` (heard at ``at[i]``, if given), in that order."""
    return tuple(Ready(i, (node,), at[i] if at else None) for i, node in enumerate(nodes))


def moved(order: tuple[int, ...], *nodes: str) -> tuple[Ready, ...]:
    """Input ``order[j]`` the j-th ready, on ``nodes[j]``."""
    return tuple(Ready(i, (node,)) for i, node in zip(order, nodes, strict=True))


@dataclass(frozen=True)
class Row:
    why: str
    moment: Callable[[Known], Strategy]
    known: Known
    expected: Strategy
    id: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", f"{self.moment.__name__}: {self.why}")


TABLE = [
    # --- an allreduce's first input ---
    Row("bytes are no reduce's type: one tree, whose plan reports it", at_first_input,
        Known(4, 4 * MIB, "|S8"), Tree()),
    Row("four inputs of 4 MiB: stripes of 1 MiB, the smallest worth a tree", at_first_input,
        Known(4, 4 * MIB, "<f4"), Stripes(4)),
    Row("a page less: stripes below the minimum, one tree", at_first_input,
        Known(4, 4 * MIB - 4096, "<f4"), Tree()),
    Row("one input: nothing to stripe", at_first_input, Known(1, 4 * MIB, "<f4"), Tree()),
    Row("stripes turned off", at_first_input,
        Known(4, 4 * MIB, "<f4", settings=Settings(striped=False)), Tree()),
    Row("an object sent inline never stripes, whatever the smallest stripe", at_first_input,
        Known(2, INLINE_MAX, "<f4", settings=Settings(min_stripe=1)), Tree()),
    Row("a byte more than inline stripes with a small enough minimum", at_first_input,
        Known(2, INLINE_MAX + 1, "<f4", settings=Settings(min_stripe=1)), Stripes(2)),
    Row("a ring saves more than its wait: the whole wait", at_first_input,
        Known(4, 4 * MIB, "<f4", link=SLOW, settings=Settings(ring_wait=0.1)), Wait(0.1)),
    Row("a ring saves less than its wait: wait what it saves", at_first_input,
        Known(4, 16 * MIB, "<f4", link=GBIT, settings=RING), Wait(SAVING_16)),
    Row("10 Gbit/s: the ring saves less than the floor, wait the floor", at_first_input,
        Known(4, 16 * MIB, "<f4", link=(1.25e9, 1e-4), settings=RING), Wait(RING_WAIT_FLOOR)),
    Row("a ring run again waits the whole wait, whatever it saves", at_first_input,
        Known(4, 16 * MIB, "<f4", link=GBIT, settings=RING, cap_wait=False), Wait(0.5)),
    Row("inputs too small for a ring (inline): stripes or one tree", at_first_input,
        Known(4, INLINE_MAX, "<f4", link=SLOW, settings=RING), Tree()),
    Row("no ring try left: stripes at once", at_first_input,
        Known(4, 16 * MIB, "<f4", link=GBIT, settings=RING, rings=0), Stripes(4)),
    Row("no try left but a node may add several inputs: wait for a ring", at_first_input,
        Known(4, 16 * MIB, "<f4", link=GBIT, settings=RING, rings=0, crowded=True),
        Wait(SAVING_16)),
    Row("N = 1000 at 2 MiB: the ring's 2(n-1) steps cost more than a tree; small stripes",
        at_first_input, Known(1000, 2 * MIB, "<f4", link=GBIT, settings=RING), Tree()),
    # --- each input held for the ring ---
    Row("inputs still awaited: wait for the next", while_gathering,
        Known(4, 16 * MIB, "<f4", link=GBIT, settings=RING, awaited=2,
              ready=held("n0", "n1")), Wait(SAVING_16)),
    Row("every input here, each on its own node: the ring, in node order", while_gathering,
        Known(4, 16 * MIB, "<f4", link=GBIT, settings=RING, ready=moved(
            (1, 0, 3, 2), "n0", "n1", "n2", "n3")),
        Ring((("n0", (1,)), ("n1", (0,)), ("n2", (3,)), ("n3", (2,))))),
    Row("every input on one node: no ring of one, stripes", while_gathering,
        Known(4, 16 * MIB, "<f4", link=GBIT, settings=RING, ready=held("n0", "n0", "n0", "n0")),
        Stripes(4)),
    Row("an input whose every holder is lost since: no ring, stripes", while_gathering,
        Known(4, 16 * MIB, "<f4", link=GBIT, settings=RING, gone=frozenset({"n3"}),
              ready=held("n0", "n1", "n2", "n3")), Stripes(4)),
    Row("past the ring's tries, a node adding two inputs: the ring again", while_gathering,
        Known(4, 16 * MIB, "<f4", link=GBIT, settings=RING, rings=0, crowded=True,
              ready=held("n0", "n0", "n1", "n2")),
        Ring((("n0", (0, 1)), ("n1", (2,)), ("n2", (3,))))),
    Row("past the ring's tries, every input on its own node: stripes", while_gathering,
        Known(4, 16 * MIB, "<f4", link=GBIT, settings=RING, rings=0, crowded=True,
              ready=held("n0", "n1", "n2", "n3")), Stripes(4)),
    # --- the ring's wait runs out ---
    Row("no pairs: stripes, fed the inputs held", when_wait_ends,
        Known(4, 4 * MIB, "<f4", link=SLOW, settings=Settings(ring_wait=0.1), awaited=3,
              ready=held("n0"), nodes=NODES[:5]), Stripes(4)),
    Row("pairs, three missing but four idle nodes: wait a transfer, a pair one input later",
        when_wait_ends,
        Known(4, 4 * MIB, "<f4", link=SLOW, settings=PAIR, awaited=3, ready=held("n0"),
              nodes=NODES[:5]), Wait(4 * MIB / SLOW[0], combiners=True)),
    Row("no ring try left: no pair either", when_wait_ends,
        Known(4, 4 * MIB, "<f4", link=SLOW, settings=PAIR, awaited=3, ready=held("n0"),
              nodes=NODES[:5], rings=0), Stripes(4)),
    Row("4 MiB cross 1 Gbit/s in 34 ms, less than a pair's least transfer: stripes",
        when_wait_ends,
        Known(4, 4 * MIB, "<f4", link=GBIT, settings=PAIR, awaited=3, ready=held("n0"),
              nodes=NODES[:5]), Stripes(4)),
    Row("two inputs: no chain for the pair to start on", when_wait_ends,
        Known(2, 4 * MIB, "<f4", link=SLOW, settings=PAIR, awaited=1, ready=held("n0"),
              nodes=NODES[:3]), Stripes(2)),
    Row("halves under the smallest stripe: no pair, and one tree", when_wait_ends,
        Known(4, 2 * MIB - 4096, "<f4", link=SLOW, settings=PAIR, awaited=3,
              ready=held("n0"), nodes=NODES[:5]), Tree()),
    Row("N = 32 at 16 MiB: the ready inputs' chain is a chain, hold on for a pair",
        when_wait_ends,
        Known(32, 16 * MIB, "<f4", link=GBIT, settings=PAIR, awaited=31, ready=held("n0")),
        Wait(16 * MIB / GBIT[0], combiners=True)),
    Row("N = 256 at 16 MiB: the ready inputs would climb a tree, no pair; one tree",
        when_wait_ends,
        Known(256, 16 * MIB, "<f4", link=GBIT, settings=PAIR, awaited=255, ready=held("n0")),
        Tree()),
    Row("every input here: nothing to pair, stripes", when_wait_ends,
        Known(4, 4 * MIB, "<f4", link=SLOW, settings=PAIR, ready=held("n0", "n1", "n2", "n3"),
              nodes=NODES[:5]), Stripes(4)),
    # --- each input held for combiners ---
    Row("four missing: wait a transfer for the next", while_pairing,
        Known(6, 4 * MIB, "<f4", link=ONE_S, settings=PAIR, awaited=4,
              ready=held("n0", "n1"), nodes=NODES), Wait(1.0, combiners=True)),
    Row("three missing, three idle, inputs 0.3 transfers apart: a trio", while_pairing,
        Known(6, 4 * MIB, "<f4", link=ONE_S, settings=PAIR, awaited=3,
              ready=held("n0", "n1", "n2", at=(0.0, 0.3, 0.6)), nodes=NODES),
        Combiners(3, ("n3", "n4", "n5"))),
    Row("inputs TRIO_GAP transfers apart on average: no trio, a pair one input later",
        while_pairing,
        Known(6, 4 * MIB, "<f4", link=ONE_S, settings=PAIR, awaited=3,
              ready=held("n0", "n1", "n2", at=(0.0, 0.45, 0.9)), nodes=NODES),
        Wait(1.0, combiners=True)),
    Row("when the inputs came is unknown: no trio", while_pairing,
        Known(6, 4 * MIB, "<f4", link=ONE_S, settings=PAIR, awaited=3,
              ready=held("n0", "n1", "n2"), nodes=NODES), Wait(1.0, combiners=True)),
    Row("thirds under the smallest stripe: no trio", while_pairing,
        Known(6, 4 * MIB, "<f4", link=ONE_S, settings=Settings(ring_wait=0.1, pair=True,
                                                                 min_stripe=2 * MIB),
              awaited=3, ready=held("n0", "n1", "n2", at=(0.0, 0.3, 0.6)), nodes=NODES),
        Wait(1.0, combiners=True)),
    Row("three missing, an idle node silent: two idle, no trio", while_pairing,
        Known(6, 4 * MIB, "<f4", link=ONE_S, settings=PAIR, awaited=3,
              ready=held("n0", "n1", "n2", at=(0.0, 0.3, 0.6)), nodes=NODES,
              gone=frozenset({"n5"})), Wait(1.0, combiners=True)),
    Row("two missing, two idle: a pair", while_pairing,
        Known(6, 4 * MIB, "<f4", link=ONE_S, settings=PAIR, awaited=2,
              ready=held("n0", "n1", "n2", "n3"), nodes=NODES), Combiners(2, ("n4", "n5"))),
    Row("two missing, an idle node lost: one idle, the usual way", while_pairing,
        Known(6, 4 * MIB, "<f4", link=ONE_S, settings=PAIR, awaited=2,
              ready=held("n0", "n1", "n2", "n3"), nodes=NODES, gone=frozenset({"n4"})),
        Tree()),
    Row("two missing, three idle: the usual way, stripes", while_pairing,
        Known(6, 12 * MIB, "<f4", link=ONE_S, settings=PAIR, awaited=2,
              ready=held("n0", "n1", "n2", "n3"), nodes=(*NODES, "n6")), Stripes(6)),
    Row("one missing: the usual way", while_pairing,
        Known(6, 4 * MIB, "<f4", link=ONE_S, settings=PAIR, awaited=1,
              ready=held("n0", "n1", "n2", "n3", "n4"), nodes=NODES), Tree()),
    Row("the wait for the next runs out: stripes", when_pair_wait_ends,
        Known(4, 4 * MIB, "<f4", link=SLOW, settings=PAIR, awaited=2,
              ready=held("n0", "n1"), nodes=NODES[:5]), Stripes(4)),
    Row("the wait for the next runs out, stripes too small: one tree", when_pair_wait_ends,
        Known(6, 4 * MIB, "<f4", link=ONE_S, settings=PAIR, awaited=2,
              ready=held("n0", "n1", "n2", "n3"), nodes=NODES), Tree()),
    # --- a reduce of every input ---
    Row("N = 256 at 32 MiB: two trees of halves save a fifth", reduce_shape,
        Known(256, 32 * MIB, "<f4", link=GBIT), HALVES_32),
    Row("N = 8 at 32 MiB: one tree is as good", reduce_shape,
        Known(8, 32 * MIB, "<f4", link=GBIT), Tree()),
    Row("always: halves at N = 8", reduce_shape,
        Known(8, 32 * MIB, "<f4", link=GBIT, settings=Settings(two_trees="always")),
        HALVES_32),
    Row("never: one tree at N = 256", reduce_shape,
        Known(256, 32 * MIB, "<f4", link=GBIT, settings=Settings(two_trees="never")), Tree()),
    Row("a subset k < n never halves: a backup could stand in for one half only",
        reduce_shape,
        Known(256, 32 * MIB, "<f4", link=GBIT, settings=Settings(two_trees="always"),
              subset=True), Tree()),
    Row("one input: nothing to reduce", reduce_shape,
        Known(1, 32 * MIB, "<f4", link=GBIT, settings=Settings(two_trees="always")), Tree()),
    Row("halves of 64 KiB would go inline: one tree", reduce_shape,
        Known(4, 128 * KIB, "<f4", link=GBIT, settings=Settings(two_trees="always")), Tree()),
    Row("bytes are no reduce's type: the one tree's plan reports it", reduce_shape,
        Known(4, 32 * MIB, "|S8", link=GBIT, settings=Settings(two_trees="always")), Tree()),
    Row("an odd size: the first half ends on a page", reduce_shape,
        Known(4, 150 * KIB + 4, "<f4", "prod", GBIT, Settings(two_trees="always")),
        Halves(((0, 76 * KIB), (76 * KIB, 150 * KIB + 4)))),
    # --- a broadcast to receivers that say how many they are ---
    Row("999 receivers: two trees of halves", broadcast_shape,
        Known(999, 32 * MIB, "float32", link=GBIT), HALVES_32),
    Row("7 receivers: one tree", broadcast_shape, Known(7, 32 * MIB, "float32", link=GBIT),
        Tree()),
    Row("never", broadcast_shape,
        Known(999, 32 * MIB, "float32", link=GBIT, settings=Settings(two_trees="never")),
        Tree()),
    Row("one receiver: nothing to split", broadcast_shape,
        Known(1, 32 * MIB, "float32", link=GBIT, settings=Settings(two_trees="always")),
        Tree()),
    Row("not an array the store takes: its gets report it", broadcast_shape,
        Known(4, 32 * MIB, "not-a-dtype", link=GBIT, settings=Settings(two_trees="always")),
        Tree()),
]


def same(got: Strategy, expected: Strategy) -> bool:
    """Equal, a wait's delay to a relative 1e-6 (the table gives its seconds rounded)."""
    if isinstance(got, Wait) and isinstance(expected, Wait):
        return got.combiners == expected.combiners and math.isclose(
            got.delay, expected.delay, rel_tol=1e-6)
    return got == expected


@pytest.mark.parametrize("row", TABLE, ids=lambda r: r.id)
def test_choose(row: Row) -> None:
    got = row.moment(row.known)
    assert same(got, row.expected), f"{row.why}: {got}"


@pytest.mark.parametrize("shape", [reduce_shape, broadcast_shape])
def test_an_unknown_two_trees_mode_is_refused(shape: Callable[[Known], Strategy]) -> None:
    with pytest.raises(InvalidArgumentError, match="two-trees mode 'sometimes'"):
        shape(Known(8, MIB, "<f4", settings=Settings(two_trees="sometimes")))


def test_the_choice_is_pure() -> None:
    assert not {"asyncio", "socket", "time"} & top_level_imports(choose_module)
