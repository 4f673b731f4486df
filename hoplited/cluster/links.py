"""Outbound control links to the other members, with heartbeats.

Each daemon dials every other member once (role "peer") and sends its requests on that link;
the member answers on the same link. A heartbeat (Ping) runs on every link, its decisions
taken by the pure core :mod:`hoplited.cluster.liveness` (this module only carries them out): a
peer silent for ``heartbeat_timeout`` seconds is declared dead, at the latest
``heartbeat_timeout + heartbeat_interval`` after its last sign of life (any reply), and at once
when its host refuses a reconnection (its process is gone); every request waiting on it fails.
Long before that verdict, a Ping unanswered for ``suspect_after`` seconds makes the member
*suspected* (``on_suspect(node, True)``) until its next sign of life (docs/design.md §5).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from hoplite_client.net.channel import Channel
from hoplite_client.net.handshake import Identity, dial, refused
from hoplite_client.wire.errors import ConnectionLostError, HopliteError, PeerUnavailableError
from hoplite_client.wire.frames import Frame
from hoplite_client.wire.messages import MemberInfo, Ping, Request, WireMessage
from hoplited.cluster import liveness as lv

log = logging.getLogger("hoplited.links")

R = TypeVar("R", bound=WireMessage)


class PeerLink:
    """Our requests to one member: connect lazily, reconnect on loss, watch its heartbeat."""

    def __init__(self, member: MemberInfo, me: Identity, interval: float, timeout: float,
                 on_dead: Callable[[str], object],
                 on_rtt: Callable[[float], None] = lambda rtt: None,
                 on_suspect: Callable[[str, bool], None] = lambda node, suspected: None,
                 suspect_after: float | None = None) -> None:
        self.member = member
        self.me = me
        self.interval = interval
        self.timeout = timeout
        self.on_dead = on_dead
        self.on_rtt = on_rtt
        self.on_suspect = on_suspect
        self.channel: Channel | None = None
        self.liveness = lv.Liveness(interval, timeout, time.monotonic(), suspect_after)
        self._lock = asyncio.Lock()
        self._heartbeat: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = asyncio.Event()  # the channel closed on its own: the heartbeat redials

    @property
    def node_id(self) -> str:
        return self.member.node_id

    def start(self) -> None:
        self._heartbeat = asyncio.create_task(self._beat(), name=f"heartbeat-{self.node_id}")
        self._heartbeat.add_done_callback(self._reap)

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
                if peer_id != self.node_id:
                    protocol.abort()
                    raise PeerUnavailableError(f"{self.member.host}:{self.member.port} is now "
                                               f"{peer_id}, not {self.node_id}", node=self.node_id)
                self.channel = Channel(protocol)
                protocol.closed.add_done_callback(lambda _: self._closed.set())
            return self.channel

    async def request(self, msg: Request[R], payload: Any = None,
                      timeout: float | None = None) -> Frame[R]:
        """Send a request to this member and wait for its reply (typed errors re-raised)."""
        channel = await self._ensure()
        frame = await channel.request(msg, payload, timeout)
        self._apply(self.liveness.handle(lv.Seen(time.monotonic())))
        return frame

    def notify(self, msg: WireMessage, payload: Any = None) -> None:
        """Send a one-way message, connecting first if needed; failures are only logged."""
        if self.channel is not None and self.channel.is_open:
            self.channel.notify(msg, payload)
            return
        task = asyncio.create_task(self._notify_later(msg, payload))
        self._tasks.add(task)
        task.add_done_callback(self._reap)

    async def _notify_later(self, msg: WireMessage, payload: Any) -> None:
        try:
            (await self._ensure()).notify(msg, payload)
        except HopliteError as exc:
            log.info("could not tell %s %s: %s", self.node_id, type(msg).__name__, exc)

    async def _beat(self) -> None:
        """Carry out the liveness core's instructions until it declares the member dead. A
        Ping runs as a task of its own, so the core's wake-ups (the suspicion time) and a
        closed connection are fed while it is out."""
        ping: asyncio.Task[lv.Event] | None = None
        wake: float | None = None
        todo = self.liveness.handle(lv.Tick(time.monotonic()))
        try:
            while True:
                self._apply(todo)
                for ins in todo:
                    if isinstance(ins, lv.DeclareDead):
                        return
                    if isinstance(ins, lv.SendPing):
                        ping = asyncio.ensure_future(self._ping(ins.timeout))
                        wake = None
                    elif isinstance(ins, lv.WaitUntil):
                        wake = ins.t
                if ping is None and wake is None:
                    wake = time.monotonic()  # nothing pending: ask the core again now
                closed = asyncio.ensure_future(self._closed.wait())
                waits: set[asyncio.Future[Any]] = {closed} if ping is None else {closed, ping}
                timeout = None if wake is None else max(0.0, wake - time.monotonic())
                done, _ = await asyncio.wait(waits, timeout=timeout,
                                             return_when=asyncio.FIRST_COMPLETED)
                closed.cancel()
                if ping is not None and ping in done:
                    event, ping = ping.result(), None
                    todo = self.liveness.handle(event)
                elif self._closed.is_set():
                    self._closed.clear()
                    todo = self.liveness.handle(lv.Closed(time.monotonic()))
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
        except (TimeoutError, HopliteError, OSError):
            return lv.Failed(time.monotonic(), "timeout")
        now = time.monotonic()
        return lv.Answered(now, now - sent)

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
                 suspect_after: float | None = None) -> None:
        self._me = me
        self._interval = interval
        self._timeout = timeout
        self._on_dead = on_dead
        self._on_rtt = on_rtt
        self._on_suspect = on_suspect
        self._suspect_after = suspect_after
        self._links: dict[str, PeerLink] = {}

    def get(self, node: str) -> PeerLink | None:
        return self._links.get(node)

    def others(self) -> list[PeerLink]:
        return list(self._links.values())

    def open(self, member: MemberInfo, keep_existing: bool) -> None:
        """Start a link to ``member``; an existing one is kept if ``keep_existing`` (the member
        is alive and known), else replaced (it came back under the same id)."""
        old = self._links.pop(member.node_id, None)
        if old is not None and keep_existing:
            self._links[member.node_id] = old
            return
        if old is not None:
            old.close()
        link = PeerLink(member, self._me, self._interval, self._timeout, self._on_dead,
                        self._on_rtt, self._on_suspect, self._suspect_after)
        self._links[member.node_id] = link
        link.start()

    def refused(self, node: str) -> None:
        """Some dial of ours to ``node`` was refused: its link decides (dead at once)."""
        link = self._links.get(node)
        if link is not None:
            link.refused()

    def close_all(self) -> None:
        for link in self._links.values():
            link.close()
