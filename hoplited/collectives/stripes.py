"""A striped allreduce's decisions as a pure core: stripes, who reduces each, what a death redoes.

Theory of operation (docs/design.md §4, "Striped allreduce"). A reduce followed by gets carries
the object twice through every node's link (a partial sum up, the result down). Cut into ``m``
stripes, each reduced along its own dynamic tree towards a different node, and gathered from
there, each link carries every stripe but its own once up and once down: 2(m−1)/m of the
object, the bandwidth bound of any allreduce that reduces at the nodes.

The plan runs on the caller's node. The first input to become ready fixes the size and type;
an object too small to give every input a stripe of ``min_stripe`` bytes is reduced the
plain way (``Plain``). Otherwise there is one stripe per input, and the i-th input to become
ready has its node reduce stripe i (``Assign``): stripes start as inputs arrive, every node
holding an input takes one, and a node holding several inputs takes several. Every node that
takes a stripe is a *member*: it holds the result, fetches the stripes it does not reduce, and
reports when the result is complete there (``MemberDone``). Once every live member has, the
stripes' own ids are dropped (``Cleanup``); the result stays, a plain object.

A member that dies takes its stripes' reduces with it: each is assigned again, under a new
generation, to the live member with the fewest stripes; the stripe reduces' own repair
(docs/design.md §5) handles the lost input in every stripe's tree. A member that only falls
silent is not lost: it still holds its part of the result and reduces its stripes once it
answers, and reassigning them would leave two reducers of one stripe id. If the caller's node
dies, no plan is left: the members stop and record the failure themselves. A stripe that
fails for any other reason, or an input that never comes, fails the allreduce (``Fail``);
a report of an assignment that was replaced is stale and changes nothing.

Nothing here waits or does I/O: ``handle(event)`` returns instructions
(``hoplited.collectives.allreduce`` carries them out).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from hoplite_client.wire.errors import HopliteError, InvalidArgumentError, PeerUnavailableError
from hoplite_client.wire.frames import INLINE_MAX
from hoplite_client.wire.ids import ObjectID
from hoplited.collectives.ops import check_op, check_reducible, derived_id

# The smallest stripe worth its own tree: below it, the handshakes and lookups of m trees cost
# more than the bandwidth they save (docs/benchmarks.md, "Striped allreduce").
MIN_STRIPE = 1 << 20
# Stripe bounds fall on pages, so each stripe's pulls and combines stay page-aligned.
ALIGN = 4096


def stripe_bounds(size: int, itemsize: int, m: int) -> list[tuple[int, int]]:
    """``m`` stripes of ``size`` bytes, as equal as whole aligned blocks allow, in order."""
    align = math.lcm(itemsize, ALIGN)
    blocks = -(-size // align)
    cuts = [min(size, (blocks * i // m) * align) for i in range(m + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(m)]


def stripe_id(result: ObjectID, stripe: int) -> ObjectID:
    """The id of stripe ``stripe`` of ``result``: the reduce of that stripe produces it."""
    return derived_id(result, stripe, b"stripe")


# --- events ---
@dataclass(frozen=True, slots=True)
class InputReady:
    """Input ``oid`` is complete on the live nodes ``alive``."""

    oid: ObjectID
    alive: tuple[str, ...]
    size: int
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class InputFailed:
    oid: ObjectID
    error: HopliteError


@dataclass(frozen=True, slots=True)
class NodeLost:
    """A member died (or could not be given its task): it reduces nothing any more."""

    node: str


@dataclass(frozen=True, slots=True)
class MemberDone:
    node: str


@dataclass(frozen=True, slots=True)
class StripeFailed:
    """Stripe ``stripe``'s reduce (assignment ``gen``), or member ``node`` (stripe -1), failed."""

    node: str
    stripe: int
    gen: int
    error: HopliteError


Event = InputReady | InputFailed | NodeLost | MemberDone | StripeFailed


# --- instructions ---
@dataclass(frozen=True, slots=True)
class Plain:
    """Reduce the plain way, into the result on this node; the plan is over."""


@dataclass(frozen=True, slots=True)
class Assign:
    """Tell ``node`` to hold the result and to reduce ``stripe`` (-1: none) as ``gen``."""

    node: str
    stripe: int
    gen: int


@dataclass(frozen=True, slots=True)
class Cleanup:
    """Every live member holds the result: drop the stripes' ids."""

    stripes: tuple[ObjectID, ...]


@dataclass(frozen=True, slots=True)
class Fail:
    """Record the failure at the result's shard and tell ``members`` to drop it."""

    error: HopliteError
    members: tuple[str, ...]


Instruction = Plain | Assign | Cleanup | Fail


