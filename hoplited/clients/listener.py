"""The Unix-socket listener for local client processes.

Connecting: the client sends ClientHello; the daemon answers ClientWelcome with a read-only
descriptor of the arena's memfd attached (SCM_RIGHTS), so the client maps objects it gets in
place (and can write none of them); then a
:class:`~hoplited.clients.session.ClientSession` serves the connection. The socket file is
created readable by its owner only.
"""

from __future__ import annotations

import array
import asyncio
import errno
import logging
import os
import socket

from hoplite_client.net.endpoints import private_dir
from hoplite_client.net.handshake import HANDSHAKE_TIMEOUT, read_one_frame
from hoplite_client.net.log_limit import limited
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import HopliteError, InvalidArgumentError, RemoteProtocolError
from hoplite_client.wire.frames import SUPPORTED_VERSIONS, encode_header
from hoplite_client.wire.messages import CLIENT, ClientHello, ClientWelcome
from hoplited.clients.session import HANDLERS, ClientSession, SessionDeps
from hoplited.dispatch import check_complete
from hoplited.memory.arena import Arena

log = logging.getLogger("hoplited.clients")

# Pause after a failed accept (EMFILE and the like) before trying again: no busy loop.
ACCEPT_RETRY = 0.1


class ClientListener:
    """Accepts local clients on the Unix socket; one session per connection."""

    def __init__(self, path: str, node_id: str, arena: Arena, deps: SessionDeps) -> None:
        self._path = path
        self._node_id = node_id
        self._arena = arena
        self._deps = deps
        self.sessions: set[ClientSession] = set()
        self._sock: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Check the client handler table, bind the socket and start accepting."""
        check_complete(CLIENT, HANDLERS)
        self._sock = _bind_unix(self._path)
        self._accepting = self._deps.tasks.spawn(self._accept_loop(), name="unix-accept")

    def __len__(self) -> int:
        return len(self.sessions)

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as exc:  # out of descriptors, say: one line per interval at most
                limited(log, "accept failed")("accept on %s failed: %s", self._path, exc)
                await asyncio.sleep(ACCEPT_RETRY)
                continue
            self._deps.tasks.spawn(self._welcome(conn), name="client-hello")

    async def _welcome(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT):
                hello = (await read_one_frame(conn)).msg
            if not isinstance(hello, ClientHello):
                raise RemoteProtocolError(f"expected ClientHello, got {type(hello).__name__}")
            if not set(hello.versions) & set(SUPPORTED_VERSIONS):
                raise RemoteProtocolError(f"client speaks versions {hello.versions}")
            welcome = encode_header(ClientWelcome(version=max(SUPPORTED_VERSIONS),
                                                  node_id=self._node_id,
                                                  arena_size=self._arena.capacity))
            fds = array.array("i", [self._arena.client_fd])
            conn.sendmsg([welcome], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except (HopliteError, OSError, TimeoutError) as exc:
            log.warning("client handshake failed: %s", exc or type(exc).__name__)
            conn.close()
            return

        def serve() -> FrameProtocol:
            """The connection's protocol with its session already listening: a frame that
            comes with the first bytes read finds the session's handlers and Seal sink."""
            protocol = FrameProtocol(name=f"client-{hello.pid}")
            session = ClientSession(protocol, self._deps)
            self.sessions.add(session)
            protocol.on_lost.append(lambda _: self._ended(session))
            return protocol

        await loop.connect_accepted_socket(serve, conn)

    def _ended(self, session: ClientSession) -> None:
        self.sessions.discard(session)
        session.cleanup()

    def stop(self) -> None:
        """Stop accepting, remove the socket file, drop every client connection."""
        if self._accepting is not None:
            self._accepting.cancel()
        if self._sock is not None:
            self._sock.close()
            try:
                os.unlink(self._path)
            except FileNotFoundError:
                pass
        for session in list(self.sessions):
            session.protocol.abort()


def _bind_unix(path: str) -> socket.socket:
    """Bind the socket readable by its owner only, in a directory only we (or root) may
    change; refuse if a live daemon already owns it."""
    directory = os.path.dirname(os.path.abspath(path))
    # Another user who may write there could swap in a socket of its own, and receive
    # everything our clients put.
    private_dir(directory, "pass --socket in a directory of yours")
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise
            os.unlink(path)  # left behind by a daemon that died
        else:
            raise InvalidArgumentError(f"a daemon is already serving {path}")
        finally:
            probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(128)
    sock.setblocking(False)
    return sock
