"""Every message of the protocol, one record per kind, sorted by kind.

The prelude's ``kind`` byte selects the record; the msgpack header holds its fields as an
array; bulk data (object bytes) travels only as the frame's raw payload.

Each kind declares at registration everything the layers above need, so nothing is kept in
hand-made lists (docs/protocol.md has the table; a test checks it against this module):
- its **shape**: a *request* (``rid`` first, answered by exactly one reply with the same
  ``rid``: the declared reply kind, or ``Error``), a *reply*, a *one-way* notice (no ``rid``)
  or a *handshake* step;
- for requests, the **reply kind**, given as the type argument of :class:`Request` (so the
  request API is typed: ``await channel.request(Locate(...))`` returns a ``Located`` frame);
- for requests and one-ways, the **roles** allowed to send it: ``client`` (a local process on
  the Unix socket), ``peer`` (another member, control link), ``tool`` (an authenticated tool
  such as ``hoplite bench --join``) and ``data`` (a data connection);
- its **payload** mode: none, small (read into memory, at most 1 MiB) or stream (the reader
  asks a sink for the destination buffer).

Request ids are stamped by the channel that sends a request (:mod:`hoplite_client.net.channel`)
and by the router that answers it, so a request is built without one (``rid`` defaults to 0).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar, Generic, Literal, TypeVar, dataclass_transform

from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import PLAIN, LocateHint
from hoplite_client.wire.schema import record

Shape = Literal["request", "reply", "oneway", "handshake"]
PayloadMode = Literal["none", "small", "stream"]
Role = Literal["client", "peer", "tool", "data"]
CLIENT: Role = "client"
PEER: Role = "peer"
TOOL: Role = "tool"
DATA: Role = "data"

R = TypeVar("R", bound="WireMessage")


class WireMessage:
    """Base of every registered message; the class attributes are set by :func:`message`."""

    __slots__ = ()
    # Every registered message is a dataclass (``message`` applies ``record``); declaring it
    # here lets ``dataclasses.replace`` type-check on a ``Request[R]``.
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]
    KIND: ClassVar[int]
    SHAPE: ClassVar[Shape]
    PAYLOAD: ClassVar[PayloadMode]
    ROLES: ClassVar[frozenset[Role]]
    REPLY: ClassVar[type[WireMessage] | None]
    CANCELLABLE: ClassVar[bool]


class Request(WireMessage, Generic[R]):
    """A request whose successful reply is of kind ``R``; ``rid`` is its first field."""

    __slots__ = ()
    rid: int


class Reply(WireMessage):
    """A reply, matched to its request by ``rid``."""

    __slots__ = ()
    rid: int


MESSAGES: dict[int, type[WireMessage]] = {}
_W = TypeVar("_W", bound=WireMessage)


@dataclass_transform(frozen_default=True, kw_only_default=True)
def message(kind: int, *, shape: Shape, roles: tuple[Role, ...] = (),
            payload: PayloadMode = "none",
            cancellable: bool = False) -> typing.Callable[[type[_W]], type[_W]]:
    """Register a record as wire message ``kind`` with its shape, senders and payload mode;
    ``cancellable``: a request that only waits, which its sender stops with ``Cancel`` when
    it gives up on it."""

    def wrap(cls: type[_W]) -> type[_W]:
        rec = record(cls)
        if kind in MESSAGES:
            raise RuntimeError(f"message kind {kind} registered twice")
        if (shape == "request") != issubclass(rec, Request) or (
                shape == "reply") != issubclass(rec, Reply):
            raise RuntimeError(f"{cls.__name__}: shape {shape} disagrees with its base class")
        if (shape in ("request", "oneway")) != bool(roles):
            raise RuntimeError(f"{cls.__name__}: requests and one-ways declare their senders")
        if shape in ("request", "reply") and dataclasses.fields(rec)[0].name != "rid":
            raise RuntimeError(f"{cls.__name__}: a request or reply starts with its rid (the "
                               f"encoder stamps it there)")
        rec.KIND = kind
        rec.SHAPE = shape
        rec.PAYLOAD = payload
        rec.ROLES = frozenset(roles)
        rec.REPLY = None
        rec.CANCELLABLE = cancellable
        MESSAGES[kind] = rec
        return rec

    return wrap


def _resolve_replies(namespace: dict[str, Any]) -> None:
    """Set each request's REPLY from its ``Request[...]`` base (forward references allowed)."""
    for cls in MESSAGES.values():
        if cls.SHAPE != "request":
            continue
        bases: tuple[Any, ...] = getattr(cls, "__orig_bases__", ())  # set by Generic
        base = next(b for b in bases if typing.get_origin(b) is Request)
        (arg,) = typing.get_args(base)
        reply = namespace[arg.__forward_arg__] if isinstance(arg, typing.ForwardRef) else arg
        if not (isinstance(reply, type) and issubclass(reply, Reply)):
            raise RuntimeError(f"{cls.__name__}: reply kind {reply!r} is not a reply")
        cls.REPLY = reply


