"""Routing of incoming requests and one-ways to their handlers, one table per role.

A :class:`Dispatcher` is built from ``{message type: handler}`` for one role (client, peer or
tool). At construction it checks that every kind the role may send has a handler
(``messages.kinds_for``), so a kind added to the catalogue without a handler fails at start-up,
not when the first such frame arrives. A kind that the role may not send gets a typed error
reply. A ``timeout`` field is checked before any handler sees it (``wire/timeouts.py``: NaN or
negative is an ``invalid`` error, inf becomes None), whoever sent it. Handlers take ``(origin,
message, payload)``; a request handler returns its reply (or ``(reply, payload)``), whose
request id the dispatcher stamps. Synchronous handlers run inline (cheap notices such as
Progress); coroutine handlers run as owned tasks. A synchronous handler that must wait (for
memory, say) returns an awaitable, which then runs as such a task: what the handler did on
arrival keeps its order with the frames after it. Errors become ``Error`` replies: typed errors
as themselves, anything else as "internal" with a traceback in the log. A reply that cannot be
encoded is logged and answered ``protocol``, so its requester never waits for nothing. A
``Cancel`` from the connection a ``cancellable`` request (a wait) came on stops that request's
handler, with no reply: its sender gave up on it, and a shard must not hold waits for nobody.
Every frame from an origin that ``refuse`` names (a member we declared dead) is refused before
any of that: a request gets the error ``refuse`` returns, a one-way is dropped (docs/design.md
§5, "Declared dead, then running again"). Requests of the ``capped`` kinds (a client's waits)
handled at once are at most ``max_waiting`` per dispatcher (a client's is its connection's):
one more is answered CapacityError at once, with the limit in its data.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, cast

from hoplite_client.net.channel import error_reply
from hoplite_client.net.log_limit import limited
from hoplite_client.wire.errors import (
    CapacityError,
    HopliteError,
    LocalProtocolError,
    RemoteProtocolError,
)
from hoplite_client.wire.frames import Frame
from hoplite_client.wire.messages import Cancel, Reply, Role, WireMessage, kinds_for
from hoplite_client.wire.timeouts import check_timeout
from hoplited.tasks import Tasks

log = logging.getLogger("hoplited.dispatch")
_too_many_waits = limited(log, "too many waits")  # a client can ask again and again

Answer = Reply | tuple[Reply, Any] | None
Handler = Callable[[str, Any, memoryview | None], Answer | Awaitable[Answer]]
# Sends a reply with its payload under a request id (stamped as it is encoded, no copy made).
Respond = Callable[[Reply, Any, int], None]
# The waits one client connection may have handled at once (gets, reduced_inputs: each may
# wait for ever on an id nobody puts). A wait costs the daemon about 10 KB (its task, a fetch
# or waiter record), so a client holds 10 MiB at most this way; and it is far more than a
# client waits on together (Client.gather keeps 8 gets in flight).
MAX_CLIENT_WAITS = 1024


class Dispatcher:
    """The handler table of one role, and the code path every request of that role takes."""

    def __init__(self, role: Role, handlers: Mapping[type[WireMessage], Handler],
                 tasks: Tasks, errors: Counter[str] | None = None,
                 refuse: Callable[[str], HopliteError | None] = lambda origin: None,
                 lasting: Iterable[type[WireMessage]] = (),
                 capped: Iterable[type[WireMessage]] = (),
                 max_waiting: int = MAX_CLIENT_WAITS) -> None:
        self.role = role
        # kinds whose handling runs to its end when the sender goes (a put whose bytes are
        # all here: docs/design.md §2.2, "A put outlives its client")
        self._lasting = frozenset(lasting)
        self._tasks = tasks
        self._errors = errors  # error replies by type, for the metrics (hoplited/metrics.py)
        self._refuse = refuse  # the error an origin's frames are all refused with, if any
        self._table = {cls: h for cls, h in handlers.items() if role in cls.ROLES}
        check_complete(role, [*self._table, Cancel])
        self._async = {cls for cls, h in self._table.items() if inspect.iscoroutinefunction(h)}
        self._running: set[asyncio.Task[None]] = set()  # requests being handled
        # waits being handled, by the connection (its ``respond``) and request id they came with
        self._waits: dict[tuple[Respond, int], asyncio.Task[None]] = {}
        # kinds of which at most ``max_waiting`` are handled at once, and how many are now
        self._capped = frozenset(capped)
        self._max_waiting = max_waiting
        self.waiting = 0

    def deliver(self, origin: str, frame: Frame[Any], respond: Respond | None) -> None:
        """Handle one incoming frame; ``respond`` sends the reply (None: nobody listens)."""
        msg = frame.msg
        cls = type(msg)
        refused = self._refuse(origin)
        if refused is not None:
            self._answer_error(msg, refused, respond)
            return
        if cls is Cancel and self.role in cls.ROLES:
            if respond is not None:
                self._cancel(respond, msg.request)
            return
        handler = self._table.get(cls)
        if handler is None:
            error = RemoteProtocolError(f"{cls.__name__} is not accepted from a {self.role}")
            log.warning("%s: %s", origin, error)
            if respond is not None:
                rid = getattr(msg, "rid", 0)
                respond(error_reply(error, rid), None, rid)
            return
        try:
            msg = checked_timeout(msg)
        except HopliteError as exc:
            self._answer_error(msg, exc, respond)
            return
        if msg is not frame.msg:
            frame = Frame(msg, frame.payload)
        if cls in self._async:
            if cls in self._capped and self.waiting >= self._max_waiting:
                refusal = self._too_many(cls)
                _too_many_waits("%s: %s", origin, refusal)
                self._answer_error(msg, refusal, respond, logged=False)
                return
            self._start(msg, cast(Awaitable[Answer], handler(origin, msg, frame.payload)),
                        respond)
            return
        try:
            answer = handler(origin, msg, frame.payload)
        except Exception as exc:  # every failure becomes an Error reply, never a crash
            self._answer_error(msg, exc, respond)
            return
        if inspect.isawaitable(answer):  # it waits: the rest runs as a task
            self._start(msg, answer, respond)
            return
        self._answer(msg, answer, respond)

    def _start(self, msg: WireMessage, answer: Awaitable[Answer],
               respond: Respond | None) -> None:
        """Await a handler's answer in an owned task (cancellable if ``msg`` is a wait)."""
        task = self._tasks.spawn(self._run_async(msg, answer, respond),
                                 name=f"{self.role}-{type(msg).__name__}")
        if inspect.iscoroutine(answer):  # cancelled before it ran: closed, not left unawaited
            task.add_done_callback(lambda _: answer.close())
        if type(msg) not in self._lasting:
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        if type(msg) in self._capped:
            self.waiting += 1
            task.add_done_callback(self._waited)
        if type(msg).CANCELLABLE and respond is not None:
            key = (respond, cast(Any, msg).rid)
            self._waits[key] = task
            task.add_done_callback(lambda _: self._waits.pop(key, None))

    def _waited(self, task: asyncio.Task[None]) -> None:
        self.waiting -= 1

    def _too_many(self, cls: type[WireMessage]) -> CapacityError:
        """The error of a capped request over the limit, saying what to do instead."""
        kinds = " and ".join(sorted(c.__name__ for c in self._capped))
        return CapacityError(f"{cls.__name__} refused: this connection has {self.waiting} "
                             f"requests ({kinds}) waiting already, the most it may have; let "
                             f"some finish first (Client.gather bounds them), or use another "
                             f"connection", limit=self._max_waiting)

    def _cancel(self, respond: Respond, rid: int) -> None:
        """Stop the wait request ``rid`` from the connection that ``respond`` answers, if it
        is still being handled (a finished or unknown one is ignored: its reply crossed the
        Cancel, or the sender is confused, which costs nothing here)."""
        task = self._waits.pop((respond, rid), None)
        if task is not None:
            task.cancel()

    def close(self) -> None:
        """The sender is gone: cancel its requests still being handled, but for the lasting
        kinds. A get waiting for ever would otherwise wait for nobody, and pin what it finally
        got for nobody."""
        for task in list(self._running):
            task.cancel()

    async def _run_async(self, msg: WireMessage, answer: Awaitable[Answer],
                         respond: Respond | None) -> None:
        try:
            reply = await answer
        except Exception as exc:
            self._answer_error(msg, exc, respond)
            return
        self._answer(msg, reply, respond)

    async def call(self, origin: str, msg: WireMessage,
                   payload: memoryview | None) -> Frame[Any]:
        """Handle a request from this node itself: the same handler, typed errors raised."""
        handler = self._table.get(type(msg))
        if handler is None:
            raise RemoteProtocolError(f"{type(msg).__name__} is not accepted from a {self.role}")
        answer = handler(origin, checked_timeout(msg), payload)
        if inspect.isawaitable(answer):
            answer = await answer
        reply, out = _split(answer)
        if reply is None:
            raise RemoteProtocolError(f"{type(msg).__name__} has no reply")
        return Frame(reply, None if out is None else memoryview(out).cast("B"))

    def _answer(self, msg: WireMessage, answer: Answer, respond: Respond | None) -> None:
        reply, payload = _split(answer)
        if msg.SHAPE == "oneway" or respond is None:
            return
        if reply is None:  # a handler bug: the requester still gets an answer, never a hang
            self._answer_error(msg, RuntimeError(f"{type(msg).__name__} handler gave no reply"),
                               respond)
            return
        rid = cast(Any, msg).rid
        try:
            respond(reply, payload, rid)
        except LocalProtocolError as exc:  # e.g. a header over MAX_HEADER: a bug, said so
            log.error("%s reply to a %s could not be sent: %s", type(msg).__name__,
                      self.role, exc)
            respond(error_reply(exc, rid), None, rid)

    def _answer_error(self, msg: WireMessage, exc: Exception, respond: Respond | None,
                      logged: bool = True) -> None:
        """Answer ``exc`` and count it; ``logged``: log it too (else the caller did)."""
        name = type(msg).__name__
        if self._errors is not None:
            self._errors[type(exc).__name__ if isinstance(exc, HopliteError) else "internal"] += 1
        if logged and isinstance(exc, HopliteError):
            log.info("%s from a %s failed: %s", name, self.role, exc)
        elif logged:
            log.error("%s from a %s crashed", name, self.role, exc_info=exc)
        if msg.SHAPE == "request" and respond is not None:
            rid = cast(Any, msg).rid
            respond(error_reply(exc, rid), None, rid)


def checked_timeout(msg: WireMessage) -> WireMessage:
    """``msg`` with its ``timeout`` field (if it has one) as ``check_timeout`` means it: the
    same message when already so, a copy when inf became None; raises InvalidArgumentError."""
    if "timeout" not in type(msg).__dataclass_fields__:
        return msg
    record: Any = msg  # a dataclass with a ``timeout`` field (checked above)
    timeout = check_timeout(record.timeout)
    return msg if timeout == record.timeout else dataclasses.replace(record, timeout=timeout)


def check_complete(role: Role, handled: Iterable[type[WireMessage]]) -> None:
    """Refuse to start unless every kind ``role`` may send has a handler."""
    have = set(handled)
    missing = [cls.__name__ for cls in kinds_for(role) if cls not in have]
    if missing:
        raise RuntimeError(f"no handler for {role} messages: {', '.join(missing)}")


def _split(answer: Answer) -> tuple[Reply | None, Any]:
    if isinstance(answer, tuple):
        return answer[0], answer[1]
    return answer, None
