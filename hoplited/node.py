"""The daemon: wires the arena, store, directory shard, membership, peers and services.

One asyncio loop runs everything. TCP connections are authenticated first, then serve either
control requests (``peer``/``tool`` role) or object streams (``data`` role); the Unix socket
serves local clients. Requests about an object go to its owner shard: to ourselves by a
direct call, to another member over our link to it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import sys
from collections import Counter
from typing import Any, Callable, Optional

from hoplite_client.net.channel import Channel, remote_error
from hoplite_client.net.endpoints import host_id
from hoplite_client.net.handshake import HANDSHAKE_TIMEOUT, Identity, accept, dial
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    NotOwnerError,
    PeerUnavailableError,
)
from hoplite_client.wire.frames import INLINE_MAX, Frame
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    REPLY_KINDS,
    Announce,
    DeleteEntry,
    Holding,
    Join,
    MemberInfo,
    MemberUp,
    Publish,
)
from hoplited.clients.service import ClientService
from hoplited.cluster.link_model import LinkModel
from hoplited.cluster.links import PeerLink
from hoplited.cluster.membership import Membership, rendezvous_owner
from hoplited.collectives.reduce import ReduceCoordinator, ReduceWorker
from hoplited.config import DaemonConfig
from hoplited.control import TOOL_REQUESTS, ControlService
from hoplited.directory.shard import DirectoryShard
from hoplited.memory.arena import Arena
from hoplited.memory.store import ObjectStore
from hoplited.transfer.fetcher import Transfers

log = logging.getLogger("hoplited")

RETRY_PAUSE_MAX = 0.5  # between attempts to reach an object's owner while membership moves


class Daemon:
    """One host's object store and directory shard."""

    def __init__(self, config: DaemonConfig) -> None:
        config.check()
        self.config = config
        self.node_id = secrets.token_hex(6)
        self.identity = Identity(self.node_id, config.token)
        self.arena = Arena(config.capacity, name=f"hoplite-{self.node_id}")
        self.store = ObjectStore(self.arena)
        self.transfers = Transfers(self)
        self.control = ControlService(self)
        self.clients = ClientService(self)
        self.links: dict[str, PeerLink] = {}
        self.counters: Counter[str] = Counter()
        self.links_model = LinkModel()
        self.reducer = ReduceWorker(self)
        self.reduces: dict[ObjectID, ReduceCoordinator] = {}
        self.membership: Membership
        self.shard: DirectoryShard
        self._server: Optional[asyncio.AbstractServer] = None
        self._inbound: set[FrameProtocol] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopped = asyncio.Event()

    # --- lifecycle ---
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        self._server = await loop.create_server(
            lambda: FrameProtocol(name="inbound", on_made=self._on_inbound), cfg.host, cfg.port)
        port = self._server.sockets[0].getsockname()[1]
        me = MemberInfo(node_id=self.node_id, host=cfg.advertise_host or cfg.host, port=port,
                        socket=os.path.abspath(cfg.socket_path), host_id=host_id())
        self.membership = Membership(me)
        self.membership.listeners.append(self._on_membership_change)
        self.shard = DirectoryShard(cfg.fanout, self.membership.is_alive, self.membership.owner,
                                    self.node_id)
        await self.clients.start(cfg.socket_path)
        if cfg.join:
            await self._join()
        log.info("node %s serving on %s:%d and %s (capacity %d bytes)", self.node_id, cfg.host,
                 port, cfg.socket_path, self.arena.capacity)

    async def _join(self) -> None:
        errors = []
        for host, port in self.config.join:
            try:
                protocol, _ = await dial(host, port, "peer", self.identity)
                channel = Channel(protocol, REPLY_KINDS)
                frame = await channel.request(lambda rid: Join(rid=rid, member=self.membership.me),
                                              timeout=HANDSHAKE_TIMEOUT)
                protocol.close()
            except HopliteError as exc:
                errors.append(f"{host}:{port}: {exc}")
                continue
            for member in frame.msg.members:
                self.add_member(member, announce=False)
            return
        raise ConnectionLostError("could not join the cluster: " + "; ".join(errors))

    def ready_line(self) -> str:
        me = self.membership.me
        return json.dumps({"event": "ready", "node_id": self.node_id, "pid": os.getpid(),
                           "listen": f"{me.host}:{me.port}", "socket": me.socket})

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    def request_stop(self) -> None:
        self._stopped.set()

    async def stop(self) -> None:
        """Close every server, link and connection; free the arena."""
        if self._server is not None:
            self._server.close()
        await self.clients.stop()
        for link in self.links.values():
            link.close()
        for protocol in list(self._inbound):
            protocol.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.sleep(0)
        log.info("node %s stopped", self.node_id)

    def spawn(self, coro: Any, name: Optional[str] = None) -> asyncio.Task[Any]:
        """Run a background task, kept referenced until it ends; its failure is logged."""
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            if isinstance(exc, HopliteError):
                log.info("task %s ended: %s", task.get_name(), exc)
            else:
                log.error("task %s crashed", task.get_name(), exc_info=exc)

    # --- inbound TCP ---
    def _on_inbound(self, protocol: FrameProtocol) -> None:
        self._inbound.add(protocol)
        protocol.on_lost.append(lambda _: self._inbound.discard(protocol))
        self.spawn(self._serve_inbound(protocol), name="inbound")

    async def _serve_inbound(self, protocol: FrameProtocol) -> None:
        try:
            role, peer = await accept(protocol, self.identity)
        except HopliteError:
            return
        if role == "data":
            await self.transfers.serve(protocol)
            return
        Channel(protocol, REPLY_KINDS,
                on_request=lambda frame: self.spawn(self._answer(protocol, peer, role, frame),
                                                    name=type(frame.msg).__name__))

    async def _answer(self, protocol: FrameProtocol, peer: str, role: str, frame: Frame) -> None:
        rid = getattr(frame.msg, "rid", None)
        try:
            if role == "tool" and not isinstance(frame.msg, TOOL_REQUESTS):
                raise PeerUnavailableError(f"{type(frame.msg).__name__} is for members only")
            reply, payload = await self.control.handle(peer, frame.msg, frame.payload)
        except HopliteError as exc:
            if rid is not None and not protocol.closed.done():
                protocol.send(remote_error(rid, exc))
            return
        except Exception as exc:
            log.exception("control request %s failed", type(frame.msg).__name__)
            if rid is not None and not protocol.closed.done():
                protocol.send(remote_error(rid, exc))
            return
        if reply is not None and not protocol.closed.done():
            protocol.send(reply, payload)

    # --- membership ---
    def add_member(self, member: MemberInfo, announce: bool) -> None:
        """Learn of a member; ``announce`` tells the others (when it joined through us)."""
        if member.node_id == self.node_id:
            return
        if announce:
            for link in self.links.values():
                link.notify(MemberUp(rid=0, member=member))
        old = self.links.pop(member.node_id, None)
        if old is not None and self.membership.is_alive(member.node_id):
            self.links[member.node_id] = old
            return
        if old is not None:
            old.close()
        link = PeerLink(member, self.identity, self.config.heartbeat_interval,
                        self.config.heartbeat_timeout, self._on_dead,
                        self.links_model.observe_rtt)
        self.links[member.node_id] = link
        self.membership.add(member)
        link.start()

    def _on_dead(self, node_id: str) -> None:
        self.membership.mark_dead(node_id)

    def _on_membership_change(self, previous: list[str]) -> None:
        alive = set(self.membership.alive_ids())
        for node in set(previous) - alive:
            self.shard.forget_node(node)
        moved = self.shard.membership_changed()
        if moved:
            log.info("%d directory entries moved to other shards", moved)
        self._reannounce(previous)

    def _reannounce(self, previous: list[str]) -> None:
        """Tell each object's new owner shard what we hold (the directory is soft state)."""
        batches: dict[str, list[Holding]] = {}
        for obj in self.store.objects.values():
            if obj.error is not None or obj.temporary:
                continue
            owner = self.membership.owner(obj.oid)
            if previous and rendezvous_owner(obj.oid, previous) == owner:
                continue
            if obj.size <= INLINE_MAX:
                if obj.complete:
                    self.spawn(self.publish(obj.oid), name="republish")
                continue
            batches.setdefault(owner, []).append(Holding(
                oid=obj.oid, size=obj.size, dtype=obj.dtype, shape=obj.shape,
                version=obj.version, received=obj.received))
        for owner, holdings in batches.items():
            if owner == self.node_id:
                for h in holdings:
                    self.shard.publish(h.oid, self.node_id, h.size, h.dtype, h.shape, h.version,
                                       None, received=h.received)
            else:
                self.tell(owner, Announce(rid=0, holdings=holdings))

    # --- talking to owner shards ---
    async def call_owner(self, oid: ObjectID, make: Callable[[int], Any], payload: Any = None,
                         timeout: Optional[float] = None) -> Frame:
        """Send a request about ``oid`` to its owner shard (ourselves included), following
        ownership changes."""
        loop = asyncio.get_running_loop()
        # Long enough for a dead owner to be detected and ownership to move.
        give_up = loop.time() + self.config.heartbeat_timeout + 2 * self.config.heartbeat_interval
        attempt = 0
        while True:
            owner = self.membership.owner(oid)
            try:
                return await self.call_node(owner, make, payload, timeout)
            except (NotOwnerError, PeerUnavailableError, ConnectionLostError) as exc:
                if loop.time() >= give_up:
                    raise
                log.info("owner %s of %s unreachable (%s); retrying", owner, oid.short(), exc)
                await asyncio.sleep(min(RETRY_PAUSE_MAX, 0.02 * 2 ** attempt))
                attempt += 1

    async def call_node(self, node: str, make: Callable[[int], Any], payload: Any = None,
                        timeout: Optional[float] = None) -> Frame:
        """Send a control request to ``node`` (ourselves: a direct call) and await its reply."""
        if node == self.node_id:
            reply, out = await self.control.handle(self.node_id, make(0), payload)
            return Frame(reply, out)
        link = self.links.get(node)
        if link is None:
            raise PeerUnavailableError(f"{node} is not a member", node=node)
        return await link.request(make, payload, timeout)

    def notify_owner(self, oid: ObjectID, msg: Any) -> None:
        """One-way message to the owner shard of ``oid``."""
        self.tell(self.membership.owner(oid), msg)

    def tell(self, node: str, msg: Any, payload: Any = None) -> None:
        """One-way message to ``node`` (ourselves: handled right away)."""
        if node == self.node_id:
            self.spawn(self.control.handle(self.node_id, msg, payload), name=type(msg).__name__)
        elif node in self.links:
            self.links[node].notify(msg, payload)

    async def publish(self, oid: ObjectID) -> None:
        """Register a complete local object with its owner shard (small ones with their bytes)."""
        obj = self.store.get(oid)
        if obj is None:
            return
        inline = obj.buffer if obj.size <= INLINE_MAX else None
        await self.call_owner(oid, lambda rid: Publish(
            rid=rid, oid=oid, size=obj.size, dtype=obj.dtype, shape=obj.shape,
            version=obj.version), inline)

    async def delete(self, oid: ObjectID) -> None:
        """Remove every copy in the cluster and the directory entry."""
        local = self.store.get(oid) is not None
        try:
            await self.call_owner(oid, lambda rid: DeleteEntry(rid=rid, oid=oid))
        except HopliteError:
            if not local:
                raise
        self.drop_local(oid)
        self.reduces.pop(oid, None)

    def drop_local(self, oid: ObjectID) -> None:
        if self.store.remove(oid) is not None:
            log.debug("dropped %s", oid.short())

    def local_stats(self) -> dict[str, Any]:
        me = self.membership.me
        return {
            "node_id": self.node_id,
            "address": f"{me.host}:{me.port}",
            "socket": me.socket,
            "host_id": me.host_id,
            "pid": os.getpid(),
            "members": [{"node_id": m.node_id, "address": f"{m.host}:{m.port}",
                         "socket": m.socket, "host_id": m.host_id,
                         "alive": self.membership.is_alive(m.node_id)}
                        for m in self.membership.members.values()],
            "store": self.store.stats(),
            "directory": self.shard.stats(),
            "bytes_in": self.counters["bytes_in"],
            "bytes_out": self.counters["bytes_out"],
            "clients": self.clients.count(),
            "links": self.links_model.as_dict(),
            "reduce_tasks": len(self.reducer.tasks),
        }


def log_to_stderr(level: str) -> None:
    logging.basicConfig(stream=sys.stderr, level=level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