@record
class MemberInfo:
    """A cluster member: its id, TCP address, Unix socket path and which host it runs on."""

    node_id: str
    host: str
    port: int
    socket: str
    host_id: str


@record
class Holding:
    """One object a store holds, as re-announced to the object's directory shard.
    ``producing``: the sender is computing it (a reduce's result), so if the sender dies
    before any copy is complete, the object will never exist. ``source``: the member a
    partial copy is being pulled from, and ``serving``: how many pulls the sender serves
    from it now, so a shard rebuilt from announcements still knows each chain
    (docs/design.md §3). ``receivers``: how many members will get it (an allreduce's result:
    every other input's node), 0 if unknown, so the shard can shape their gets as a tree."""

    oid: ObjectID
    size: int
    dtype: str
    shape: list[int]
    version: bytes
    received: int
    producing: bool
    source: str | None
    serving: int
    receivers: int


@record
class ReadyInput:
    """An input of an allreduce known complete on ``holders`` at ``version`` (its shard's
    record as the caller's node read it), so a combiner's reduce starts its chain without
    asking the shard again (docs/design.md §4, "A pair for the last two inputs")."""

    oid: ObjectID
    holders: list[str]
    version: bytes


# --- 1-4: handshake on TCP connections (daemon to daemon, tools) ---
@message(1, shape="handshake")
class Hello(WireMessage):
    versions: list[int]
    node_id: str
    nonce: bytes
    role: str  # "peer" (control), "data" (object streams) or "tool"


@message(2, shape="handshake")
class Welcome(WireMessage):
    version: int
    node_id: str
    nonce: bytes
    proof: bytes


@message(3, shape="handshake")
class Auth(WireMessage):
    proof: bytes


@message(4, shape="handshake")
class Accepted(WireMessage):
    version: int


# --- 5-6: handshake on the Unix socket (client to its local daemon) ---
@message(5, shape="handshake")
class ClientHello(WireMessage):
    versions: list[int]
    pid: int


@message(6, shape="handshake")
class ClientWelcome(WireMessage):
    """Sent with the arena's file descriptor attached (SCM_RIGHTS)."""

    version: int
    node_id: str
    arena_size: int


# --- 10-11: generic replies ---
@message(10, shape="reply")
class Ok(Reply):
    rid: int = 0


@message(11, shape="reply")
class Error(Reply):
    """The typed error a request ended with (``code`` selects the class, ``data`` its fields)."""

    rid: int = 0
    code: str
    message: str
    data: dict[str, Any]


# --- 20-33: client to its local daemon ---
@message(20, shape="request", roles=(CLIENT,), payload="small")
class Put(Request["Stored"]):
    """Put a small object whose bytes ride as the payload; ``timeout``: how long it may wait
    for room in a full store (None: until there is room). ``oid`` None: the daemon names it,
    with an id its own shard owns if it can find one cheaply (docs/design.md §2.4)."""

    rid: int = 0
    oid: ObjectID | None
    dtype: str
    shape: list[int]
    timeout: float | None


@message(35, shape="reply")
class Stored(Reply):
    """A put is stored and published under ``oid``."""

    rid: int = 0
    oid: ObjectID


