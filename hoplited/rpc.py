"""Talking to other members: requests to a node or to an object's owner shard, one-ways, and
the accepting side of every TCP connection.

Outbound (:class:`Rpc`): a request to this node itself takes the same handler path as one
from a peer (the peer :class:`~hoplited.dispatch.Dispatcher`, called directly); to another
member it goes over our control link to it. ``call_owner`` follows ownership while membership
moves: a shard that is not (or no longer) the owner, or a dead one, is retried at the new owner
for as long as it takes to detect a death and move ownership, and a request pending at an
owner that falls under suspicion is sent again to the member standing in for it. A stand-in
that answers "not the owner", naming a member only we suspect, does so because our views
differ through our own suspicion, which may last as long as a broken link to that member: the
request is asked again, as within the window, for as long as we suspect that member (until it
is trusted again, or dead), bounded only by its caller's timeout (docs/design.md §5, "A link
broken between two members").

Inbound (:meth:`Rpc.listen`): every TCP connection starts with the authenticated handshake
(inside TLS when the node has certificates: docs/security.md);
its role then decides what it carries: control requests from a member (``peer``) or a tool
(``tool``), each through its own dispatcher, or object streams (``data``), served by the
data-plane sender. At most ``MAX_HANDSHAKES`` connections are in their handshake at once, and
none takes one of the last ``FD_RESERVE`` descriptors: others are closed as they are accepted.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from hoplite_client.net.channel import Channel
from hoplite_client.net.handshake import Identity, accept, open_accepted
from hoplite_client.net.log_limit import limited
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    NotOwnerError,
    ObjectDeletedError,
    PeerUnavailableError,
)
from hoplite_client.wire.frames import Frame
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import Request, WireMessage
from hoplited.cluster.links import Links
from hoplited.cluster.membership import Membership
from hoplited.dispatch import Dispatcher
from hoplited.tasks import Tasks

log = logging.getLogger("hoplited.rpc")
# Anyone who can reach the port can have connections closed at once, as often as it likes.
_turned_away = limited(log, "connection turned away")
_accept_failed = limited(log, "accept failed")

R = TypeVar("R", bound=WireMessage)

RETRY_PAUSE_MAX = 0.5  # between attempts to reach an object's owner while membership moves
# After a failed accept (out of file descriptors, say): asyncio's own servers wait 1 s too.
ACCEPT_RETRY = 1.0
# TCP connections in their handshake at once; one more is closed as soon as it is accepted.
# A member joining dials the seed once, then every member one control link and one standing
# data connection (cluster/links.py, transfer/data_connections.py): a burst of a large
# cluster's joins fills the listen backlog (node.py's LISTEN_BACKLOG, 512), which is accepted
# within milliseconds and is all in its handshake together; twice that lets the next wave in
# while the first finishes. A dialer closed at once retries as after any failed dial (the
# next request or heartbeat, the next pull). At the cap, strangers hold at most a handshake's
# header (HANDSHAKE_MAX_HEADER) and a read-ahead scratch each: about 16 MiB in all.
MAX_HANDSHAKES = 1024
# Descriptors kept for the rest of the daemon: local clients (one each), the connections it
# dials, its files. An accepted TCP connection given one of the last FD_RESERVE (the kernel
# hands out the lowest free number, so a number that high means at most FD_RESERVE remain
# free) is closed at once, so that strangers holding TCP connections cannot starve the Unix
# socket's accept.
FD_RESERVE = 64
_UNREACHABLE = (PeerUnavailableError, ConnectionLostError)


def owner_moved(exc: HopliteError) -> bool:
    """True when a request to an owner should go to the (new) owner: the shard said it is
    not the owner, or reaching it failed here. An error the owner *answered* with is the
    request's outcome, even when its type is one of these (a failed reduce's record is)."""
    return isinstance(exc, NotOwnerError) or (isinstance(exc, _UNREACHABLE)
                                              and not exc.reported)


def named_owner(exc: HopliteError) -> str | None:
    """The member a shard's "not the owner" answer names as the owner, if it is one."""
    if not isinstance(exc, NotOwnerError):
        return None
    owner = exc.data.get("owner")
    return owner if isinstance(owner, str) else None


DataServer = Callable[[FrameProtocol, str], Awaitable[None]]  # the connection, the peer


@dataclass(eq=False)
class _Watch:
    """A request pending at ``owner``, the owner of ``oid`` when it was sent, in ``task``;
    ``moved``: ``oid`` moved since, and the task was cancelled for it."""

    oid: ObjectID
    owner: str
    task: asyncio.Task[Any]
    moved: bool = False


