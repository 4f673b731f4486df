"""Request/reply over a :class:`FrameProtocol`: request ids, futures, typed error replies.

Every request gets a future keyed by its request id; all of them fail with
:class:`ConnectionLostError` the moment the connection closes.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Callable, Optional

from hoplite_client.net.protocol import FrameHandler, FrameProtocol
from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    HopliteTimeoutError,
    RemoteProtocolError,
    error_from_wire,
)
from hoplite_client.wire.frames import Frame
from hoplite_client.wire.messages import Error

log = logging.getLogger("hoplite.channel")


class Channel:
    """Request/reply over a :class:`FrameProtocol`: replies matched to requests by ``rid``."""

    def __init__(self, protocol: FrameProtocol, reply_kinds: frozenset[type],
                 on_request: Optional[FrameHandler] = None) -> None:
        self.protocol = protocol
        self._reply_kinds = reply_kinds
        self._on_request = on_request
        self._rids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._lost: Optional[HopliteError] = None
        protocol.handler = self._dispatch
        protocol.on_lost.append(self._fail_all)

    @property
    def is_open(self) -> bool:
        return self._lost is None

    async def request(self, make: Callable[[int], Any], payload: Any = None,
                      timeout: Optional[float] = None) -> Frame:
        """Send ``make(rid)`` and wait for its reply; an ``Error`` reply raises its typed error."""
        if self._lost is not None:
            raise self._lost
        rid = next(self._rids)
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self.protocol.send(make(rid), payload)
            frame = await asyncio.wait_for(fut, timeout) if timeout is not None else await fut
        except asyncio.TimeoutError:
            raise HopliteTimeoutError(f"{self.protocol.name}: no reply within {timeout}s") from None
        finally:
            self._pending.pop(rid, None)
        if isinstance(frame.msg, Error):
            raise error_from_wire(frame.msg.code, frame.msg.message, frame.msg.data)
        return frame

    def notify(self, msg: Any, payload: Any = None) -> None:
        """Send a one-way message (no reply expected)."""
        if self._lost is not None:
            raise self._lost
        self.protocol.send(msg, payload)

    def _dispatch(self, frame: Frame) -> None:
        msg = frame.msg
        if type(msg) in self._reply_kinds:
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

    def _fail_all(self, exc: Optional[BaseException]) -> None:
        self._lost = ConnectionLostError(f"{self.protocol.name}: connection lost"
                                         + (f" ({exc})" if exc else ""))
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(self._lost)
        self._pending.clear()

    def close(self) -> None:
        self.protocol.close()


def remote_error(rid: int, exc: Exception) -> Error:
    """The ``Error`` reply to request ``rid`` for ``exc`` (typed errors keep code and data)."""
    if isinstance(exc, HopliteError):
        data = {k: v for k, v in exc.data.items() if isinstance(v, (str, int, float, bool))}
        code = exc.code if not isinstance(exc, RemoteProtocolError) else "protocol"
        return Error(rid=rid, code=code, message=exc.message or str(exc), data=data)
    return Error(rid=rid, code="internal", message=f"{type(exc).__name__}: {exc}", data={})