@message(21, shape="request", roles=(CLIENT,))
class Create(Request["Ok"]):
    """Reserve room for a large object, whose bytes the client then sends with its ``Seal``;
    ``timeout`` as for ``Put``."""

    rid: int = 0
    oid: ObjectID
    size: int
    dtype: str
    shape: list[int]
    timeout: float | None


@message(23, shape="request", roles=(CLIENT,), payload="stream")
class Seal(Request["Ok"]):
    """The bytes of an object the client created, streamed straight into its extent (all of
    them: the payload's length is its size); then it is published."""

    rid: int = 0
    oid: ObjectID


@message(24, shape="request", roles=(CLIENT,))
class Abort(Request["Ok"]):
    rid: int = 0
    oid: ObjectID


@message(25, shape="request", roles=(CLIENT,))
class Get(Request["Found"]):
    """A complete local copy of ``oid``; ``receivers``: how many nodes get it together (0:
    unknown), passed on to its shard (``hoplite_client.wire.receivers``)."""

    rid: int = 0
    oid: ObjectID
    timeout: float | None
    receivers: int = 0


@message(26, shape="reply", payload="small")
class Found(Reply):
    """Where a complete local copy lives (``offset`` in the arena), or the bytes themselves."""

    rid: int = 0
    size: int
    dtype: str
    shape: list[int]
    offset: int | None


@message(27, shape="request", roles=(CLIENT,))
class Delete(Request["Ok"]):
    rid: int = 0
    oid: ObjectID


@message(28, shape="oneway", roles=(CLIENT,))
class Release(WireMessage):
    """The client dropped these views (one entry per view)."""

    oids: list[ObjectID]


@message(29, shape="request", roles=(CLIENT,))
class Status(Request["StatusReply"]):
    rid: int = 0


@message(30, shape="reply")
class StatusReply(Reply):
    rid: int = 0
    info: dict[str, Any]


@message(31, shape="request", roles=(CLIENT,))
class Reduce(Request["Ok"]):
    """Reduce the first ``num_objects`` ready inputs with ``op`` into ``result``."""

    rid: int = 0
    result: ObjectID
    inputs: list[ObjectID]
    op: str
    num_objects: int
    timeout: float | None


@message(32, shape="request", roles=(CLIENT,))
class ReducedInputs(Request["InputList"]):
    rid: int = 0
    result: ObjectID
    timeout: float | None


@message(33, shape="reply")
class InputList(Reply):
    rid: int = 0
    inputs: list[ObjectID]


@message(34, shape="request", roles=(CLIENT,))
class Allreduce(Request["Ok"]):
    """Reduce every input with ``op`` into ``result``; ``striped``: in stripes, and the result
    lands on every node holding an input (docs/design.md §4, "Striped allreduce"), else the
    reduce computes it on this node. Gets of it work anywhere."""

    rid: int = 0
    result: ObjectID
    inputs: list[ObjectID]
    op: str
    striped: bool
    timeout: float | None


# --- 40-43: membership and liveness ---
@message(40, shape="request", roles=(PEER,))
class Join(Request["Members"]):
    rid: int = 0
    member: MemberInfo


@message(41, shape="reply")
class Members(Reply):
    rid: int = 0
    members: list[MemberInfo]


@message(42, shape="oneway", roles=(PEER,))
class MemberUp(WireMessage):
    """A member joined through the sender: connect to it."""

    member: MemberInfo


@message(43, shape="request", roles=(PEER, TOOL))
class Ping(Request["Ok"]):
    rid: int = 0


# --- 44-52: daemon to directory shard ---
@message(44, shape="request", roles=(PEER,), cancellable=True)
class Locate(Request["Located"]):
    """Ask the owner shard for a source of ``oid`` (waiting up to ``timeout`` for a put);
    ``hint``: what the sender is, a plain get, a ring member, a get among known receivers or
    the receiver of one half (:mod:`hoplite_client.wire.locate_hints`)."""

    rid: int = 0
    oid: ObjectID
    timeout: float | None
    exclude: list[str]
    offset: int
    hint: LocateHint = PLAIN


