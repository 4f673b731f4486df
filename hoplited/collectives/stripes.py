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
generation, to the live member with the fewest stripes (none left while inputs are still
awaited: to the next input's node); the stripe reduces' own repair
(docs/design.md §5) handles the lost input in every stripe's tree. A member that only falls
silent is not lost: it still holds its part of the result and reduces its stripes once it
answers, and reassigning them would leave two reducers of one stripe id. If the caller's node
dies, no plan is left: the members stop and record the failure themselves. A stripe that
fails for any other reason, or an input that never comes, fails the allreduce (``Fail``);
a report of an assignment that was replaced is stale and changes nothing.

With ``ring_wait`` > 0 the plan first tries a ring (docs/design.md §4, "Ring allreduce"), where
it pays (:func:`~.choose.ring_pays`): at the first ready input it arms a timer (``Arm``), again
at each input after it, and holds the inputs' events; each wait is ``ring_wait`` at most, and
at most what the ring saves (:func:`~.choose.ring_saving`; at least
:data:`~.choose.RING_WAIT_FLOOR`): inputs further apart than that are better served by the
reduce, whose partial sum streams while they arrive. If every input is ready before the timer
fires and at least two live nodes that have not fallen silent hold them, those nodes run the
ring (``StartRing``; :func:`~.ring.ring_members`: inputs spread over as many nodes as they
can be, a node holding several adding them all). The first member to hold the whole result
makes the plan commit (``Commit``: every member publishes its copy once complete); from then
on a member that fails only loses its copy, since the result exists, and a member falling
silent has those not done yet drop theirs; both fetch the result from the members done
instead (``Withdraw``). The plan ends once every member is over and every live member not
silent holds the result: the members done, and the others once the result's shard names them
(``Watch``, answered by ``ResultReady``; none runs when every member finished the ring). Until
then the result may exist only on the members that reported it whole: while none of them
answers, the watch also looks for a copy elsewhere; if every one of them dies (or fails) with
nobody else left running, the shard is asked once more (:data:`COPY_CHECK`), and with no copy
anywhere the allreduce starts over as below, the committed version first retired at the shard,
so that a copy of it published late is refused and gets waiting on it take the next
(``Restart`` with ``retire``). A member done but only silent is waited for: it answers again
(``NodeTrusted``), or is declared dead. A member lost, failed or fallen silent before the
commit leaves nothing published: the members drop their copies and the allreduce starts over
(``Restart``, :meth:`AllreducePlan.again`), waiting for the inputs again: as a ring once more
(:data:`RING_TRIES`) without the nodes lost or silent, so a lost input put again on a survivor
is added by that survivor, and after that in stripes or as a reduce, which take a lost input
put again as in any reduce, and a silent member's input once it answers. The timer firing
first, or no ring to be had, give the stripes as above, fed the held events in order.

With ``pair`` and the cluster's ``nodes``, inputs that come further apart than the ring's
wait are held on until exactly two are missing (docs/design.md §4, "A pair for the last two
inputs"). If then exactly two live nodes that have not fallen silent hold no input yet, the
guess is that they will put the last two: each reduces one half of the object, stripe 0 or 1
(``Assign`` with ``pair``), as a combiner whose root starts at once on its node, over a
chain of the inputs ready and a leaf for each of the last two, so that the early inputs'
partial sum crosses the links before the last inputs exist; the combiners are told first,
each with the records of the inputs ready (``Assign.ready``), so that their chains start
without asking the inputs' shards again. Every other live node is a member that fetches both
halves. From then on it is a striped allreduce of two stripes: a dead member's half is
reduced again by another member, the ordinary way. Where the inputs held came closer than
:data:`~.choose.TRIO_GAP` transfers apart on average, the guess is made one input sooner:
with three missing and exactly three idle nodes, each of those reduces a third
(docs/design.md §4, "Three combiners"). Otherwise the held inputs go to the stripes or the
plain reduce, as when the ring's wait runs out.

Which of these schedules runs is :mod:`~.choose`'s to say, at each moment a choice is made
(the first input; each input held for a ring or for combiners; the end of each wait): the
plan asks it with what it knows (``_known``) and carries out the answer (``_follow``).
Nothing here waits or does I/O: ``handle(event)`` returns instructions
(``hoplited.collectives.allreduce`` carries them out).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    InvalidArgumentError,
    PeerUnavailableError,
)
from hoplite_client.wire.ids import ObjectID
from hoplited.cluster.link_model import DEFAULT_BANDWIDTH, DEFAULT_LATENCY
from hoplited.collectives import choose as c
from hoplited.collectives.choose import MIN_STRIPE, PAIR_MIN_TRANSFER
from hoplited.collectives.ops import check_op, derived_id

# How many rings one allreduce may run: the first, and one more after it gave way (a member
# died or fell silent; the node that took a lost input put again adds it too). A second
# failure is taken by the stripes or the reduce, which repair around a loss, unless a node
# would add several inputs: the ring is tried again then (``crowded``), since stripes take a
# buffer per input and stripe there (docs/design.md §4, "Several inputs on one node").
RING_TRIES = 2
# How long a ring run again waits for its inputs, in times the object takes to cross a link
# (at least the configured wait): a lost input is put again after its node was declared dead
# (0.63 s after a SIGKILL at 256 MiB, N = 8, 1 Gbit/s, docs/benchmarks.md "Ring allreduce"),
# and a ring started that much later still ends before the stripes started at once.
RING_REDO_WAIT = 0.5
# How long a committed ring that lost every member known to hold its result asks the result's
# shard for a copy elsewhere (nodes that fetched it) before it runs again: a copy there is
# named at once, so this is the answer's time on a loaded machine, paid only when none is.
COPY_CHECK = 1.0


def stripe_id(result: ObjectID, stripe: int) -> ObjectID:
    """The id of stripe ``stripe`` of ``result``: the reduce of that stripe produces it."""
    return derived_id(result, stripe, b"stripe")


# --- events ---
@dataclass(frozen=True, slots=True)
class InputReady:
    """Input ``oid`` is complete on the live nodes ``alive``, at ``version`` (its shard's
    record's); ``at``: when this node heard it, on its event loop's clock (None: unknown)."""

    oid: ObjectID
    alive: tuple[str, ...]
    size: int
    dtype: str
    shape: tuple[int, ...]
    version: bytes = b""
    at: float | None = None


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


@dataclass(frozen=True, slots=True)
class GatherOver:
    """The ring's wait for every input (``Arm``) ran out."""


@dataclass(frozen=True, slots=True)
class NodeSuspected:
    """A member fell silent (not dead yet): a ring through it stalls meanwhile."""

    node: str


@dataclass(frozen=True, slots=True)
class NodeTrusted:
    """A member suspected before answers again."""

    node: str


@dataclass(frozen=True, slots=True)
class RingDone:
    """Ring member ``node`` holds the whole result."""

    node: str


@dataclass(frozen=True, slots=True)
class RingFailed:
    """Ring member ``node`` could not finish (a neighbour vanished or stalled, a bad input)."""

    node: str
    error: HopliteError


@dataclass(frozen=True, slots=True)
class ResultReady:
    """The result's shard names ``holders``, live nodes holding all of it (a committed ring's
    members, or nodes that fetched it from them)."""

    holders: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NoCopy:
    """A bounded ``Watch`` ran out: no live node outside its exclusions holds the result."""


@dataclass(frozen=True, slots=True)
class ResultUnseen:
    """The watch of the result's shard gave up with ``error`` (the shard unreachable): the
    members that reported the result whole are trusted to publish it."""

    error: HopliteError


Event = (InputReady | InputFailed | NodeLost | MemberDone | StripeFailed | GatherOver
         | RingDone | RingFailed | NodeSuspected | NodeTrusted | ResultReady | ResultUnseen
         | NoCopy)


def undelivered(node: str, stripe: int, gen: int, error: HopliteError, alive: bool) -> Event:
    """The event for a stripe task that ``node`` never answered with success. An unreachable
    node is lost to the allreduce, and so is one whose connection broke before it answered
    (killed while its task was on the way, before the membership heard: see
    ``test_a_stripe_task_not_delivered`` in tests/unit/test_stripes.py), or one the
    membership no longer lists alive. An error a live node itself answered with fails that
    stripe, and the plan judges it."""
    unreached = isinstance(error, (ConnectionLostError, PeerUnavailableError))
    if (unreached and not error.reported) or not alive:
        return NodeLost(node)
    return StripeFailed(node, stripe, gen, error)


# --- instructions ---
@dataclass(frozen=True, slots=True)
class Plain:
    """Reduce the plain way, into the result on this node; the plan is over."""


@dataclass(frozen=True, slots=True)
class Assign:
    """Tell ``node`` to hold the result and to reduce ``stripe`` (-1: none) as ``gen``;
    ``pair``: the stripes are a pair's halves (reduced by combiners, fetched in the
    directory's usual order). ``ready``: the inputs ready so far, in order, for a combiner's
    reduce to start its chain from without asking their shards again."""

    node: str
    stripe: int
    gen: int
    pair: bool = False
    ready: tuple[InputReady, ...] = ()


@dataclass(frozen=True, slots=True)
class Cleanup:
    """Every live member holds the result: drop the stripes' ids."""

    stripes: tuple[ObjectID, ...]


@dataclass(frozen=True, slots=True)
class Fail:
    """Record the failure at the result's shard and tell ``members`` to drop it."""

    error: HopliteError
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Arm:
    """Feed ``GatherOver`` after ``delay`` seconds, unless another ``Arm`` comes first (it
    replaces this one's timer)."""

    delay: float


@dataclass(frozen=True, slots=True)
class StartRing:
    """Run the ring: ``members`` (node, the inputs it adds, a repeated input as often as it
    is listed), in ring order."""

    members: tuple[tuple[str, tuple[ObjectID, ...]], ...]


@dataclass(frozen=True, slots=True)
class Commit:
    """Tell the ring's ``members`` to publish their copies once complete."""

    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Watch:
    """Wait at the result's shard until a live node not in ``exclude`` holds all of it
    (``ResultReady``; ``ResultUnseen`` if the shard cannot be asked), for at most ``within``
    seconds if given (then ``NoCopy``); it replaces the watch before it, and the plan's end
    ends it."""

    exclude: tuple[str, ...]
    within: float | None = None


@dataclass(frozen=True, slots=True)
class Withdraw:
    """The result exists, but a silent member stalls the ring (or ``members`` failed): tell
    them to drop their ring copies and fetch the result from those done."""

    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Restart:
    """Tell ``members`` to drop their ring copies; start the allreduce again, as
    :meth:`AllreducePlan.again` says. ``retire``: the ring had committed, so a copy of its
    version may yet be published (by a member whose report of it was on its way): delete
    that version at the result's shard before the inputs are awaited again."""

    members: tuple[str, ...]
    error: HopliteError
    retire: bool = False


@dataclass(frozen=True, slots=True)
class WaitAgain:
    """Wait for input ``oid`` again, on a node not in ``exclude``: every node that held it
    when it was ready is lost since (it is put again elsewhere, as a restarted task does)."""

    oid: ObjectID
    exclude: tuple[str, ...]


Instruction = (Plain | Assign | Cleanup | Fail | Arm | StartRing | Commit | Restart | Withdraw
               | WaitAgain | Watch)


class AllreducePlan:
    """One allreduce of ``inputs`` into ``result``, decided on the caller's node."""

    def __init__(self, result: ObjectID, inputs: list[ObjectID], op: str,
                 min_stripe: int = MIN_STRIPE, ring_wait: float = 0.0,
                 lost: frozenset[str] = frozenset(), striped: bool = True,
                 link: tuple[float, float] = (DEFAULT_BANDWIDTH, DEFAULT_LATENCY),
                 suspected: frozenset[str] = frozenset(), rings: int = RING_TRIES,
                 cap_wait: bool = True, pair: bool = False,
                 pair_min_transfer: float = PAIR_MIN_TRANSFER,
                 nodes: tuple[str, ...] = (), crowded: bool = False) -> None:
        if not inputs:
            raise InvalidArgumentError("an allreduce needs at least one input")
        check_op(op)
        self.result, self.op, self.min_stripe = result, op, min_stripe
        self.listed = list(inputs)  # as listed: an input listed twice counts twice
        self.ring_wait = ring_wait  # the longest wait for each next input, for a ring
        # each wait is also at most what the ring saves (the first ring; one run again waits
        # for a lost input put again, which takes what it takes)
        self.cap_wait = cap_wait
        self.rings = rings  # how many more times a ring may be tried
        # past them, a ring still where some node adds several inputs (a plan run again)
        self.crowded = crowded
        self.suspected: set[str] = set(suspected)  # fell silent: no ring goes through them
        self.striped = striped  # False: no ring means the plain reduce (then gets)
        self.link = link  # the links' bandwidth (bytes/s) and latency (s), for the choices
        self.pair = pair  # may hold late inputs for a pair (or trio) of combiners
        self.pair_min_transfer = pair_min_transfer  # seconds to cross a link, at least
        self.nodes = nodes  # the cluster's nodes, for the pair's guess
        self.paired = False  # the stripes are a pair's halves (or a trio's thirds)
        self.held: list[InputReady] = []  # inputs ready while gathering, in order
        self.ready: list[c.Ready] = []  # the same, as the choice of schedule knows them
        self.ring: list[str] = []  # the ring's nodes, in ring order
        self.ring_over: set[str] = set()  # ring members done, failed or lost
        self.holders: set[str] = set()  # ring members that reported the result whole
        self.copies: set[str] = set()  # nodes the result's shard named as holding it all
        self.committed = False
        self.unwatched = False  # a watch for a copy gave up: the members done are trusted
        self.watching: tuple[str, ...] | None = None  # the running watch's exclusions
        self.checking = False  # that watch is bounded: a check before running again
        self.gone = ""  # the last ring member lost or failed, named if the ring runs again
        self.unfetched: set[str] = set()  # members whose fetch of the result failed
        self.inputs = list(dict.fromkeys(inputs))
        self.index = {oid: i for i, oid in enumerate(self.inputs)}
        self.waiting = set(self.inputs)
        self.first: InputReady | None = None
        self.stripes = 0  # 0: not decided yet (or plain)
        self.owner: dict[int, tuple[str, int]] = {}  # stripe -> (node, gen)
        self.members: list[str] = []
        self.lost: set[str] = set(lost)  # members known dead (a ring given up names some)
        self.orphans: list[int] = []  # stripes of dead members with no live member to take
        self.done: set[str] = set()
        # new -> gathering -> [pairing ->] ring | striped | plain | failed | over | restart
        self.phase = "new"

    @property
    def over(self) -> bool:
        return self.phase in ("plain", "failed", "over", "restart")

    def handle(self, ev: Event) -> list[Instruction]:
        if isinstance(ev, NodeLost):
            self.lost.add(ev.node)
        if isinstance(ev, NodeSuspected):
            self.suspected.add(ev.node)
        if isinstance(ev, NodeTrusted):
            self.suspected.discard(ev.node)
        if self.over:
            return []
        if self.phase == "gathering" and isinstance(ev, (InputReady, GatherOver)):
            return self._gather(ev)
        if self.phase == "pairing" and isinstance(ev, (InputReady, GatherOver)):
            return self._pairing(ev)  # GatherOver: a gap of a transfer
        if self.phase == "ring":
            return self._ring_event(ev)
        if isinstance(ev, (GatherOver, RingDone, RingFailed, NodeSuspected, NodeTrusted,
                           ResultReady, ResultUnseen, NoCopy)):
            return []  # a timer or report of a ring since given up; stripes keep a silent
            # member's stripes (below)
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
            strategy = c.at_first_input(self._known())
            if isinstance(strategy, c.Wait):  # for a ring
                self.phase = "gathering"
                self._keep(ev)
                return [Arm(strategy.delay)]
            return self._follow(strategy)
        mismatch = self._mismatch(ev)
        if mismatch or self.paired:  # a pair's halves take every input as it comes
            return mismatch
        return self._place(ev)

    def _known(self) -> c.Known:
        """What the choice of schedule knows now (:mod:`~.choose`)."""
        assert self.first is not None
        settings = c.Settings(self.min_stripe, self.striped, self.ring_wait, self.pair,
                              self.pair_min_transfer)
        return c.Known(len(self.inputs), self.first.size, self.first.dtype, self.op,
                       self.link, settings, awaited=len(self.waiting), ready=self.ready,
                       nodes=self.nodes, gone=self.lost | self.suspected, rings=self.rings,
                       crowded=self.crowded, cap_wait=self.cap_wait)

    def _follow(self, strategy: c.Tree | c.Stripes | c.Ring | c.Combiners | c.Wait,
                ) -> list[Instruction]:
        """Carry out the schedule chosen, for the inputs held so far."""
        if isinstance(strategy, c.Wait):  # for the next input
            if strategy.combiners:
                self.phase = "pairing"
            return [Arm(strategy.delay)]
        if isinstance(strategy, c.Ring):
            return self._start_ring(strategy)
        if isinstance(strategy, c.Combiners):
            return self._combine(strategy)
        return self._release_held(strategy)

    def _mismatch(self, ev: InputReady) -> list[Instruction]:
        """Fail if ``ev`` differs in size, type or shape from the first input."""
        assert self.first is not None
        if (ev.size, ev.dtype, ev.shape) == (self.first.size, self.first.dtype,
                                             self.first.shape):
            return []
        return self._fail(InvalidArgumentError(
            f"input {ev.oid.hex()} is {ev.dtype}{list(ev.shape)} but the first input was "
            f"{self.first.dtype}{list(self.first.shape)}", oid=ev.oid.hex()))

    def _gather(self, ev: InputReady | GatherOver) -> list[Instruction]:
        """Hold ready inputs for the ring; run it once all are here, else give it up."""
        if isinstance(ev, GatherOver):
            return self._follow(c.when_wait_ends(self._known()))
        refused = self._hold(ev)
        if refused is not None:
            return refused
        return self._follow(c.while_gathering(self._known()))

    def _start_ring(self, ring: c.Ring) -> list[Instruction]:
        """Run the ring over its members, each adding its inputs as often as listed."""
        self.phase, self.ring = "ring", [node for node, _ in ring.members]
        count = Counter(self.listed)
        return [StartRing(tuple(
            (node, tuple(self.inputs[i] for i in adds for _ in range(count[self.inputs[i]])))
            for node, adds in ring.members))]

    def _hold(self, ev: InputReady) -> list[Instruction] | None:
        """Hold ``ev`` for a ring or a pair; None if held, else what to do instead (nothing
        for an input not awaited, a failure for one unlike the first)."""
        if ev.oid not in self.waiting:
            return []
        self.waiting.discard(ev.oid)
        mismatch = self._mismatch(ev)
        if mismatch:
            return mismatch
        self._keep(ev)
        return None

    def _keep(self, ev: InputReady) -> None:
        self.held.append(ev)
        self.ready.append(c.Ready(self.index[ev.oid], ev.alive, ev.at))

    def _take_held(self) -> list[InputReady]:
        held, self.held, self.ready = self.held, [], []
        return held

    def _pairing(self, ev: InputReady | GatherOver) -> list[Instruction]:
        """Hold ``ev`` for combiners; once the wait for the next ran out (``GatherOver``),
        the held inputs go the usual way."""
        if isinstance(ev, GatherOver):
            return self._follow(c.when_pair_wait_ends(self._known()))
        refused = self._hold(ev)
        return self._follow(c.while_pairing(self._known())) if refused is None else refused

    def _combine(self, combiners: c.Combiners) -> list[Instruction]:
        """The combiners reduce a stripe each; every other live node not silent is a member
        that fetches them all."""
        held = tuple(self._take_held())
        self.stripes, self.phase, self.paired = combiners.m, "striped", True
        gone = self.lost | self.suspected
        members: list[Instruction] = []
        for node in self.nodes:
            if node not in gone and node not in combiners.nodes:
                self.members.append(node)
                members.append(Assign(node, -1, 0, pair=True))
        # the combiners first, each with the inputs ready so far: their chains are what the
        # last inputs wait for (docs/design.md §4, "A pair for the last two inputs")
        assigned = [x for stripe, node in enumerate(combiners.nodes)
                    for x in self._assign(stripe, node, 0, held)]
        return assigned + members

    def _release_held(self, strategy: c.Tree | c.Stripes) -> list[Instruction]:
        """The stripes or the plain reduce, fed the held inputs in order."""
        held = self._take_held()
        if isinstance(strategy, c.Tree):
            self.phase = "plain"
            return [Plain()]
        assert self.first is not None
        self.stripes, self.phase = strategy.m, "striped"
        out = self._place(self.first)
        for h in held[1:]:
            if self.over:
                break
            out += self._place(h)
        return out

    def _ring_event(self, ev: Event) -> list[Instruction]:
        if isinstance(ev, RingDone) and ev.node in self.ring:
            if ev.node not in self.ring_over:  # one withdrawn may have dropped its copy
                self.holders.add(ev.node)
            self.ring_over.add(ev.node)
            out: list[Instruction] = []
            if not self.committed:
                self.committed = True
                out.append(Commit(self._live_ring()))
            return out + self._ring_maybe_over()
        if isinstance(ev, (ResultReady, ResultUnseen, NoCopy)):
            return self._watched(ev)
        if isinstance(ev, NodeTrusted):
            return self._ring_maybe_over()
        if isinstance(ev, NodeSuspected) and ev.node in self.ring and (
                ev.node not in self.ring_over):
            if self.committed:  # whoever is not done waits on it: fetch from those done
                waiting = tuple(n for n in self._live_ring() if n not in self.ring_over)
                self.ring_over.update(waiting)
                return [Withdraw(waiting), *self._ring_maybe_over()]
            self.phase = "restart"
            return [Restart(self._live_ring(), PeerUnavailableError(
                f"ring member {ev.node} fell silent", node=ev.node))]
        if isinstance(ev, NodeLost) and ev.node not in self.ring and self.committed:
            self.copies.discard(ev.node)
            return self._ring_maybe_over()
        if (isinstance(ev, RingFailed) and self.committed and ev.node in self.ring_over
                and ev.node not in self.holders):  # told to fetch the result, it could not:
            self.unfetched.add(ev.node)  # not waited for (its gets will try again)
            return self._ring_maybe_over()
        if isinstance(ev, (RingFailed, NodeLost)) and ev.node in self.ring:
            self.ring_over.add(ev.node)
            self.holders.discard(ev.node)
            self.gone = ev.node
            if isinstance(ev, NodeLost):
                self.copies.discard(ev.node)
            if self.committed:  # only this member's copy is lost (unless it was the last
                # one), and the member, listed until the caller answers, is told to go
                told = [Withdraw((ev.node,))] if isinstance(ev, RingFailed) else []
                return told + self._ring_maybe_over()
            self.phase = "restart"
            error = ev.error if isinstance(ev, RingFailed) else PeerUnavailableError(
                f"ring member {ev.node} died", node=ev.node)
            return [Restart(self._live_ring(), error)]
        return []

    def _watched(self, ev: ResultReady | ResultUnseen | NoCopy) -> list[Instruction]:
        """The watch of the result's shard answered. Unseen, the members that reported the
        result whole are all there is to go by: a live one that answers is enough."""
        self.watching, self.checking = None, False
        if isinstance(ev, ResultReady):
            self.copies.update(ev.holders)
        elif isinstance(ev, ResultUnseen):
            self.unwatched = True
        return self._ring_maybe_over(missing=isinstance(ev, NoCopy))

    def again(self) -> AllreducePlan:
        """The plan that runs this allreduce again once its ring gave way: one ring fewer to
        try, a longer wait for the inputs (:data:`RING_REDO_WAIT`), the same inputs and
        choices, and the nodes known dead or silent kept out."""
        size = 0 if self.first is None else self.first.size
        wait = max(self.ring_wait, RING_REDO_WAIT * size / max(self.link[0], 1.0))
        return AllreducePlan(self.result, self.listed, self.op, self.min_stripe, wait,
                             frozenset(self.lost), self.striped, self.link,
                             frozenset(self.suspected), self.rings - 1, cap_wait=False,
                             pair=self.pair, pair_min_transfer=self.pair_min_transfer,
                             nodes=self.nodes, crowded=True)

    def _live_ring(self) -> tuple[str, ...]:
        return tuple(n for n in self.ring if n not in self.lost)

    def _ring_maybe_over(self, missing: bool = False) -> list[Instruction]:
        """Over once every live ring member is done or has failed and, after the commit,
        every live member not silent holds the result: those done, and those told to drop
        their ring copies, once they fetched it (the shard names them: ``Watch`` for each
        next copy, excluding the nodes known to hold it and the silent). While no node known
        to hold it answers, such a watch also finds a copy elsewhere, if there is one; while
        none is known alive, ask the shard for one for :data:`COPY_CHECK` and start over once
        that ran out (``missing``) with none found. A member whose fetch failed is not waited
        for. Without a watch (the shard could not be asked) a live member done that answers
        is enough."""
        if not set(self._live_ring()) <= self.ring_over:
            return []
        known = (self.holders | self.copies) - self.lost
        needed = set(self._live_ring()) - self.suspected - self.unfetched
        if not self.committed or ((known - self.suspected)
                                  and (self.unwatched or needed <= known)):
            self.phase = "over"
            return []
        exclude = tuple(sorted((known | self.suspected) - self.lost))
        if known:
            if self.unwatched or (self.watching == exclude and not self.checking):
                return []
            self.watching, self.checking = exclude, False
            return [Watch(exclude)]
        if not missing and not self.unwatched:
            if self.checking:
                return []
            self.watching, self.checking = exclude, True
            return [Watch(exclude, COPY_CHECK)]
        self.phase = "restart"
        return [Restart(self._live_ring(), PeerUnavailableError(
            f"every ring member holding {self.result.hex()} died or failed (last: {self.gone})",
            node=self.gone), retire=True)]

    def _place(self, ev: InputReady) -> list[Instruction]:
        """Give input ``ev``'s stripe to the least loaded live node holding it."""
        live = [n for n in ev.alive if n not in self.lost]
        if not live:  # its holders died since it was ready (held for a ring, say): its task
            # puts it again elsewhere, as for a reduce (docs/design.md §5, "Reduce")
            self.waiting.add(ev.oid)
            return [WaitAgain(ev.oid, tuple(sorted(self.lost)))]
        stripe = len(self.owner)
        load = Counter(node for node, _ in self.owner.values())
        node = min(live, key=lambda n: (load[n], live.index(n)))
        out = self._assign(stripe, node, 0)
        for orphan in self.orphans:  # stripes whose every member died before this input
            out += self._assign(orphan, node, self.owner[orphan][1] + 1)
        self.orphans.clear()
        return out

    def _assign(self, stripe: int, node: str, gen: int,
                ready: tuple[InputReady, ...] = ()) -> list[Instruction]:
        self.owner[stripe] = (node, gen)
        if node not in self.members:
            self.members.append(node)
        self.done.discard(node)  # a member given a stripe again reports again
        return [Assign(node, stripe, gen, self.paired, ready)]

    def _lost(self, node: str) -> list[Instruction]:
        orphans = sorted(s for s, (n, _) in self.owner.items() if n == node)
        out: list[Instruction] = []
        for stripe in orphans:
            live = [n for n in self.members if n not in self.lost]
            if not live and self.waiting and not self.paired:  # the next input's node
                # takes it (a pair's every live node was a member)
                self.orphans.append(stripe)
                continue
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
        if (self.waiting or self.orphans or len(self.owner) < self.stripes
                or not set(live) <= self.done):
            return []
        self.phase = "over"
        return [Cleanup(tuple(stripe_id(self.result, s) for s in range(self.stripes)))]

    def _fail(self, error: HopliteError) -> list[Instruction]:
        self.phase = "failed"
        return [Fail(error, tuple(n for n in self.members if n not in self.lost))]
