"""Request/reply over a :class:`FrameProtocol`: request ids, futures, typed error replies.

The channel stamps each request with a fresh id and keeps a future for it; the reply with the
same id completes it. A reply must be of the kind the request declares
(:mod:`hoplite_client.wire.messages`) or an ``Error``, which is raised as its typed error. All
pending requests fail with :class:`ConnectionLostError` the moment the connection closes.
Frames that are not replies (requests and one-ways from the other side) go to ``on_request``.
A request of a ``cancellable`` kind (a wait) that its caller gives up on, by its timeout or by
being cancelled, is followed by a ``Cancel``, so the other side stops waiting for nobody.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import TypeVar, cast

from hoplite_client.net.protocol import FrameProtocol, Phase
from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    HopliteTimeoutError,
    LocalProtocolError,
    RemoteProtocolError,
    error_from_wire,
)
from hoplite_client.wire.frames import Frame, Payload, StreamSink
from hoplite_client.wire.messages import Cancel, Error, Reply, Request, WireMessage

log = logging.getLogger("hoplite.channel")

R = TypeVar("R", bound=WireMessage)
RequestHandler = Callable[[Frame[WireMessage]], None]


class Channel:
    """Request/reply over a :class:`FrameProtocol`: replies matched to requests by ``rid``."""

    def __init__(self, protocol: FrameProtocol, on_request: RequestHandler | None = None,
                 *, sink: StreamSink | None = None) -> None:
        """Take ``protocol`` after its handshake; with ``sink`` (a daemon's session with a
        client), streamed puts land there and small requests keep being read ahead."""
        self.protocol = protocol
        self._on_request = on_request
        self._rids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Frame[WireMessage]]] = {}
        self._lost: HopliteError | None = None
        protocol.enter(Phase.CHANNEL, handler=self._dispatch)
        if sink is not None:
            protocol.enter(Phase.CLIENT, handler=self._dispatch, sink=sink, read_ahead=True)
        protocol.on_lost.append(self._fail_all)

    @property
    def is_open(self) -> bool:
        return self._lost is None

    async def request(self, msg: Request[R], payload: Payload | None = None,
                      timeout: float | None = None, bulk: bool = False) -> Frame[R]:
        """Send ``msg`` under a fresh request id and wait for its reply; an ``Error`` reply
        raises its typed error, a reply of another kind is a protocol error. ``bulk``: a
        large payload, written by a worker thread (``FrameProtocol.send_bulk``)."""
        if self._lost is not None:
            raise self._lost
        rid = next(self._rids)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Frame[WireMessage]] = loop.create_future()
        self._pending[rid] = fut
        # a timer on the reply's future, not an asyncio.timeout scope: a small request's
        # whole cost is a few such steps (docs/design.md §2.4, "Small requests")
        timer = None if timeout is None else loop.call_later(timeout, _expire, fut)
        try:
            if bulk and payload is not None:
                await self.protocol.send_bulk(msg, payload, rid)
            else:
                self.protocol.send(msg, payload, rid)
            frame = await fut
        except _NoReply:
            self._abandon(msg, rid, answered=False)
            raise HopliteTimeoutError(f"{self.protocol.name}: no reply within {timeout}s") from None
        except asyncio.CancelledError:
            self._abandon(msg, rid, answered=fut.done() and not fut.cancelled())
            raise
        finally:
            if timer is not None:
                timer.cancel()
            self._pending.pop(rid, None)
        reply = frame.msg
        if isinstance(reply, Error):
            raise error_from_wire(reply.code, reply.message, reply.data)
        if type(reply) is not type(msg).REPLY:
            raise RemoteProtocolError(f"{self.protocol.name}: {type(msg).__name__} answered by "
                                      f"{type(reply).__name__}")
        return cast(Frame[R], frame)  # its kind was checked against the request's REPLY above

    def _abandon(self, msg: WireMessage, rid: int, answered: bool) -> None:
        """The caller gave up on request ``rid`` (``answered``: its reply had come): if it
        only waits, and was not answered, tell the other side."""
        if type(msg).CANCELLABLE and not answered and self._lost is None:
            try:
                self.protocol.send(Cancel(request=rid), None)
            except HopliteError as exc:
                log.debug("%s: could not cancel request %d: %s", self.protocol.name, rid, exc)

    def notify(self, msg: WireMessage, payload: Payload | None = None) -> None:
        """Send a one-way message (no reply expected)."""
        if type(msg).SHAPE != "oneway":
            raise LocalProtocolError(f"{type(msg).__name__} is not a one-way message")
        if self._lost is not None:
            raise self._lost
        self.protocol.send(msg, payload)

    def _dispatch(self, frame: Frame[WireMessage]) -> None:
        msg = frame.msg
        if isinstance(msg, Reply):  # registration ties shape "reply" to the Reply base
            fut = self._pending.get(msg.rid)
            if fut is not None and not fut.done():
                fut.set_result(frame)
            elif isinstance(msg, Error):
                log.warning("%s: peer reported %s: %s", self.protocol.name, msg.code, msg.message)
        elif self._on_request is not None:
            self._on_request(frame)
        else:
            log.warning("%s: unexpected %s", self.protocol.name, type(msg).__name__)
            self.protocol.send(Error(rid=getattr(msg, "rid", 0), code="protocol",
                                     message=f"unexpected {type(msg).__name__}", data={}))

    def _fail_all(self, exc: BaseException | None) -> None:
        self._lost = ConnectionLostError(f"{self.protocol.name}: connection lost"
                                         + (f" ({exc})" if exc else ""))
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(self._lost)
        self._pending.clear()

    def close(self) -> None:
        self.protocol.close()


class _NoReply(Exception):
    """A request's timeout ran out before its reply came (set on the reply's future)."""


def _expire(fut: asyncio.Future[Frame[WireMessage]]) -> None:
    if not fut.done():
        fut.set_exception(_NoReply())


def error_reply(exc: BaseException, rid: int = 0) -> Error:
    """The ``Error`` reply for ``exc`` (typed errors keep their code and plain data)."""
    if isinstance(exc, HopliteError):
        data = {k: v for k, v in exc.data.items() if isinstance(v, (str, int, float, bool))}
        code = exc.code if not isinstance(exc, RemoteProtocolError) else "protocol"
        return Error(rid=rid, code=code, message=exc.message or str(exc), data=data)
    return Error(rid=rid, code="internal", message=f"{type(exc).__name__}: {exc}", data={})