@message(45, shape="reply", payload="small")
class Located(Reply):
    """A source to pull from, or (``source`` None) the object's bytes as the payload; with
    ``halves`` (lo0, hi0, lo1, hi1), no source: take the object as two halves, each located
    on its own, as receiver ``index`` of the two trees built for ``receivers``."""

    rid: int = 0
    source: str | None
    size: int
    dtype: str
    shape: list[int]
    version: bytes
    index: int = -1
    receivers: int = 0
    halves: list[int] | None = None


@message(46, shape="request", roles=(PEER,), payload="small")
class Publish(Request["Ok"]):
    """A store now holds a complete object; small objects carry their bytes. ``moved``: a
    copy published again because its owner moved, not a new put (docs/design.md §5,
    "Deletes and moving owners")."""

    rid: int = 0
    oid: ObjectID
    size: int
    dtype: str
    shape: list[int]
    version: bytes
    moved: bool = False


@message(47, shape="oneway", roles=(PEER,))
class Progress(WireMessage):
    """How many bytes of ``oid`` (of its half ``half``, if 0 or 1) the sender holds so far."""

    oid: ObjectID
    received: int
    half: int = -1


@message(48, shape="oneway", roles=(PEER,))
class TransferDone(WireMessage):
    """A pull from ``source`` ended; ``complete`` tells whether the sender has it all (all of
    half ``half``, if 0 or 1)."""

    oid: ObjectID
    source: str
    complete: bool
    half: int = -1


@message(49, shape="request", roles=(PEER,))
class DeleteEntry(Request["Deleted"]):
    """Remove the entry and every copy. ``again``: sent once more by the deleter because the
    id's owner moved since its delete, which removed ``version`` (None if unknown): an entry
    of another version stays, and no entry is no error (docs/design.md §5, "Deletes and
    moving owners"). ``retire``: as ``again``, for a version a collective makes once more
    under the same id (docs/design.md §4, "Ring allreduce"): its copies are withdrawn
    (``Drop.withdrawn``), and gets waiting on them take the next version."""

    rid: int = 0
    oid: ObjectID
    version: bytes | None = None
    again: bool = False
    retire: bool = False


@message(79, shape="reply")
class Deleted(Reply):
    """The answer to a ``DeleteEntry``: the version removed, None if the shard knew none."""

    rid: int = 0
    version: bytes | None


@message(80, shape="oneway", roles=(PEER,))
class Cancel(WireMessage):
    """The sender gave up on its request ``request``, sent on this connection: stop waiting
    for it, and send no reply. Only for kinds registered ``cancellable`` (waits); any other
    request, or one already answered, is left alone."""

    request: int


@message(81, shape="request", roles=(PEER,))
class Probe(Request["Alive"]):
    """From a member that declared the receiver dead and asks whether it runs; ``alive``: the
    sender's live set. Refused (``declared_dead``) if the receiver declared the sender dead
    too, else answered with the receiver's (docs/design.md §5, "Partitions heal")."""

    rid: int = 0
    alive: list[str]


@message(82, shape="reply")
class Alive(Reply):
    """The answer to a ``Probe``: the receiver's live set, on which it decided which side
    runs again (``hoplited/cluster/partitions.py``)."""

    rid: int = 0
    alive: list[str]


@message(83, shape="request", roles=(PEER,))
class PingFor(Request["Reached"]):
    """From a member whose own Pings to ``node`` go unanswered: ping it over your link, within
    ``timeout`` seconds (None: your heartbeat timeout; longer ones are cut to it), and say
    whether it answered. A member reached so is not declared dead for its silence to the
    sender (docs/design.md §5, "A link broken between two members")."""

    rid: int = 0
    node: str
    timeout: float | None


@message(84, shape="reply")
class Reached(Reply):
    """The answer to a ``PingFor``: whether ``node`` answered our Ping in time."""

    rid: int = 0
    reached: bool


