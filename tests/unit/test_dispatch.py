"""The per-role dispatch tables: completeness at start-up, replies stamped, errors typed."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from hoplite_client.wire.errors import DeclaredDeadError, ObjectNotFoundError
from hoplite_client.wire.frames import Frame
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    CLIENT,
    PEER,
    TOOL,
    Error,
    Get,
    Ok,
    Ping,
    Progress,
    Put,
    Seal,
    Stats,
    StatusReply,
    kinds_for,
)
from hoplited.dispatch import Dispatcher, check_complete
from hoplited.tasks import Tasks

OID = ObjectID(bytes(20))


def collect(sent: list[Any]) -> Any:
    """A ``respond`` that keeps each reply as it would go out, its request id stamped."""
    return lambda reply, payload, rid: sent.append(dataclasses.replace(reply, rid=rid))


def full_table(role: str, **overrides: Any) -> dict[type, Any]:
    """A handler for every kind ``role`` may send (each answers Ok), with overrides by name."""
    table: dict[type, Any] = {cls: (lambda origin, msg, payload: Ok()) for cls in kinds_for(role)}
    for name, handler in overrides.items():
        (cls,) = [c for c in table if c.__name__ == name]
        table[cls] = handler
    return table


def test_a_missing_handler_refuses_to_start() -> None:
    table = full_table(CLIENT)
    del table[Seal]
    with pytest.raises(RuntimeError, match="Seal"):
        Dispatcher(CLIENT, table, Tasks())
    with pytest.raises(RuntimeError, match="Seal"):
        check_complete(CLIENT, table)


def test_tool_table_is_the_peer_table_restricted_to_tool_kinds() -> None:
    table = full_table(PEER)
    tool = Dispatcher(TOOL, table, Tasks())
    sent: list[Any] = []
    tool.deliver("tool-1", Frame(Seal(rid=3, oid=OID)), collect(sent))
    tool.deliver("tool-1", Frame(Ping(rid=4)), collect(sent))
    assert sent[0] == Error(rid=3, code="protocol", message="Seal is not accepted from a tool",
                            data={})
    assert sent[1] == Ok(rid=4)


@pytest.mark.parametrize("handler,expected", [
    (lambda o, m, p: StatusReply(info={"n": 1}), StatusReply(rid=7, info={"n": 1})),
    (lambda o, m, p: (StatusReply(info={}), b"xy"), StatusReply(rid=7, info={})),
    (lambda o, m, p: None, Error(rid=7, code="internal",
                                 message="RuntimeError: Stats handler gave no reply", data={})),
    (lambda o, m, p: (_ for _ in ()).throw(ObjectNotFoundError("gone", oid="ab")),
     Error(rid=7, code="not_found", message="gone", data={"oid": "ab"})),
], ids=["reply", "reply-with-payload", "no-reply-is-an-error", "typed-error"])
def test_sync_request_answers(handler: Any, expected: Any) -> None:
    dispatcher = Dispatcher(PEER, full_table(PEER, Stats=handler), Tasks())
    sent: list[Any] = []
    dispatcher.deliver("peer-1", Frame(Stats(rid=7)), collect(sent))
    assert sent == [expected]


async def test_async_handler_runs_as_an_owned_task_and_local_calls_raise_typed() -> None:
    async def stats(origin: str, msg: Stats, payload: Any) -> StatusReply:
        await asyncio.sleep(0)
        return StatusReply(info={"from": origin})

    async def missing(origin: str, msg: Stats, payload: Any) -> StatusReply:
        raise ObjectNotFoundError("nothing here")

    tasks = Tasks()
    dispatcher = Dispatcher(PEER, full_table(PEER, Stats=stats), tasks)
    sent: list[Any] = []
    dispatcher.deliver("peer-2", Frame(Stats(rid=9)), collect(sent))
    assert sent == [] and len(tasks) == 1
    await asyncio.sleep(0.01)
    assert sent == [StatusReply(rid=9, info={"from": "peer-2"})] and len(tasks) == 0
    frame = await dispatcher.call("me", Stats(), None)
    assert frame.msg == StatusReply(info={"from": "me"})
    with pytest.raises(ObjectNotFoundError):
        await Dispatcher(PEER, full_table(PEER, Stats=missing), tasks).call("me", Stats(), None)


def test_every_frame_of_a_member_declared_dead_is_refused() -> None:
    """docs/design.md §5, "Declared dead, then running again": a request from a member we
    declared dead gets DeclaredDeadError (Pings included: they are how it learns), a one-way
    from it reaches no handler, and every other member is served as before."""
    handled: list[str] = []

    def progress(origin: str, msg: Progress, payload: Any) -> None:
        handled.append(origin)

    def refuse(origin: str) -> DeclaredDeadError | None:
        return DeclaredDeadError("declared dead", by="me") if origin == "zombie" else None

    dispatcher = Dispatcher(PEER, full_table(PEER, Progress=progress), Tasks(), refuse=refuse)
    sent: list[Any] = []
    for origin in ("zombie", "alive"):
        dispatcher.deliver(origin, Frame(Ping(rid=5)), collect(sent))
        dispatcher.deliver(origin, Frame(Progress(oid=OID, received=1)), None)
    assert sent == [Error(rid=5, code="declared_dead", message="declared dead",
                          data={"by": "me"}), Ok(rid=5)]
    assert handled == ["alive"]


async def test_a_sync_handler_that_must_wait_returns_an_awaitable_and_keeps_its_order() -> None:
    """A synchronous handler runs on arrival; one that must wait hands back an awaitable,
    answered once it is done (its error typed), while a frame after it is handled at once;
    one cancelled before it ran (its connection closed) is closed, never left unawaited."""
    arrived: list[int] = []
    gate = asyncio.Event()

    async def later(rid: int) -> StatusReply:
        await gate.wait()
        if rid == 2:
            raise ObjectNotFoundError("went while waiting")
        return StatusReply(info={"rid": rid})

    def stats(origin: str, msg: Stats, payload: Any) -> Any:
        arrived.append(msg.rid)
        return StatusReply(info={"rid": msg.rid}) if msg.rid == 3 else later(msg.rid)

    tasks = Tasks()
    dispatcher = Dispatcher(PEER, full_table(PEER, Stats=stats), tasks)
    sent: list[Any] = []
    for rid in (1, 2, 3):
        dispatcher.deliver("peer-3", Frame(Stats(rid=rid)), collect(sent))
    assert arrived == [1, 2, 3]  # every handler ran on arrival, in order
    assert sent == [StatusReply(rid=3, info={"rid": 3})] and len(tasks) == 2
    gate.set()
    await asyncio.sleep(0.01)
    assert sent[1:] == [StatusReply(rid=1, info={"rid": 1}),
                        Error(rid=2, code="not_found", message="went while waiting", data={})]
    gate.clear()
    dispatcher.deliver("peer-3", Frame(Stats(rid=4)), collect(sent))
    dispatcher.close()
    await asyncio.sleep(0.01)
    assert len(sent) == 3 and len(tasks) == 0


async def test_a_lasting_kind_is_handled_to_its_end_after_its_sender_goes() -> None:
    """docs/design.md §2.2, "A put outlives its client": the sender's leaving cancels its
    other requests, not those of a lasting kind, which still answer (into a closed
    connection, whose ``respond`` drops it)."""
    gate = asyncio.Event()
    ended: list[str] = []

    async def wait(origin: str, msg: Any, payload: Any) -> Ok:
        try:
            await gate.wait()
        except asyncio.CancelledError:
            ended.append(f"{type(msg).__name__} cancelled")
            raise
        ended.append(f"{type(msg).__name__} done")
        return Ok()

    tasks = Tasks()
    dispatcher = Dispatcher(CLIENT, full_table(CLIENT, Put=wait, Get=wait), tasks,
                            lasting=(Put,))
    sent: list[Any] = []
    dispatcher.deliver("client", Frame(Put(rid=1, oid=OID, dtype="|u1", shape=[0],
                                           timeout=None)), collect(sent))
    dispatcher.deliver("client", Frame(Get(rid=2, oid=OID, timeout=None)), collect(sent))
    await asyncio.sleep(0.01)
    dispatcher.close()
    await asyncio.sleep(0.01)
    assert ended == ["Get cancelled"]
    gate.set()
    await asyncio.sleep(0.01)
    assert ended == ["Get cancelled", "Put done"] and sent == [Ok(rid=1)] and len(tasks) == 0
