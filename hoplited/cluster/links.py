"""Outbound control links to the other members, with heartbeats.

Each daemon dials every other member once (role "peer") and sends its requests on that link;
the member answers on the same link. A heartbeat (Ping) runs on every link, its decisions
taken by the pure core :mod:`hoplited.cluster.liveness` (this module only carries them out): a
peer silent for ``heartbeat_timeout`` seconds is declared dead, at the latest
``heartbeat_timeout + heartbeat_interval`` after its last sign of life (any reply), and at once
when its host refuses a reconnection (its process is gone); every request waiting on it fails.
Long before that verdict, a Ping unanswered for ``suspect_after`` seconds makes the member
*suspected* (``on_suspect(node, True)``) until its next sign of life (docs/design.md §5).

Above ``watchers + 1`` members a link pings only the members this node watches
(:mod:`.watching`); the others are asked when their connection closes or a watcher's alarm
arrives (``alarm``), and a watched member's suspicion or death is passed on (``on_warn``) to
the members that do not watch it (docs/design.md §5, "Watchers").

Before a member silent to us is declared dead for its silence, a few others are asked to
ping it for us (``PingFor``, :func:`.watching.vouchers`): if one reaches it, only our own way
to it is broken, and it stays a member, suspected (docs/design.md §5, "A link broken between
two members").

A member that answers with ``DeclaredDeadError`` has declared *us* dead (we were frozen past
its timeout): ``on_fenced`` hears of it, and the daemon runs again as a new member. An address
that answers under another node id is a member whose process is gone, as a refused dial is
(docs/design.md §5, "Declared dead, then running again").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from hoplite_client.net.channel import Channel
from hoplite_client.net.handshake import Identity, dial, refused
from hoplite_client.wire.errors import (
    ConnectionLostError,
    DeclaredDeadError,
    HopliteError,
    HopliteTimeoutError,
    PeerUnavailableError,
)
from hoplite_client.wire.frames import Frame
from hoplite_client.wire.messages import MemberInfo, Ping, PingFor, Request, WireMessage
from hoplited.cluster import liveness as lv
from hoplited.cluster.partitions import parse_alive
from hoplited.cluster.watching import vouchers, watched_by

log = logging.getLogger("hoplited.links")

R = TypeVar("R", bound=WireMessage)

# A helper's own Ping gets this share of the time we give it to answer: the rest carries its
# request and answer.
RELAY_SHARE = 0.75


def refusers_alive(refusal: DeclaredDeadError) -> list[str]:
    """The live set a member that declared us dead sent with its refusal."""
    return parse_alive(str(refusal.data.get("alive", "")))


class PeerLink:
    """Our requests to one member: connect lazily, reconnect on loss, watch its heartbeat."""

    def __init__(self, member: MemberInfo, me: Identity, interval: float, timeout: float,
                 on_dead: Callable[[str], object],
                 on_rtt: Callable[[float], None] = lambda rtt: None,
                 on_suspect: Callable[[str, bool], None] = lambda node, suspected: None,
                 suspect_after: float | None = None, watched: bool = True,
                 on_warn: Callable[[str, bool], None] = lambda node, dead: None,
                 on_fenced: Callable[[str, list[str]], None] = lambda node, alive: None,
                 ask_others: Callable[[str, float, int], Awaitable[bool]] | None = None
                 ) -> None:
        self.member = member
        self.me = me
        self.interval = interval
        self.timeout = timeout
        self.on_dead = on_dead
        self.on_rtt = on_rtt
        self.on_suspect = on_suspect
        self.on_warn = on_warn
        # the member answered that it declared us dead; with its live set
        self.on_fenced = on_fenced
        # others ping it for us before a verdict: (node, answer within, turn) -> reached?
        self.ask_others = ask_others
        self.channel: Channel | None = None
        indirect = None if ask_others is None else (suspect_after or interval)
        self.liveness = lv.Liveness(interval, timeout, time.monotonic(), suspect_after, watched,
                                    indirect)
        self._asks = 0  # how many times others were asked: each turn asks other members
        self._reaching: asyncio.Task[bool] | None = None  # our Ping for the members asking
        self.watched = watched  # as last asked (the core hears of it when the heartbeat runs)
        self._lock = asyncio.Lock()
        self._heartbeat: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        # events from outside the heartbeat (the channel closed on its own, a watcher's
        # alarm, a change of watch), fed to the core in order by the heartbeat
        self._inbox: deque[lv.Event] = deque()
        self._poked = asyncio.Event()

    @property
    def node_id(self) -> str:
        return self.member.node_id

    def start(self) -> None:
        """Start the heartbeat, and dial the member now rather than at our first request to
        it (docs/design.md §5, "Links dialled at a join")."""
        self._heartbeat = asyncio.create_task(self._beat(), name=f"heartbeat-{self.node_id}")
        self._heartbeat.add_done_callback(self._reap)
        task = asyncio.create_task(self._dial_now(), name=f"dial-{self.node_id}")
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    @property
    def connected(self) -> bool:
        """Whether a connection to the member is open now."""
        return self.channel is not None and self.channel.is_open

    async def _dial_now(self) -> None:
        """Open the connection in the background; if that fails, the next request or Ping
        dials, as it would have without this (a refusal already counted in ``_ensure``)."""
        try:
            async with asyncio.timeout(self.timeout):
                await self._ensure()
        except (TimeoutError, HopliteError, OSError) as exc:
            log.info("no control link to %s yet: %s", self.node_id, exc)

    async def _ensure(self) -> Channel:
        if self.liveness.dead:
            raise PeerUnavailableError(f"member {self.node_id} is dead", node=self.node_id)
        async with self._lock:
            if self.channel is None or not self.channel.is_open:
                try:
                    protocol, peer_id = await dial(self.member.host, self.member.port, "peer",
                                                   self.me, timeout=self.timeout)
                except ConnectionLostError as exc:
                    if refused(exc):  # its process is gone
                        self.refused()
                    raise
                if peer_id != self.node_id:  # its process is gone, another took its port
                    protocol.abort()
                    self.refused()
                    raise PeerUnavailableError(f"{self.member.host}:{self.member.port} is now "
                                               f"{peer_id}, not {self.node_id}", node=self.node_id)
                self.channel = Channel(protocol)
                protocol.closed.add_done_callback(lambda _: self._feed(lv.Closed))
            return self.channel

    async def request(self, msg: Request[R], payload: Any = None,
                      timeout: float | None = None) -> Frame[R]:
        """Send a request to this member and wait for its reply (typed errors re-raised).
        ``timeout`` bounds the whole of it, the dial included: a member we do not watch may
        have no connection yet, and a frozen one accepts the dial but never the handshake."""
        if timeout is None or self.connected:
            channel = await self._ensure()
        else:
            started = time.monotonic()
            try:
                async with asyncio.timeout(timeout):
                    channel = await self._ensure()
            except TimeoutError:
                raise HopliteTimeoutError(f"{self.node_id}: no connection within "
                                          f"{timeout}s") from None
            timeout = max(0.0, timeout - (time.monotonic() - started))
        try:
            frame = await channel.request(msg, payload, timeout)
        except DeclaredDeadError as exc:
            self.on_fenced(self.node_id, refusers_alive(exc))
            raise
        self._apply(self.liveness.handle(lv.Seen(time.monotonic())))
        return frame

    def notify(self, msg: WireMessage, payload: Any = None) -> None:
        """Send a one-way message, connecting first if needed; failures are only logged. A
        connection that is closing (its peer just died) refuses the frame before the channel
        hears that it is lost: that too is only logged, never raised into the sender's work
        (a gather's fetch, say: see ``test_a_notice_on_a_closing_connection_is_not_raised``
        in tests/unit/test_link_notify.py)."""
        if self.channel is not None and self.channel.is_open:
            try:
                self.channel.notify(msg, payload)
            except ConnectionLostError as exc:
                log.info("could not tell %s %s: %s", self.node_id, type(msg).__name__, exc)
            return
        task = asyncio.create_task(self._notify_later(msg, payload))
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    async def _notify_later(self, msg: WireMessage, payload: Any) -> None:
        try:
            (await self._ensure()).notify(msg, payload)
        except HopliteError as exc:
            log.info("could not tell %s %s: %s", self.node_id, type(msg).__name__, exc)

    def alarm(self, dead: bool) -> None:
        """A member that watches this one found it silent (``dead``: declared it dead)."""
        self._feed(lambda now: lv.Alarm(now, dead))

    def watch(self, watched: bool) -> None:
        """This member entered or left our watch set."""
        if watched != self.watched:
            self.watched = watched
            self._feed(lambda now: lv.Watch(now, watched))

    def _feed(self, event: Callable[[float], lv.Event]) -> None:
        """Queue an event for the heartbeat, stamped now."""
        self._inbox.append(event(time.monotonic()))
        self._poked.set()

    async def _beat(self) -> None:
        """Carry out the liveness core's instructions until it declares the member dead. A
        Ping runs as a task of its own, so the core's wake-ups (the suspicion time) and the
        events from outside (``_feed``) are fed while it is out."""
        ping: asyncio.Task[lv.Event] | None = None
        wake: float | None = None
        idle = False
        todo = self.liveness.handle(lv.Tick(time.monotonic()))
        try:
            while True:
                self._apply(todo)
                for ins in todo:
                    if isinstance(ins, lv.DeclareDead):
                        return
                    if isinstance(ins, lv.SendPing):
                        ping = asyncio.ensure_future(self._ping(ins.timeout))
                        wake, idle = None, False
                    elif isinstance(ins, lv.WaitUntil):
                        wake, idle = ins.t, False
                    elif isinstance(ins, lv.Idle):
                        wake, idle = None, True
                if ping is None and wake is None and not idle:
                    wake = time.monotonic()  # nothing pending: ask the core again now
                poked = asyncio.ensure_future(self._poked.wait())
                waits: set[asyncio.Future[Any]] = {poked} if ping is None else {poked, ping}
                timeout = None if wake is None else max(0.0, wake - time.monotonic())
                done, _ = await asyncio.wait(waits, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                poked.cancel()
                if ping is not None and ping in done:
                    event, ping = ping.result(), None
                    todo = self.liveness.handle(event)
                elif self._inbox:
                    event = self._inbox.popleft()
                    if not self._inbox:
                        self._poked.clear()
                    todo = self.liveness.handle(event)
                else:
                    wake = None
                    todo = self.liveness.handle(lv.Tick(time.monotonic()))
        finally:
            if ping is not None:
                ping.cancel()

    async def _ping(self, budget: float) -> lv.Event:
        """One heartbeat, reconnecting first if needed, all of it bounded by ``budget``."""
        try:
            async with asyncio.timeout(budget):
                channel = await self._ensure()
                sent = time.monotonic()
                await channel.request(Ping())
        except ConnectionLostError as exc:
            return lv.Failed(time.monotonic(), "refused" if refused(exc) else "lost")
        except DeclaredDeadError as exc:  # it answers, but has declared us dead
            self.on_fenced(self.node_id, refusers_alive(exc))
            return lv.Failed(time.monotonic(), "timeout")
        except (TimeoutError, HopliteError, OSError):
            return lv.Failed(time.monotonic(), "timeout")
        now = time.monotonic()
        return lv.Answered(now, now - sent)

    async def reach(self, timeout: float) -> bool:
        """Whether the member answers a Ping within ``timeout`` (for a member that cannot
        reach it). Members asking at once share one Ping: asks in a loop cost one Ping out
        at a time, not one each."""
        if self._reaching is None or self._reaching.done():
            self._reaching = asyncio.ensure_future(self._reach(timeout))
            self._tasks.add(self._reaching)
            self._reaching.add_done_callback(self._reap)
        reaching = self._reaching
        await asyncio.wait({reaching}, timeout=timeout)
        return reaching.done() and not reaching.cancelled() and reaching.result()

    async def _reach(self, timeout: float) -> bool:
        try:
            await self.request(Ping(), timeout=timeout)
        except (TimeoutError, HopliteError, OSError):
            return False
        return True

    async def _ask(self, budget: float) -> None:
        """Others ping the member for us; one that reached it vouches for it."""
        if self.ask_others is None:
            return
        self._asks += 1
        if await self.ask_others(self.node_id, budget, self._asks - 1):
            self._feed(lv.Vouched)

    def condemn(self, reason: str) -> None:
        """Declare the member dead now, for ``reason`` (it refuses us, and its side lost)."""
        self._apply(self.liveness.handle(lv.Verdict(time.monotonic(), reason)))

    def refused(self) -> None:
        """A connection to the member was refused (by this link or any other dial of ours,
        e.g. a data pull): nothing listens on its port any more."""
        self._apply(self.liveness.handle(lv.Failed(time.monotonic(), "refused")))

    def _apply(self, instructions: list[lv.Instruction]) -> None:
        """Carry out the instructions that need no waiting: RTT reports and a death."""
        for ins in instructions:
            if isinstance(ins, lv.ReportRtt):
                self.on_rtt(ins.rtt)
            elif isinstance(ins, lv.Suspect):
                log.warning("member %s is silent: %s", self.node_id, ins.reason)
                self.on_suspect(self.node_id, True)
            elif isinstance(ins, lv.Trust):
                self.on_suspect(self.node_id, False)
            elif isinstance(ins, lv.Warn):
                self.on_warn(self.node_id, ins.dead)
            elif isinstance(ins, lv.AskOthers):
                task = asyncio.create_task(self._ask(ins.timeout), name=f"ask-{self.node_id}")
                self._tasks.add(task)
                task.add_done_callback(self._reap)
            elif isinstance(ins, lv.DeclareDead):
                log.warning("member %s is dead: %s", self.node_id, ins.reason)
                self.close()
                self.on_dead(self.node_id)

    def _reap(self, task: asyncio.Task[Any]) -> None:
        """A task of ours ended: forget it, and log an unexpected error (a callback's)."""
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("link to %s: %s failed", self.node_id, task.get_name(), exc_info=exc)

    def close(self) -> None:
        """Stop the heartbeat and drop the connection (pending requests fail)."""
        if self._heartbeat is not None and self._heartbeat is not asyncio.current_task():
            self._heartbeat.cancel()
        for task in self._tasks:
            task.cancel()
        if self.channel is not None:
            self.channel.protocol.abort()


class Links:
    """Our control link to every other member, by node id."""

    def __init__(self, me: Identity, interval: float, timeout: float,
                 on_dead: Callable[[str], object], on_rtt: Callable[[float], None],
                 on_suspect: Callable[[str, bool], None] = lambda node, suspected: None,
                 suspect_after: float | None = None, watchers: int = 16,
                 on_warn: Callable[[str, bool], None] = lambda node, dead: None,
                 on_fenced: Callable[[str, list[str]], None] = lambda node, alive: None
                 ) -> None:
        self._me = me
        self._interval = interval
        self._timeout = timeout
        self._on_dead = on_dead
        self._on_rtt = on_rtt
        self._on_suspect = on_suspect
        self._suspect_after = suspect_after
        self.watchers = watchers
        self._on_warn = on_warn
        self._on_fenced = on_fenced
        self._links: dict[str, PeerLink] = {}

    @property
    def timeout(self) -> float:
        """The heartbeat timeout: the longest any one Ping of ours may take."""
        return self._timeout

    def get(self, node: str) -> PeerLink | None:
        return self._links.get(node)

    def others(self) -> list[PeerLink]:
        return list(self._links.values())

    def open(self, member: MemberInfo) -> None:
        """Start a link to ``member``, unless we have one (a member declared dead gets no
        other: it comes back under a new id)."""
        if member.node_id in self._links:
            return
        # unwatched until ``rewatch`` places it: the membership it joins is not ours yet
        link = PeerLink(member, self._me, self._interval, self._timeout, self._on_dead,
                        self._on_rtt, self._on_suspect, self._suspect_after, watched=False,
                        on_warn=self._on_warn, on_fenced=self._on_fenced,
                        ask_others=self.ask_others)
        self._links[member.node_id] = link
        link.start()

    def connected(self) -> int:
        """How many members we have a connection open to (``hoplite status``, tests)."""
        return sum(link.connected for link in self._links.values())

    def watching(self) -> int:
        """How many members we ping every interval."""
        return sum(link.watched for link in self._links.values() if not link.liveness.dead)

    def rewatch(self, alive: Iterable[str]) -> None:
        """The live membership changed: ping every interval exactly the members we watch."""
        watched = watched_by(self._me.node_id, alive, self.watchers)
        for node, link in self._links.items():
            if not link.liveness.dead:
                link.watch(node in watched)

    def alarm(self, node: str, dead: bool) -> None:
        """A watcher of ``node`` found it silent: ask it ourselves."""
        link = self._links.get(node)
        if link is not None:
            link.alarm(dead)

    def trusted(self) -> list[str]:
        """The members alive and not suspected, in our view."""
        return [node for node, link in self._links.items()
                if not link.liveness.dead and not link.liveness.suspected]

    async def ask_others(self, node: str, budget: float, turn: int) -> bool:
        """Ask a few trusted members to ping ``node`` for us (``turn``: which few), each to
        answer within ``budget``: whether one of them reached it."""
        asks = [asyncio.ensure_future(self._ask_one(helper, node, budget))
                for helper in vouchers(node, self.trusted(), turn=turn)]
        try:
            for answer in asyncio.as_completed(asks):
                if await answer:
                    return True
            return False
        finally:
            for ask in asks:
                ask.cancel()

    async def _ask_one(self, helper: str, node: str, budget: float) -> bool:
        link = self._links.get(helper)
        if link is None:
            return False
        try:
            frame = await link.request(PingFor(node=node, timeout=budget * RELAY_SHARE),
                                       timeout=budget)
        except (TimeoutError, HopliteError, OSError):
            return False
        if frame.msg.reached:
            log.info("member %s reached %s for us: our own way to it is broken", helper, node)
        return frame.msg.reached

    def refused(self, node: str) -> None:
        """Some dial of ours to ``node`` was refused: its link decides (dead at once)."""
        link = self._links.get(node)
        if link is not None:
            link.refused()

    def close_all(self) -> None:
        for link in self._links.values():
            link.close()