@message(85, shape="request", roles=(PEER,))
class Roster(Request["Members"]):
    """Anti-entropy: ``digest`` is the sender's digest of its live set
    (``hoplited/cluster/membership.py``, ``roster_digest``). The receiver answers with its
    live members if its own digest differs, else with none; the sender learns of any it did
    not know (docs/design.md §5, "Membership converges")."""

    rid: int = 0
    digest: bytes


@message(50, shape="request", roles=(PEER,))
class Drop(Request["Ok"]):
    """The directory tells a holder to drop its copy of a deleted object (the delete returns
    once every live holder confirmed, so a get right after it cannot find a stale copy).
    ``withdrawn``: only that version goes, to be made again under the id (a retire): gets
    waiting on the copy fetch the object anew instead of failing."""

    rid: int = 0
    oid: ObjectID
    withdrawn: bool = False


@message(51, shape="request", roles=(PEER, TOOL))
class Stats(Request["StatusReply"]):
    rid: int = 0


@message(52, shape="request", roles=(PEER,))
class Announce(Request["Ok"]):
    """Soft state: the sender's holdings whose directory shard is the receiver; ``moved``:
    announced again because their owner moved."""

    rid: int = 0
    holdings: list[Holding]
    moved: bool = False


# --- 53-59, 62: reduce, coordinator to directory shards and tree nodes ---
@message(53, shape="request", roles=(PEER,), cancellable=True)
class WaitObject(Request["ObjectInfo"]):
    """Wait until ``oid`` is complete somewhere; answered by ObjectInfo (small ones inline)."""

    rid: int = 0
    oid: ObjectID
    timeout: float | None


@message(54, shape="reply", payload="small")
class ObjectInfo(Reply):
    rid: int = 0
    holders: list[str]
    size: int
    dtype: str
    shape: list[int]
    version: bytes


@message(55, shape="request", roles=(PEER,))
class FailEntry(Request["Ok"]):
    """Record that ``oid`` will never exist: gets of it fail with this error."""

    rid: int = 0
    oid: ObjectID
    code: str
    message: str


@message(56, shape="request", roles=(PEER,))
class ReduceTask(Request["TaskStarted"]):
    """Compute slot ``slot``: ``output`` = ``input`` combined with ``children`` child outputs,
    from byte ``start`` on (a repaired slot's consumer already holds the bytes before it).
    ``hi`` > 0: a stripe, the inputs' bytes ``lo..hi`` only (``dtype``/``shape``: the
    stripe's, a flat array). ``extras``: more inputs held on the node, added like ``input``."""

    rid: int = 0
    reduce_id: ObjectID
    slot: int
    input: ObjectID
    output: ObjectID
    op: str
    dtype: str
    shape: list[int]
    children: int
    start: int
    lo: int
    hi: int
    extras: list[ObjectID]


@message(57, shape="reply")
class TaskStarted(Reply):
    rid: int = 0
    version: bytes


@message(58, shape="request", roles=(PEER,))
class ReduceChild(Request["Ok"]):
    """Where the output of slot ``slot``'s child ``child`` is: ``node`` holds ``oid`` at
    ``version``; it adds bytes ``start`` to ``until`` (0: to the end) to the slot's sums. Sent
    again after a repair: the pull resumes where the last one stopped. ``slot_version``: the
    version of the slot's task output it is meant for (a task placed again refuses it).
    ``window`` (lo, hi): ``oid`` is a stripe's leaf, a whole input; the slot adds its bytes
    lo..hi, the stripe's, pulled or read where they are (docs/design.md §4, "A stripe's leaf
    has no task")."""

    rid: int = 0
    reduce_id: ObjectID
    slot: int
    child: int
    node: str
    oid: ObjectID
    version: bytes
    start: int
    until: int
    slot_version: bytes
    window: list[int] | None = None


@message(59, shape="oneway", roles=(PEER,))
class ReduceFailed(WireMessage):
    """Tree node to coordinator: slot ``slot`` cannot be computed."""

    reduce_id: ObjectID
    slot: int
    code: str
    message: str


