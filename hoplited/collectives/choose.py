"""Which schedule a reduce, a broadcast or an allreduce runs: every such choice, as pure
functions of what is known when it is made.

A decision takes a :class:`Known` (the inputs, the first input's size and type, the inputs
ready so far and when they came, the live nodes, the link model, the operator's settings) and
names a :data:`Strategy`: one tree (:class:`Tree`), two trees of halves (:class:`Halves`), a
ring (:class:`Ring`), stripes (:class:`Stripes`), combiners of the last inputs
(:class:`Combiners`), or a wait for more inputs (:class:`Wait`). The plans ask and act on the
answer; nothing here waits or does I/O.

An allreduce (docs/design.md §4; ``stripes.AllreducePlan``) asks at each of its moments:

- :func:`at_first_input`: one tree for a type no reduce takes; with a ring's wait set, a wait
  for the next input where a ring pays (:func:`ring_pays`), each wait the ring's wait at most
  and at most what the ring saves (:func:`ring_saving`, at least :data:`RING_WAIT_FLOOR`);
  else stripes, one per input, where each is :data:`MIN_STRIPE` bytes at least, else one tree.
- :func:`while_gathering`, at each input held for the ring: a wait for the next; once every
  input is here, the ring over as many live nodes not silent as hold them
  (:func:`~.ring.ring_members`) where it pays and a try is left (or some node adds several
  inputs); else as when the wait ends.
- :func:`when_wait_ends`: with pairs allowed and inputs still awaited, combiners where they
  pay (an object that takes :data:`PAIR_MIN_TRANSFER` to cross a link, stripes of it larger
  than inline, a chain for the inputs ready), as :func:`while_pairing` says; else stripes or
  one tree.
- :func:`while_pairing`, at each input held for combiners: a wait of :data:`PAIR_GAP`
  transfers for the next while more than three are missing; with three missing and exactly
  three idle live nodes, a trio where the inputs came closer than :data:`TRIO_GAP` transfers
  apart (else a wait, for a pair one input later); with two missing and exactly two idle, a
  pair; else stripes or one tree, as :func:`when_pair_wait_ends` always gives.

A reduce of every input (:func:`reduce_shape`) and a broadcast to receivers that say how many
they are (:func:`broadcast_shape`) take two trees of halves under ``--two-trees``: ``always``,
or ``auto`` where :func:`two_trees_pay`; never for a subset, fewer than two, a type the
reduce refuses or halves small enough to go inline (docs/design.md §3 and §4, "Two trees of
halves").
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass

from hoplite_client.wire.errors import InvalidArgumentError
from hoplite_client.wire.frames import INLINE_MAX
from hoplited.cluster.link_model import DEFAULT_BANDWIDTH, DEFAULT_LATENCY
from hoplited.collectives.layout import stripe_bounds
from hoplited.collectives.ops import check_reducible
from hoplited.collectives.ring import RING_MAX, ring_cost, ring_members
from hoplited.collectives.tree import (
    HOP_UNIT,
    TWO_TREE_MODES,
    one_tree_cost,
    tree_depth,
    two_tree_cost,
)
from hoplited.memory.store import parse_dtype

# The smallest stripe worth its own tree: below it, the handshakes and lookups of m trees cost
# more than the bandwidth they save (docs/benchmarks.md, "Striped allreduce").
MIN_STRIPE = 1 << 20
# The least each wait for the next input lasts, whatever the ring saves: inputs put before the
# allreduce are reported by their shards some milliseconds apart, more on a loaded machine,
# and a ring that saves 2 ms on fast links is still the ring they should get (with the saving
# alone as the wait, four inputs on loopback under load miss it: see
# tests/cluster/test_ring_allreduce.py::test_each_link_carries_the_rings_bound_once).
RING_WAIT_FLOOR = 0.05
# The longest gap between inputs a pair waits for, in times the object takes to cross a link
# (docs/design.md §4, "A pair for the last two inputs"). In the simulator the pair and the
# plain reduce meet at about one transfer. Emulated (32 MiB, 1 Gbit/s), 0.75 transfers apart
# (0.2 s) the pair runs at 1.18x and the plain reduce at 1.54x, 1.1 apart (0.3 s) the pair at
# 1.13-1.24x and the plain reduce at 1.04-1.06x. A transfer's time is the link's rate as the
# link model measures it, while bytes flow (docs/design.md §4, "The links' rate, measured while
# bytes flow"): a rate taken over whole pulls reads as little as a third of the link's, and
# would stretch this gap threefold.
PAIR_GAP = 1.0
# The least time, in seconds, an object must take to cross a link for a pair: its chain
# starts tens of milliseconds after the guess, and on the emulated links a pair of 4 MiB at
# 500 Mbit/s (67 ms) loses a tail to a queue and waits out TCP's 200 ms retransmission
# timeout in most runs, 3.87x S/RATE at N = 4 against 1.43x without it, where 16 MiB at
# 1 Gbit/s (134 ms) pairs at 1.49x (N = 8) and 1.58x (N = 4) against 1.66x
# (docs/design.md §4, "A pair for the last two inputs").
PAIR_MIN_TRANSFER = 0.1
# Inputs closer than this on average, in times the object takes to cross a link, get three
# combiners, one a third each, guessed when three inputs are missing and exactly three live
# nodes hold none (docs/design.md §4, "Three combiners"). The early inputs' chain then
# starts one input sooner and ends before the last put. Simulated (32 MiB, N = 8, 1 Gbit/s)
# three beat two up to 0.12 s apart (0.45 transfers: 1.139 against 1.152) and lose from
# 0.13 s (1.120 against 1.078); emulated at 0.15 s apart they run at 1.25x, the pair 1.09x.
TRIO_GAP = 0.45
# The most combiners of the last inputs: a pair or a trio.
MAX_COMBINERS = 3
# Two trees of halves must save this fraction of the best single shape's estimate, and this
# many seconds. The model shares every link fairly; on the test bed two flows on a link lose
# 15-20% to the chain's one (N = 8, 32 and 256 MiB), and the second plan's tasks and edges
# cost about 7 ms of control at 1 MiB (docs/design.md §4, "Two trees of halves").
TWO_TREE_GAIN = 0.2
TWO_TREE_SAVING = 0.01


# --- what a decision knows ---
@dataclass(frozen=True, slots=True)
class Settings:
    """The operator's choices a decision follows, as the plan was given them."""

    min_stripe: int = MIN_STRIPE  # the smallest stripe an allreduce cuts
    striped: bool = True  # False: an allreduce that runs no ring runs one tree
    ring_wait: float = 0.0  # the longest wait for each next input, for a ring (0: no ring)
    pair: bool = False  # late inputs may be held for a pair (or trio) of combiners
    pair_min_transfer: float = PAIR_MIN_TRANSFER  # seconds to cross a link, at least
    two_trees: str = "auto"  # ``--two-trees``: one of ``tree.TWO_TREE_MODES``


