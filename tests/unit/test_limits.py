"""Timeouts and id lists at the protocol's edges: what a timeout means (one rule, client and
daemon), how the dispatcher applies it, and frames that list many ids staying under
MAX_HEADER (Release batches, the largest Reduce and InputList)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from hoplite_client.client import release_notices
from hoplite_client.wire import messages as m
from hoplite_client.wire.errors import InvalidArgumentError
from hoplite_client.wire.frames import (
    MAX_HEADER,
    MAX_IDS_PER_FRAME,
    MAX_READY,
    MAX_READY_HOLDERS,
    Frame,
    encode_header,
)
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.locate_hints import PLAIN
from hoplite_client.wire.timeouts import check_timeout
from hoplited.dispatch import Dispatcher, checked_timeout
from hoplited.tasks import Tasks

OID = ObjectID(bytes(20))
NAN, INF = math.nan, math.inf
# Room a list-carrying frame at its limit must still leave under MAX_HEADER.
HEADER_MARGIN = 16 * 1024


def ids(n: int) -> list[ObjectID]:
    """``n`` distinct ids."""
    return [ObjectID(i.to_bytes(20, "big")) for i in range(n)]


async def until_answered(sent: list[Any], n: int) -> None:
    """Return once ``n`` replies were sent (async handlers answer from their tasks)."""
    while len(sent) < n:
        await asyncio.sleep(0.01)


# --- check_timeout: the one definition -------------------------------------------------------

@pytest.mark.parametrize("value,expected", [
    (None, None), (INF, None), (np.float64(INF), None), (10**400, None),
    (0, 0.0), (0.0, 0.0), (-0.0, 0.0), (np.int64(0), 0.0),
    (1, 1.0), (2.5, 2.5), (np.float32(1.5), 1.5), (Fraction(1, 4), 0.25), (1e300, 1e300),
], ids=repr)
def test_accepted_timeouts(value: Any, expected: float | None) -> None:
    got = check_timeout(value)
    assert got == expected and (got is None or type(got) is float)
    assert got is None or math.copysign(1.0, got) == 1.0  # -0.0 is plain 0


@pytest.mark.parametrize("value", [
    -1, -0.5, -INF, NAN, np.float64(NAN), -(10**400), True, False, np.bool_(True), "1", b"1",
    [1.0], object()], ids=lambda v: "object()" if type(v) is object else repr(v))
def test_refused_timeouts(value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="timeout"):
        check_timeout(value)


# --- the dispatcher applies it to every kind with a timeout field -----------------------------

WITH_TIMEOUT = [cls for cls in m.MESSAGES.values() if "timeout" in cls.__dataclass_fields__]


def with_timeout(cls: type[m.WireMessage], timeout: Any) -> Any:
    """A ``cls`` message whose ``timeout`` is ``timeout`` (other fields: plain values)."""
    values = {"oid": OID, "result": OID, "inputs": [OID], "op": "sum", "num_objects": 1,
              "exclude": [], "offset": 0, "size": 4, "dtype": "<f4", "shape": [1],
              "version": b"v", "stripes": 1, "stripe": 0, "gen": 0, "striped": True,
              "receivers": 0, "hint": PLAIN, "pair": False, "node": "n1", "ready": []}
    fields = [f for f in cls.__dataclass_fields__ if f not in ("rid", "timeout")]
    return cls(rid=3, timeout=timeout, **{f: values[f] for f in fields})


def test_every_waiting_kind_is_covered() -> None:
    assert {c.__name__ for c in WITH_TIMEOUT} == {"Get", "Reduce", "ReducedInputs", "Locate",
                                                   "WaitObject", "Put", "Create", "Allreduce",
                                                   "StripeTask", "PingFor"}


@pytest.mark.parametrize("cls", WITH_TIMEOUT, ids=lambda c: c.__name__)
@pytest.mark.parametrize("value,expected", [(None, None), (INF, None), (0.0, 0.0), (2.0, 2.0)])
def test_checked_timeout_normalises(cls: type[m.WireMessage], value: Any,
                                    expected: float | None) -> None:
    msg = with_timeout(cls, value)
    checked: Any = checked_timeout(msg)
    assert checked.timeout == expected and type(checked) is cls
    assert (checked is msg) == (value == expected)  # untouched unless it had to change


@pytest.mark.parametrize("cls", WITH_TIMEOUT, ids=lambda c: c.__name__)
@pytest.mark.parametrize("value", [NAN, -INF, -1.0])
def test_checked_timeout_refuses(cls: type[m.WireMessage], value: float) -> None:
    with pytest.raises(InvalidArgumentError):
        checked_timeout(with_timeout(cls, value))


def test_messages_without_a_timeout_pass_untouched() -> None:
    msg = m.Status(rid=1)
    assert checked_timeout(msg) is msg


async def test_dispatcher_answers_invalid_and_never_calls_the_handler() -> None:
    """NaN / negative / -inf: an ``invalid`` Error with the request's rid, sync or async
    handler; inf reaches the handler as None."""
    seen: list[Any] = []

    async def on_get(origin: str, msg: m.Get, payload: Any) -> m.Found:
        seen.append(msg.timeout)
        return m.Found(size=0, dtype="|u1", shape=[0], offset=None)

    def on_reduced(origin: str, msg: m.ReducedInputs, payload: Any) -> m.InputList:
        seen.append(msg.timeout)
        return m.InputList(inputs=[])

    table: dict[type, Any] = {cls: (lambda o, msg, p: m.Ok()) for cls in m.kinds_for(m.CLIENT)}
    table[m.Get], table[m.ReducedInputs] = on_get, on_reduced
    tasks = Tasks()
    dispatcher = Dispatcher(m.CLIENT, table, tasks)
    sent: list[Any] = []
    for rid, value in enumerate([NAN, -1.0, -INF], start=1):
        dispatcher.deliver("c", Frame(m.Get(rid=rid, oid=OID, timeout=value)),
                           lambda msg, p, rid: sent.append(dataclasses.replace(msg, rid=rid)))
        dispatcher.deliver("c", Frame(m.ReducedInputs(rid=rid + 10, result=OID, timeout=value)),
                           lambda msg, p, rid: sent.append(dataclasses.replace(msg, rid=rid)))
    assert [(e.rid, e.code) for e in sent] == [(1, "invalid"), (11, "invalid"), (2, "invalid"),
                                                (12, "invalid"), (3, "invalid"), (13, "invalid")]
    assert seen == [] and len(tasks) == 0
    sent.clear()
    dispatcher.deliver("c", Frame(m.Get(rid=21, oid=OID, timeout=INF)),
                       lambda msg, p, rid: sent.append(dataclasses.replace(msg, rid=rid)))
    dispatcher.deliver("c", Frame(m.ReducedInputs(rid=22, result=OID, timeout=INF)),
                       lambda msg, p, rid: sent.append(dataclasses.replace(msg, rid=rid)))
    await asyncio.wait_for(until_answered(sent, 2), 30)
    assert seen == [None, None]
    assert sorted(type(r).__name__ for r in sent) == ["Found", "InputList"]
    with pytest.raises(InvalidArgumentError):
        await dispatcher.call("me", m.Get(oid=OID, timeout=NAN), None)


def test_a_reply_too_large_to_send_becomes_a_protocol_error() -> None:
    """A handler bug that builds an oversized reply answers ``protocol``, never nothing."""
    table: dict[type, Any] = {cls: (lambda o, msg, p: m.Ok()) for cls in m.kinds_for(m.PEER)}
    table[m.Stats] = lambda o, msg, p: m.StatusReply(info={"x": "y" * (MAX_HEADER + 1)})
    dispatcher = Dispatcher(m.PEER, table, Tasks())
    sent: list[Any] = []

    def respond(msg: m.WireMessage, payload: Any, rid: int) -> None:
        encode_header(msg, 0, rid)  # what a connection's send does first
        sent.append(dataclasses.replace(msg, rid=rid))

    dispatcher.deliver("p", Frame(m.Stats(rid=4)), respond)
    assert [(type(r).__name__, r.rid, r.code) for r in sent] == [("Error", 4, "protocol")]


# --- frames that list ids --------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, MAX_IDS_PER_FRAME - 1, MAX_IDS_PER_FRAME,
                               MAX_IDS_PER_FRAME + 1, 2 * MAX_IDS_PER_FRAME + 3, 25_000])
def test_release_notices_carry_every_id_in_frames_that_fit(n: int) -> None:
    oids = ids(n)
    notices = release_notices(oids)
    assert len(notices) == math.ceil(n / MAX_IDS_PER_FRAME)
    assert [oid for notice in notices for oid in notice.oids] == oids
    for notice in notices:
        assert 0 < len(notice.oids) <= MAX_IDS_PER_FRAME
        assert len(encode_header(notice)) <= MAX_HEADER - HEADER_MARGIN


def test_largest_reduce_and_its_input_list_fit_with_margin() -> None:
    """The largest Reduce, Allreduce and StripeTask (long op name, largest ints, a timeout,
    every input it may name ready with every holder it may name, node ids of 12 hex digits)
    and InputList fit."""
    inputs = ids(MAX_IDS_PER_FRAME)
    reduce = m.Reduce(rid=2**64 - 1, result=OID, inputs=inputs, op="x" * 64,
                      num_objects=2**64 - 1, timeout=1e300)
    reply = m.InputList(rid=2**64 - 1, inputs=inputs)
    allreduce = m.Allreduce(rid=2**64 - 1, result=OID, inputs=inputs, op="x" * 64,
                            striped=True, timeout=1e300)
    stripe = m.StripeTask(rid=2**64 - 1, result=OID, inputs=inputs, op="x" * 64,
                          size=2**64 - 1, dtype="<c16", shape=[2**62] * 32, version=b"v" * 8,
                          stripes=2**32, stripe=2**32, gen=2**32, timeout=1e300,
                          pair=True, ready=[m.ReadyInput(oid=oid, holders=["f" * 12] * MAX_READY_HOLDERS,
                                                         version=b"v" * 8)
                                            for oid in inputs[:MAX_READY]])
    for msg in (reduce, reply, allreduce, stripe):
        assert len(encode_header(msg)) <= MAX_HEADER - HEADER_MARGIN