# --- 60-61: data connections ---
@message(60, shape="request", roles=(DATA,))
class Pull(Request["DataStream"]):
    """Stream ``oid`` from ``offset`` on; with ``window`` (lo, hi), only its bytes lo..hi
    (a half of a broadcast taken as two halves; ``offset`` counts within the window)."""

    rid: int = 0
    oid: ObjectID
    version: bytes
    offset: int
    window: list[int] | None = None


@message(61, shape="reply", payload="stream")
class DataStream(Reply):
    """Header of an object stream: the payload is bytes ``offset..size`` of the object."""

    rid: int = 0
    offset: int
    size: int


@message(62, shape="oneway", roles=(PEER,))
class ReduceDone(WireMessage):
    """Coordinator to tree nodes: drop this reduce's temporary buffers."""

    reduce_id: ObjectID


@message(63, shape="oneway", roles=(PEER,))
class ReduceChildLost(WireMessage):
    """Tree node to coordinator: slot ``slot``'s pull of child ``child`` (at ``version``) broke
    at ``offset`` bytes; ``source_dead``: this node's membership says the source is dead;
    ``source_suspected``: alive, but suspected here (silent to us, or our link to it broken);
    ``consumer``: the version of the reporting task's output (a report from a task replaced
    since is stale)."""

    reduce_id: ObjectID
    slot: int
    child: int
    version: bytes
    offset: int
    source_dead: bool
    consumer: bytes
    code: str
    message: str
    source_suspected: bool = False


@message(86, shape="oneway", roles=(PEER,))
class ReduceHurry(WireMessage):
    """Coordinator to a tree node: slot ``slot``'s task (output ``version``) pulls child
    ``child`` ahead of the pulls its sibling tasks there (other stripes of the same input) make
    from the same node, which stop until it is done (docs/design.md §4, "The first
    combiner's chain goes first")."""

    reduce_id: ObjectID
    slot: int
    version: bytes
    child: int


# --- 64-65: a holder short of memory asks the owner shard to let its copy go ---
@message(64, shape="request", roles=(PEER,))
class EvictCopy(Request["EvictAnswer"]):
    """May the sender evict its complete copy of ``oid`` at ``version``? The shard agrees only
    if another live member holds all of it and no transfer reads from the sender, and then
    forgets the sender as a holder in the same step."""

    rid: int = 0
    oid: ObjectID
    version: bytes


@message(65, shape="reply")
class EvictAnswer(Reply):
    """``allowed``: drop the copy now (the shard no longer lists it); else ``reason``."""

    rid: int = 0
    allowed: bool
    reason: str


# --- 66-69: a lost input folded into another slot (docs/design.md §5) ---
@message(66, shape="request", roles=(PEER,))
class ReduceFold(Request["Folded"]):
    """Slot ``slot`` (output ``version``) adds ``input`` (at ``input_version``, held here) to
    its sums from byte ``at`` on, or from the first byte it has not combined yet if later."""

    rid: int = 0
    reduce_id: ObjectID
    slot: int
    version: bytes
    input: ObjectID
    input_version: bytes
    at: int


@message(67, shape="reply")
class Folded(Reply):
    """The byte the folded input enters the slot's sums from."""

    rid: int = 0
    at: int


@message(68, shape="request", roles=(PEER,))
class ReduceReshape(Request["ReshapeDone"]):
    """Slot ``slot`` (output ``version``) takes child ``child``'s bytes below ``until`` only,
    or below the first byte it has not combined yet if that is later (-1: there); ``more``
    new children (each connected by ``ReduceChild``) take over from there, which must then be
    ``until`` itself."""

    rid: int = 0
    reduce_id: ObjectID
    slot: int
    version: bytes
    child: int
    until: int
    more: int


@message(69, shape="reply")
class ReshapeDone(Reply):
    """The byte the child's bytes now end at."""

    rid: int = 0
    until: int