@dataclass(frozen=True, slots=True)
class Ready:
    """An input held while an allreduce waits: its ``index`` among the inputs, the nodes
    ``holders`` that held it when it was ready (in its shard's order; those in ``Known.gone``
    count no more), and when it was heard (``at``, on the event loop's clock; None: unknown)."""

    index: int
    holders: tuple[str, ...]
    at: float | None = None


@dataclass(frozen=True, slots=True)
class Known:
    """The facts a decision uses."""

    n: int  # the inputs (an allreduce's distinct ones), or a broadcast's receivers
    size: int  # the first input's bytes
    dtype: str  # the first input's type
    op: str = "sum"
    link: tuple[float, float] = (DEFAULT_BANDWIDTH, DEFAULT_LATENCY)  # bytes/s, seconds
    settings: Settings = Settings()
    subset: bool = False  # a reduce of k < n of its inputs
    awaited: int = 0  # inputs not ready yet
    # the inputs held so far, in the order they became ready (the plan's own list, read at
    # once: copying it at every input would cost a large ring's wait quadratic time)
    ready: Sequence[Ready] = ()
    nodes: tuple[str, ...] = ()  # the cluster's nodes, in its order
    gone: Set[str] = frozenset()  # nodes lost or fallen silent: they hold and take nothing
    rings: int = 1  # how many more times a ring may be tried
    crowded: bool = False  # past the ring's tries, one still where a node adds several inputs
    cap_wait: bool = True  # each wait for a ring is also at most what the ring saves


# --- what a decision names ---
@dataclass(frozen=True, slots=True)
class Tree:
    """One tree: the plain reduce (an allreduce's result then fetched by every node)."""


@dataclass(frozen=True, slots=True)
class Halves:
    """Two trees of halves: ``bounds``, the byte ranges of the two halves."""

    bounds: tuple[tuple[int, int], tuple[int, int]]


@dataclass(frozen=True, slots=True)
class Ring:
    """A ring of ``members``: (node, the indices of the inputs it adds), in ring order."""

    members: tuple[tuple[str, tuple[int, ...]], ...]


@dataclass(frozen=True, slots=True)
class Stripes:
    """``m`` stripes, one per input, each reduced along its own tree."""

    m: int