class Rpc:
    """Requests and one-ways to members and owner shards; the accepting side of TCP."""

    def __init__(self, identity: Identity, membership: Membership, links: Links, tasks: Tasks,
                 retry_window: float) -> None:
        self.me = identity.node_id
        self._identity = identity
        self._membership = membership
        self._links = links
        self._tasks = tasks
        # How long call_owner keeps trying: long enough for a dead owner to be detected and
        # its ownership to move (heartbeat timeout plus two intervals, from the config).
        self._retry_window = retry_window
        self._peer: Dispatcher | None = None
        self._tool: Dispatcher | None = None
        self._data: DataServer | None = None
        self._inbound: set[FrameProtocol] = set()
        self._handshakes = 0  # accepted TCP connections not authenticated (nor refused) yet
        self._listening: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._moved: asyncio.Future[None] | None = None  # done at the next move
        self._watches: set[_Watch] = set()  # requests pending at a remote owner

    @property
    def retry_window(self) -> float:
        """How long a request to an owner follows ownership while it moves."""
        return self._retry_window

    def serve(self, peer: Dispatcher, tool: Dispatcher, data: DataServer) -> None:
        """Install the handlers of each inbound role (and of requests to ourselves)."""
        self._peer, self._tool, self._data = peer, tool, data

    # --- outbound ---
    async def call_node(self, node: str, msg: Request[R], payload: Any = None,
                        timeout: float | None = None) -> Frame[R]:
        """Send a request to ``node`` (ourselves: a direct call) and await its reply."""
        if node == self.me:
            assert self._peer is not None, "Rpc.serve() installs the handlers first"
            frame: Frame[R] = await self._peer.call(self.me, msg, payload)
            return frame
        link = self._links.get(node)
        if link is None:
            raise PeerUnavailableError(f"{node} is not a member", node=node)
        return await link.request(msg, payload, timeout)

    async def call_owner(self, oid: ObjectID, msg: Request[R], payload: Any = None,
                         timeout: float | None = None,
                         wanted: Callable[[], bool] | None = None) -> Frame[R]:
        """Send a request about ``oid`` to its owner shard, following ownership changes for
        a retry window counted from the first failure to reach an owner (a long poll may have
        waited at an owner that then died for longer than the window). ``wanted``: asked
        before each attempt; once False (a publish whose copy went from here meanwhile) the
        request is not sent again, and ObjectDeletedError says so: landing later, it would
        list a copy nobody holds (docs/design.md §5, "Deletes and moving owners")."""
        loop = asyncio.get_running_loop()
        give_up: float | None = None
        attempt = 0
        differ = False  # a shard named an owner we suspect: our views differ through it
        while True:
            if wanted is not None and not wanted():
                raise ObjectDeletedError(f"object {oid.hex()} was dropped from this node (a "
                                         f"delete, or another version kept by its shard) "
                                         f"before an owner had its {type(msg).__name__}",
                                         oid=oid.hex())
            owner = self._membership.owner(oid)
            try:
                frame = await self._call_while_owner(oid, owner, msg, payload, timeout)
                if frame is None:
                    log.info("%s moved from shard %s; asking again", oid.short(), owner)
                    continue
                return frame
            except HopliteError as exc:
                pause = min(RETRY_PAUSE_MAX, 0.02 * 2 ** attempt)
                attempt += 1
                named = named_owner(exc)
                # suspected means alive: a verdict takes a member out of ``suspected``
                if named is not None and named != owner and named in self._membership.suspected:
                    if not differ:
                        log.info("shard %s says %s owns %s, which we suspect: asking again "
                                 "until our views agree", owner, named, oid.short())
                    differ = True  # as long as that lasts: trusted again, or dead
                    await asyncio.wait([self._next_move()], timeout=pause)
                    continue
                if give_up is None:
                    give_up = loop.time() + self._retry_window
                if not owner_moved(exc) or loop.time() >= give_up:
                    raise
                log.info("owner %s of %s unreachable (%s); retrying", owner, oid.short(), exc)
                await asyncio.sleep(pause)

    async def _call_while_owner(self, oid: ObjectID, owner: str, msg: Request[R],
                                payload: Any, timeout: float | None) -> Frame[R] | None:
        """``owner``'s reply, or None once ``oid`` is owned elsewhere while it is pending (its
        owner fell under suspicion: the request must not wait on a silent node). Our own
        shard wakes its waiters itself when ownership moves.

        The request runs in the caller's task, watched: a move cancels that task, and the
        cancellation is taken back here (``uncancel``, as ``asyncio.timeout`` does), unless
        someone else cancelled it too. A task of its own, raced by ``asyncio.wait`` against
        the next move, would cost every small get or put a task, a wait and a loop iteration more
        (docs/design.md §2.4, "Small requests")."""
        if owner == self.me:
            return await self.call_node(owner, msg, payload, timeout)
        task = asyncio.current_task()
        assert task is not None  # a coroutine run by the loop
        watch = _Watch(oid, owner, task)
        self._watches.add(watch)
        try:
            frame = await self.call_node(owner, msg, payload, timeout)
        except asyncio.CancelledError:
            if watch.moved and task.uncancel() == 0:
                return None
            raise
        finally:
            self._watches.discard(watch)
        if watch.moved:  # our cancellation was swallowed on its way: take it back all the same
            task.uncancel()
        return frame

    def owners_changed(self) -> None:
        """Objects moved between shards: pending requests re-check their object's owner. A
        request whose task is the one running now is not waiting: it has its reply, or has
        not been sent (and its owner answers "not the owner")."""
        moved, self._moved = self._moved, None
        if moved is not None and not moved.done():
            moved.set_result(None)
        running = asyncio.current_task()
        for watch in list(self._watches):
            if (not watch.moved and watch.task is not running
                    and self._membership.owner(watch.oid) != watch.owner):
                watch.moved = True
                watch.task.cancel()

    def views_changed(self) -> None:
        """The live set changed (a death or a join), whether or not objects moved: a request
        waiting for our views to agree about an owner we suspect asks again."""
        self.owners_changed()

    def _next_move(self) -> asyncio.Future[None]:
        """Done at the next move of objects between shards."""
        if self._moved is None:
            self._moved = asyncio.get_running_loop().create_future()
        return self._moved

    def tell(self, node: str, msg: WireMessage, payload: Any = None) -> None:
        """One-way message to ``node`` (ourselves: handled on the next loop iteration)."""
        if node == self.me:
            peer = self._peer
            assert peer is not None, "Rpc.serve() installs the handlers first"
            frame = Frame(msg, None if payload is None else memoryview(payload).cast("B"))
            asyncio.get_running_loop().call_soon(peer.deliver, self.me, frame, None)
            return
        link = self._links.get(node)
        if link is not None:
            link.notify(msg, payload)

    def tell_owner(self, oid: ObjectID, msg: WireMessage) -> None:
        """One-way message to the owner shard of ``oid``."""
        self.tell(self._membership.owner(oid), msg)

    # --- inbound ---
    def listen(self, sock: socket.socket) -> None:
        """Accept TCP connections on ``sock`` (bound, listening) until :meth:`stop_listening`."""
        sock.setblocking(False)
        self._listening = sock
        self._accepting = self._tasks.spawn(self._accept_loop(sock), name="tcp-accept")

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(sock)
            except OSError as exc:
                _accept_failed("accept on port %d failed: %s", sock.getsockname()[1], exc)
                await asyncio.sleep(ACCEPT_RETRY)
                continue
            why = self._turn_away(conn)
            if why:
                _turned_away("inbound from %s:%s: closed at once: %s", addr[0], addr[1], why)
                conn.close()
                continue
            self._handshakes += 1  # given back by _serve_inbound once the handshake ends
            self._tasks.spawn(self._serve_inbound(conn), name="inbound")

    def _turn_away(self, conn: socket.socket) -> str:
        """Why an accepted connection is closed at once ("": it is not): too many in their
        handshake, or too few descriptors left (a cheap check, no listing)."""
        if self._handshakes >= MAX_HANDSHAKES:
            return f"{MAX_HANDSHAKES} connections are in their handshake already"
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit != resource.RLIM_INFINITY and conn.fileno() >= limit - FD_RESERVE:
            return (f"descriptor {conn.fileno()} of {limit}: the last {FD_RESERVE} are kept "
                    f"for local clients and our own dials")
        return ""

    async def _serve_inbound(self, conn: socket.socket) -> None:
        """Authenticate the connection (TLS first, if we have it), then serve its role."""
        try:
            authenticated = await self._handshake(conn)
        finally:
            self._handshakes -= 1
        if authenticated is None:
            return
        protocol, role, peer = authenticated
        if role == "data":
            if self._membership.declared_dead(peer):  # docs/design.md §5
                log.info("refusing a data connection from %s: declared dead", peer)
                protocol.abort()
                return
            assert self._data is not None
            await self._data(protocol, peer)
            return
        dispatcher = self._peer if role == "peer" else self._tool
        assert dispatcher is not None

        def respond(reply: WireMessage, payload: Any, rid: int) -> None:
            if not protocol.closed.done():
                protocol.send(reply, payload, rid)

        Channel(protocol, on_request=lambda frame: dispatcher.deliver(peer, frame, respond))

    async def _handshake(self, conn: socket.socket) -> tuple[FrameProtocol, str, str] | None:
        """The protocol, role and peer id of an accepted connection once authenticated (TLS
        first, if we have it); None if it was refused."""
        try:
            protocol = await open_accepted(conn, self._identity)
        except HopliteError:
            return None
        self._inbound.add(protocol)
        protocol.on_lost.append(lambda _: self._inbound.discard(protocol))
        try:
            role, peer = await accept(protocol, self._identity)
        except HopliteError:
            return None
        return protocol, role, peer

    def stop_listening(self) -> None:
        """Refuse new connections from now on (at shutdown)."""
        if self._accepting is not None:
            self._accepting.cancel()
        if self._listening is not None:
            self._listening.close()

    def close_inbound(self) -> None:
        """Drop every accepted connection (at shutdown)."""
        for protocol in list(self._inbound):
            protocol.abort()
