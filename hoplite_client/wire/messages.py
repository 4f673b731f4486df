"""Every message of the protocol, one record per kind.

The prelude's ``kind`` byte selects the record; the msgpack header holds its fields as an
array; bulk data (object bytes) travels only as the frame's raw payload. Requests carry a
request id ``rid`` echoed by their reply (``Ok``, ``Error`` or an op-specific reply).
"""

from __future__ import annotations

from typing import Any, Optional

from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.schema import record

MESSAGES: dict[int, type] = {}


def message(kind: int, *, payload: str = "none"):
    """Register a record as wire message ``kind``; ``payload`` is none|small|stream."""

    def wrap(cls: type) -> type:
        rec = record(cls)
        rec.KIND = kind
        rec.PAYLOAD = payload
        if kind in MESSAGES:
            raise RuntimeError(f"message kind {kind} registered twice")
        MESSAGES[kind] = rec
        return rec

    return wrap


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
    """One object a store holds, as re-announced to the object's directory shard."""

    oid: ObjectID
    size: int
    dtype: str
    shape: list[int]
    version: bytes
    received: int


# --- handshake on TCP connections (daemon to daemon, tools) ---
@message(1)
class Hello:
    versions: list[int]
    node_id: str
    nonce: bytes
    role: str  # "peer" (control), "data" (object streams) or "tool"


@message(2)
class Welcome:
    version: int
    node_id: str
    nonce: bytes
    proof: bytes


@message(3)
class Auth:
    proof: bytes


@message(4)
class Accepted:
    version: int


# --- handshake on the Unix socket (client to its local daemon) ---
@message(5)
class ClientHello:
    versions: list[int]
    pid: int


@message(6)
class ClientWelcome:
    """Sent with the arena's file descriptor attached (SCM_RIGHTS)."""

    version: int
    node_id: str
    arena_size: int


# --- generic replies ---
@message(10)
class Ok:
    rid: int


@message(11)
class Error:
    rid: int
    code: str
    message: str
    data: dict[str, Any]


# --- client to local daemon ---
@message(20, payload="small")
class Put:
    """Put a small object whose bytes ride as the payload."""

    rid: int
    oid: ObjectID
    dtype: str
    shape: list[int]


@message(21)
class Create:
    """Reserve room for a large object the client then writes into shared memory."""

    rid: int
    oid: ObjectID
    size: int
    dtype: str
    shape: list[int]


@message(22)
class Created:
    rid: int
    offset: int


@message(23)
class Seal:
    rid: int
    oid: ObjectID


@message(24)
class Abort:
    rid: int
    oid: ObjectID


@message(25)
class Get:
    rid: int
    oid: ObjectID
    timeout: Optional[float]


@message(26, payload="small")
class Found:
    """Where a complete local copy lives (``offset`` in the arena), or the bytes themselves."""

    rid: int
    size: int
    dtype: str
    shape: list[int]
    offset: Optional[int]


@message(27)
class Delete:
    rid: int
    oid: ObjectID


@message(28)
class Release:
    """One-way: the client dropped these views (one entry per view)."""

    oids: list[ObjectID]


@message(29)
class Status:
    rid: int


@message(30)
class StatusReply:
    rid: int
    info: dict[str, Any]


# --- daemon to daemon: membership and liveness ---
@message(40)
class Join:
    rid: int
    member: MemberInfo


@message(41)
class Members:
    rid: int
    members: list[MemberInfo]


@message(42)
class MemberUp:
    rid: int
    member: MemberInfo


@message(43)
class Ping:
    rid: int


# --- daemon to directory shard ---
@message(44)
class Locate:
    """Ask the owner shard for a source of ``oid`` (waiting up to ``timeout`` for a put)."""

    rid: int
    oid: ObjectID
    timeout: Optional[float]
    exclude: list[str]
    offset: int


@message(45, payload="small")
class Located:
    """A source to pull from, or (``source`` None) the object's bytes as the payload."""

    rid: int
    source: Optional[str]
    size: int
    dtype: str
    shape: list[int]
    version: bytes


@message(46, payload="small")
class Publish:
    """A store now holds a complete object; small objects carry their bytes."""

    rid: int
    oid: ObjectID
    size: int
    dtype: str
    shape: list[int]
    version: bytes


@message(47)
class Progress:
    """One-way: how many bytes of ``oid`` the sender holds so far."""

    oid: ObjectID
    received: int


@message(48)
class TransferDone:
    """One-way: a pull from ``source`` ended; ``complete`` tells whether the sender has it all."""

    oid: ObjectID
    source: str
    complete: bool


@message(49)
class DeleteEntry:
    rid: int
    oid: ObjectID


@message(50)
class Drop:
    """One-way: the directory tells a holder to drop its copy of a deleted object."""

    oid: ObjectID


@message(51)
class Stats:
    rid: int


@message(52)
class Announce:
    """Soft state: the sender's holdings whose directory shard is the receiver."""

    rid: int
    holdings: list[Holding]


# --- data connections ---
@message(60)
class Pull:
    rid: int
    oid: ObjectID
    version: bytes
    offset: int


@message(61, payload="stream")
class DataStream:
    """Header of an object stream: the payload is bytes ``offset..size`` of the object."""

    rid: int
    offset: int
    size: int


# --- reduce: client to its daemon ---
@message(31)
class Reduce:
    """Reduce the first ``num_objects`` ready inputs with ``op`` into ``result``."""

    rid: int
    result: ObjectID
    inputs: list[ObjectID]
    op: str
    num_objects: int
    timeout: Optional[float]


@message(32)
class ReducedInputs:
    rid: int
    result: ObjectID
    timeout: Optional[float]


@message(33)
class InputList:
    rid: int
    inputs: list[ObjectID]


# --- reduce: coordinator to directory shards and tree nodes ---
@message(53)
class WaitObject:
    """Wait until ``oid`` is complete somewhere; answered by ObjectInfo (small ones inline)."""

    rid: int
    oid: ObjectID
    timeout: Optional[float]


@message(54, payload="small")
class ObjectInfo:
    rid: int
    holders: list[str]
    size: int
    dtype: str
    shape: list[int]
    version: bytes


@message(55)
class FailEntry:
    """Record that ``oid`` will never exist: gets of it fail with this error."""

    rid: int
    oid: ObjectID
    code: str
    message: str


@message(56)
class ReduceTask:
    """Compute slot ``slot``: ``output`` = ``input`` combined with ``children`` child outputs."""

    rid: int
    reduce_id: ObjectID
    slot: int
    input: ObjectID
    output: ObjectID
    op: str
    dtype: str
    shape: list[int]
    children: int


@message(57)
class TaskStarted:
    rid: int
    version: bytes


@message(58)
class ReduceChild:
    """Where slot ``slot``'s next child output is: ``node`` holds ``oid`` at ``version``."""

    rid: int
    reduce_id: ObjectID
    slot: int
    node: str
    oid: ObjectID
    version: bytes


@message(59)
class ReduceFailed:
    """One-way, tree node to coordinator: slot ``slot`` cannot be computed."""

    reduce_id: ObjectID
    slot: int
    code: str
    message: str


@message(62)
class ReduceDone:
    """One-way, coordinator to tree nodes: drop this reduce's temporary buffers."""

    reduce_id: ObjectID


REPLY_KINDS: frozenset[type] = frozenset(
    {Ok, Error, Created, Found, StatusReply, Members, Located, DataStream, InputList, ObjectInfo,
     TaskStarted})