@dataclass(frozen=True, slots=True)
class Combiners:
    """``m`` combiners (2: a pair, 3: a trio) of the last ``m`` inputs: ``nodes``, the live
    nodes not silent that hold no input yet, the i-th reducing stripe i."""

    m: int
    nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    """Hold the inputs ready and wait ``delay`` seconds more for the next: for a ring, or for
    combiners (``combiners``)."""

    delay: float
    combiners: bool = False


Strategy = Tree | Halves | Ring | Stripes | Combiners | Wait


# --- the allreduce's moments ---
def at_first_input(known: Known) -> Tree | Stripes | Wait:
    """The first input is ready: one tree for a type no reduce takes (its reduce reports
    it), a wait for a ring where one pays, else stripes or one tree."""
    try:
        check_reducible(known.op, known.dtype)
    except (InvalidArgumentError, TypeError):
        return Tree()
    if (known.settings.ring_wait > 0 and (known.rings > 0 or known.crowded)
            and known.size > INLINE_MAX and ring_pays(known.n, known.size, *known.link)):
        return Wait(_ring_wait(known))
    return _stripes_or_tree(known)


def while_gathering(known: Known) -> Tree | Stripes | Ring | Combiners | Wait:
    """An input held for a ring came: wait for the next; with every input here, the ring
    where it pays and may run, else as :func:`when_wait_ends`."""
    if known.awaited:
        return Wait(_ring_wait(known))
    members = ring_members({r.index: [node for node in r.holders if node not in known.gone]
                            for r in known.ready}, known.n)
    if (members is not None and (known.rings > 0 or any(len(adds) > 1 for _, adds in members))
            and ring_pays(len(members), known.size, *known.link)):
        return Ring(tuple(members))
    return when_wait_ends(known)


def when_wait_ends(known: Known) -> Tree | Stripes | Combiners | Wait:
    """The ring's wait ran out (or no ring is to be had): hold the inputs for combiners
    where a pair pays and a ring try is left, else stripes or one tree."""
    if known.rings > 0 and _pair_pays(known):
        return while_pairing(known)
    return _stripes_or_tree(known)


def while_pairing(known: Known) -> Tree | Stripes | Combiners | Wait:
    """Inputs held for combiners: a trio with three missing, exactly three idle nodes and
    ``_trio_pays``; a pair with two missing and exactly two idle; a wait of :data:`PAIR_GAP`
    transfers while more are missing (or three, but no trio); else stripes or one tree.
    Inputs further apart than the wait go the usual way, whose last input hangs on the root
    and is added at the link's rate already (1.04x emulated at 0.3 s apart, 32 MiB, against
    the pair's 1.13x; docs/design.md §4)."""
    missing = known.awaited
    wait = Wait(max(RING_WAIT_FLOOR, PAIR_GAP * _transfer(known)), combiners=True)
    if missing > MAX_COMBINERS:
        return wait
    holding = {node for r in known.ready for node in r.holders}
    idle = tuple(node for node in known.nodes
                 if node not in known.gone and node not in holding)
    if missing == MAX_COMBINERS and (len(idle) != missing or not _trio_pays(known)):
        return wait  # perhaps a pair, one input later
    if missing < 2 or len(idle) != missing:
        return _stripes_or_tree(known)
    return Combiners(missing, idle)


def when_pair_wait_ends(known: Known) -> Tree | Stripes:
    """The wait for the next input to combine ran out: the held inputs go the usual way."""
    return _stripes_or_tree(known)


def _stripes_or_tree(known: Known) -> Tree | Stripes:
    """Stripes for the first input's size, or one tree if they would be small."""
    s = known.settings
    if (not s.striped or known.n < 2 or known.size <= INLINE_MAX
            or known.size < known.n * s.min_stripe):
        return Tree()
    return Stripes(known.n)


def _transfer(known: Known) -> float:
    """Seconds the object takes to cross a link."""
    return known.size / max(known.link[0], 1.0)


def _ring_wait(known: Known) -> float:
    """How long to hold the inputs for the next one to come, for a ring."""
    if not known.cap_wait:
        return known.settings.ring_wait
    saving = ring_saving(known.n, known.size, *known.link)
    return min(known.settings.ring_wait, max(RING_WAIT_FLOOR, saving))


def _pair_pays(known: Known) -> bool:
    """Whether inputs still awaited should be held for a pair: pairs allowed, an object that
    takes at least ``pair_min_transfer`` to cross a link, and ``_combiners_fit`` for two."""
    return (known.settings.pair and known.awaited > 0 and _combiners_fit(known, 2)
            and _transfer(known) >= known.settings.pair_min_transfer)