class AllreducePlan:
    """One allreduce of ``inputs`` into ``result``, decided on the caller's node."""

    def __init__(self, result: ObjectID, inputs: list[ObjectID], op: str,
                 min_stripe: int = MIN_STRIPE) -> None:
        if not inputs:
            raise InvalidArgumentError("an allreduce needs at least one input")
        check_op(op)
        self.result, self.op, self.min_stripe = result, op, min_stripe
        self.inputs = list(dict.fromkeys(inputs))
        self.waiting = set(self.inputs)
        self.first: InputReady | None = None
        self.stripes = 0  # 0: not decided yet (or plain)
        self.owner: dict[int, tuple[str, int]] = {}  # stripe -> (node, gen)
        self.members: list[str] = []
        self.lost: set[str] = set()
        self.done: set[str] = set()
        self.phase = "new"  # new -> striped | plain | failed | over

    @property
    def over(self) -> bool:
        return self.phase in ("plain", "failed", "over")

    def handle(self, ev: Event) -> list[Instruction]:
        if isinstance(ev, NodeLost):
            self.lost.add(ev.node)
        if self.over:
            return []
        if isinstance(ev, InputReady):
            return self._ready(ev)
        if isinstance(ev, InputFailed):
            if ev.oid not in self.waiting:
                return []
            return self._fail(ev.error)
        if isinstance(ev, NodeLost):
            return self._lost(ev.node)
        if isinstance(ev, MemberDone):
            self.done.add(ev.node)
            return self._maybe_over()
        if ev.stripe >= 0 and self.owner.get(ev.stripe) != (ev.node, ev.gen):
            return []  # an assignment since replaced
        if ev.stripe < 0 and ev.node in self.lost:
            return []
        return self._fail(ev.error)

    def _ready(self, ev: InputReady) -> list[Instruction]:
        if ev.oid not in self.waiting:
            return []
        self.waiting.discard(ev.oid)
        if self.first is None:
            self.first = ev
            n = len(self.inputs)
            try:
                check_reducible(self.op, ev.dtype)
            except (InvalidArgumentError, TypeError):
                self.phase = "plain"  # the plain reduce reports the error
                return [Plain()]
            if n < 2 or ev.size <= INLINE_MAX or ev.size < n * self.min_stripe:
                self.phase = "plain"
                return [Plain()]
            self.stripes, self.phase = n, "striped"
        elif (ev.size, ev.dtype, ev.shape) != (self.first.size, self.first.dtype,
                                               self.first.shape):
            return self._fail(InvalidArgumentError(
                f"input {ev.oid.hex()} is {ev.dtype}{list(ev.shape)} but the first input was "
                f"{self.first.dtype}{list(self.first.shape)}", oid=ev.oid.hex()))
        live = [n for n in ev.alive if n not in self.lost]
        if not live:
            return self._fail(PeerUnavailableError(f"input {ev.oid.hex()} has no live holder",
                                                   oid=ev.oid.hex()))
        stripe = len(self.owner)
        load = Counter(node for node, _ in self.owner.values())
        node = min(live, key=lambda n: (load[n], live.index(n)))
        return self._assign(stripe, node, 0)

    def _assign(self, stripe: int, node: str, gen: int) -> list[Instruction]:
        self.owner[stripe] = (node, gen)
        if node not in self.members:
            self.members.append(node)
        self.done.discard(node)  # a member given a stripe again reports again
        return [Assign(node, stripe, gen)]

    def _lost(self, node: str) -> list[Instruction]:
        orphans = sorted(s for s, (n, _) in self.owner.items() if n == node)
        out: list[Instruction] = []
        for stripe in orphans:
            live = [n for n in self.members if n not in self.lost]
            if not live:
                return self._fail(PeerUnavailableError(
                    f"every node reducing a stripe of {self.result.hex()} died (last: {node})",
                    node=node))
            load = Counter(n for n, _ in self.owner.values() if n not in self.lost)
            heir = min(live, key=lambda n: (load[n], self.members.index(n)))
            out += self._assign(stripe, heir, self.owner[stripe][1] + 1)
        return out + self._maybe_over()

    def _maybe_over(self) -> list[Instruction]:
        live = [n for n in self.members if n not in self.lost]
        if self.waiting or len(self.owner) < self.stripes or not set(live) <= self.done:
            return []
        self.phase = "over"
        return [Cleanup(tuple(stripe_id(self.result, s) for s in range(self.stripes)))]

    def _fail(self, error: HopliteError) -> list[Instruction]:
        self.phase = "failed"
        return [Fail(error, tuple(n for n in self.members if n not in self.lost))]