# --- 70-72: a striped allreduce (docs/design.md §4, "Striped allreduce") ---
@message(70, shape="request", roles=(PEER,))
class StripeTask(Request["Ok"]):
    """Caller's node to a node holding an input: hold ``result`` (``size`` bytes of
    ``dtype``/``shape`` at ``version``, cut in ``stripes`` stripes), fetching every stripe not
    reduced here; ``stripe`` >= 0: reduce that one (assignment ``gen``) over ``inputs``.
    ``pair``: the stripes are a pair's two halves (docs/design.md §4): a stripe reduced here
    is a combiner, and stripes are fetched in the directory's usual order, not ring order.
    ``ready``: inputs already complete, in the order they became ready, for the reduce of
    ``stripe`` to start from (at most ``MAX_READY``, each with at most ``MAX_READY_HOLDERS``
    holders)."""

    rid: int = 0
    result: ObjectID
    inputs: list[ObjectID]
    op: str
    size: int
    dtype: str
    shape: list[int]
    version: bytes
    stripes: int
    stripe: int
    gen: int
    timeout: float | None
    pair: bool
    ready: list[ReadyInput]


@message(71, shape="oneway", roles=(PEER,))
class StripeReport(WireMessage):
    """Member to the caller's node: ``code`` empty and ``stripe`` -1: the result is complete
    here; otherwise stripe ``stripe`` (assignment ``gen``; -1: the member) failed."""

    result: ObjectID
    stripe: int
    gen: int
    code: str
    message: str


@message(72, shape="oneway", roles=(PEER,))
class AllreduceFailed(WireMessage):
    """Caller's node to every member: the allreduce failed; drop the partial result."""

    result: ObjectID
    code: str
    message: str


# --- 73-77: a ring allreduce (docs/design.md §4, "Ring allreduce") ---
@message(73, shape="request", roles=(PEER,))
class RingTask(Request["Ok"]):
    """Caller's node to each ring member: this member is at ``position`` of a ring of
    ``members`` nodes, between ``predecessor`` and ``successor``, and adds ``inputs`` (an
    input listed twice counts twice); reduce them into ``result`` (``size`` bytes of
    ``dtype``/``shape`` at ``version``, which names this ring: a ring run again has another)
    with its neighbours, over one stream each way. A task names only its member's part, so
    the caller sends n small tasks, not n lists of the whole ring."""

    rid: int = 0
    result: ObjectID
    inputs: list[ObjectID]
    position: int
    members: int
    predecessor: str
    successor: str
    op: str
    size: int
    dtype: str
    shape: list[int]
    version: bytes


@message(74, shape="oneway", roles=(PEER,))
class RingReport(WireMessage):
    """Ring member to the caller's node: ``code`` empty: the whole result is here; otherwise
    why this member could not finish (``version``: the ring's, as in its task)."""

    result: ObjectID
    version: bytes
    code: str
    message: str


@message(75, shape="oneway", roles=(PEER,))
class RingEnd(WireMessage):
    """Caller's node to the ring's members. ``commit``: the result exists, publish your copy
    once whole; otherwise drop it (the allreduce starts over; ``fetch``: it is whole
    elsewhere, fetch it from there). ``version``: which ring."""

    result: ObjectID
    version: bytes
    commit: bool
    fetch: bool = False


@message(76, shape="request", roles=(DATA,))
class RingOpen(Request["Ok"]):
    """A ring member to its successor, first on a ``ring`` connection: the segments of
    ``result``'s ring (``version``) follow on it (answered once the successor has its task)."""

    rid: int = 0
    result: ObjectID
    version: bytes


@message(77, shape="oneway", roles=(DATA,), payload="stream")
class RingSegment(WireMessage):
    """The ``index``-th segment of the ring's schedule; its payload is that segment's bytes."""

    index: int


_resolve_replies(globals())


def kinds_for(role: Role) -> list[type[WireMessage]]:
    """The requests and one-ways ``role`` may send: a server of that role handles each."""
    return [cls for cls in MESSAGES.values() if role in cls.ROLES]


@message(78, shape="oneway", roles=(PEER,))
class Alarm(WireMessage):
    """From a member that watches ``node``: it is suspected (``dead``: declared dead); check it
    yourself (docs/design.md §5, "Watchers")."""

    node: str
    dead: bool