def _combiners_fit(known: Known, m: int) -> bool:
    """``m`` stripes larger than inline, an input at least for the chain, and a chain the
    link model would take for that many stripes (where it takes a tree, the chain's hops cost
    more than the combiners save: 3.56x against 2.23x for a pair simulated at N = 256)."""
    n, size = known.n, known.size
    return (n > m and size >= m * max(known.settings.min_stripe, INLINE_MAX + 1)
            and tree_depth(n - m, size // m, *known.link) == 0)


def _trio_pays(known: Known) -> bool:
    """Three combiners rather than two: ``_combiners_fit`` for three, and the inputs held so
    far came closer than :data:`TRIO_GAP` transfers apart on average."""
    times = [r.at for r in known.ready]
    if len(times) < 2 or not _combiners_fit(known, 3):
        return False
    first, last = times[0], times[-1]
    if first is None or last is None:
        return False
    return (last - first) / (len(times) - 1) < TRIO_GAP * _transfer(known)


def ring_saving(n: int, size: int, bandwidth: float, latency: float) -> float:
    """Seconds a ring saves over a reduce then a broadcast of the result (each the best
    single tree, :func:`~.tree.one_tree_cost`), negative where it costs more: at scale its
    2(n-1) steps cost more latency than the tree's depth. It is also how far apart the last
    inputs may come and the ring still win: the reduce's partial sum streams while they
    arrive, so it ends about that much sooner after the last (docs/design.md §4)."""
    return 2 * one_tree_cost(n, size, bandwidth, latency) - ring_cost(n, size, bandwidth,
                                                                       latency)


def ring_pays(n: int, size: int, bandwidth: float, latency: float) -> bool:
    """Whether a ring beats a reduce then a broadcast of the result (:func:`ring_saving`);
    beyond :data:`~.ring.RING_MAX` members none is taken."""
    return 2 <= n <= RING_MAX and ring_saving(n, size, bandwidth, latency) > 0


# --- two trees of halves ---
def reduce_shape(known: Known) -> Tree | Halves:
    """A reduce of ``n`` inputs at its first ready input: two trees of halves as
    ``--two-trees`` says, else one tree. Never for a subset (a backup could replace a lost
    input in one half only), for fewer than two inputs, for a type the reduce will refuse
    anyway, or for halves that would be sent inline."""
    mode = _mode(known)
    if mode == "never" or known.subset or known.n < 2:
        return Tree()
    try:
        check_reducible(known.op, known.dtype)
    except InvalidArgumentError:
        return Tree()  # the one tree's plan reports it
    return _halves_that_pay(known, mode, parse_dtype(known.dtype).itemsize)


def broadcast_shape(known: Known) -> Tree | Halves:
    """A broadcast to ``n`` receivers that said how many they are: two trees of halves as
    ``--two-trees`` says, which rules the reduce's shape too, the receivers counting as its
    inputs; else one tree."""
    mode = _mode(known)
    if mode == "never" or known.n < 2:
        return Tree()
    try:
        itemsize = parse_dtype(known.dtype).itemsize
    except InvalidArgumentError:
        return Tree()  # not an array the store would take: its gets report that
    if itemsize < 1:
        return Tree()
    return _halves_that_pay(known, mode, itemsize)


def bounds(shape: Tree | Halves) -> list[tuple[int, int]] | None:
    """The halves' byte ranges, None for one tree: the answer the reduce's and the shards'
    rules give."""
    return list(shape.bounds) if isinstance(shape, Halves) else None


def two_trees_pay(n: int, size: int, bandwidth: float, latency: float,
                  unit: int = HOP_UNIT) -> bool:
    """Whether ``n`` inputs of ``size`` bytes should be reduced as two trees of halves: the
    model saves ``TWO_TREE_GAIN`` of the best single shape and ``TWO_TREE_SAVING`` seconds."""
    if n < 3:
        return False
    one = one_tree_cost(n, size, bandwidth, latency, unit)
    two = two_tree_cost(n, size, bandwidth, latency, unit)
    return two <= (1 - TWO_TREE_GAIN) * one and one - two >= TWO_TREE_SAVING


def _mode(known: Known) -> str:
    mode = known.settings.two_trees
    if mode not in TWO_TREE_MODES:
        raise InvalidArgumentError(f"two-trees mode {mode!r}; one of "
                                   f"{', '.join(TWO_TREE_MODES)}")
    return mode


def _halves_that_pay(known: Known, mode: str, itemsize: int) -> Tree | Halves:
    """The two halves of ``size`` bytes of ``itemsize``-byte elements under ``mode``
    (``always``, or ``auto`` where ``two_trees_pay``), unless one would go inline."""
    first, second = stripe_bounds(known.size, itemsize, 2)
    if any(hi - lo <= INLINE_MAX for lo, hi in (first, second)):
        return Tree()
    if mode == "always" or two_trees_pay(known.n, known.size, *known.link):
        return Halves((first, second))
    return Tree()
