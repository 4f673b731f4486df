"""The handshakes that open every connection: TCP (authenticated) and the Unix socket.

Dialer: Hello(versions, id, nonce, role) → acceptor: Welcome(version, id, nonce, proof) →
dialer checks the proof, sends Auth(proof) → acceptor checks it, sends Accepted. A wrong
token, an unknown version or silence past the timeout closes the connection with a typed
error on both sides.

With TLS (:mod:`.tls`, on :class:`Identity`) a TLS handshake with mutual certificate checks
comes first and the exchange above runs inside it. A peer whose certificate is refused, or
that speaks TLS when we do not (or the reverse), fails with a typed error within the same
timeout; the acceptor logs one warning line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from dataclasses import dataclass
from typing import TypeVar

from hoplite_client.net import congestion
from hoplite_client.net.log_limit import limited
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.net.tls import TlsContexts, describe
from hoplite_client.wire import auth
from hoplite_client.wire.errors import (
    AuthenticationError,
    ConnectionLostError,
    HopliteError,
    HopliteTimeoutError,
    RemoteProtocolError,
    UnreachableError,
    VersionMismatchError,
    error_from_wire,
)
from hoplite_client.wire.frames import (
    HANDSHAKE_MAX_HEADER,
    SUPPORTED_VERSIONS,
    Frame,
    FrameReader,
)
from hoplite_client.wire.messages import Accepted, Auth, Error, Hello, Welcome, WireMessage

log = logging.getLogger("hoplite.handshake")
# Anyone who can reach the port can have a handshake refused, as often as it likes.
_refused = limited(log, "handshake refused")

HANDSHAKE_TIMEOUT = 10.0  # generous: a loaded 2-core host may take a while to schedule us
ROLES = ("peer", "data", "tool")

_M = TypeVar("_M", bound=WireMessage)


@dataclass(frozen=True)
class Identity:
    """Who we are on the cluster: node id, the shared token (b"" when insecure), the TLS
    contexts every TCP connection uses (None: plain TCP) and the congestion control every
    connection we dial uses ("": the system's; :mod:`.congestion`)."""

    node_id: str
    token: bytes
    tls: TlsContexts | None = None
    congestion: str = ""


async def _expect(protocol: FrameProtocol, cls: type[_M], timeout: float) -> _M:
    """The next handshake message, which must be a ``cls``; an ``Error`` raises its error."""
    frame = await protocol.next_frame(timeout)
    if isinstance(frame.msg, Error):
        raise error_from_wire(frame.msg.code, frame.msg.message, frame.msg.data)
    if not isinstance(frame.msg, cls):
        raise RemoteProtocolError(f"expected {cls.__name__}, got {type(frame.msg).__name__}")
    return frame.msg


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is :func:`dial`'s error for a refused connection: nothing listens on
    the port, so the peer's process is gone."""
    return isinstance(exc, ConnectionLostError) and isinstance(exc.__cause__,
                                                               ConnectionRefusedError)


async def dial(host: str, port: int, role: str, me: Identity,
               timeout: float = HANDSHAKE_TIMEOUT) -> tuple[FrameProtocol, str]:
    """Connect and authenticate; returns the protocol (frames queue up) and the peer's id."""
    loop = asyncio.get_running_loop()
    context = me.tls.client if me.tls is not None else None
    try:
        async with asyncio.timeout(timeout):
            transport, protocol = await loop.create_connection(
                lambda: FrameProtocol(name=f"{role}->{host}:{port}", authenticated=False),
                host, port, ssl=context,
                ssl_handshake_timeout=None if context is None else timeout)
        sock = transport.get_extra_info("socket")
        if sock is not None:  # the daemon checked the name when it started: it is known
            with contextlib.suppress(OSError):
                congestion.use(sock, me.congestion)
    except TimeoutError:
        raise HopliteTimeoutError(f"connecting to {host}:{port} timed out") from None
    except ssl.SSLError as exc:  # its certificate refused, or it does not speak TLS
        raise AuthenticationError(f"TLS with {host}:{port} failed: {describe(exc)}") from exc
    except OSError as exc:
        raise UnreachableError(f"cannot connect to {host}:{port}: {exc}") from exc
    welcome: Welcome | None = None
    try:
        nonce = auth.new_nonce()
        protocol.send(Hello(versions=SUPPORTED_VERSIONS, node_id=me.node_id, nonce=nonce,
                            role=role))
        welcome = await _expect(protocol, Welcome, timeout)
        if len(welcome.nonce) != auth.NONCE_SIZE:
            raise RemoteProtocolError("handshake nonce of the wrong size")
        expected = auth.proof(me.token, b"server", welcome.nonce, nonce, welcome.node_id,
                              me.node_id)
        if not auth.verify(expected, welcome.proof):
            raise AuthenticationError(f"{host}:{port} does not know the cluster token")
        protocol.send(Auth(proof=auth.proof(me.token, b"client", nonce, welcome.nonce,
                                            me.node_id, welcome.node_id)))
        await _expect(protocol, Accepted, timeout)
        protocol.authenticate()
    except ConnectionLostError as exc:
        protocol.abort()
        if welcome is not None or exc.reported:
            raise
        # Hung up on before a word: the acceptor's log says why. Under TLS 1.3 its refusal
        # of our certificate looks just so (it drops the connection without the alert).
        hint = ("does it accept our certificate?" if context is not None else
                "if it requires TLS, pass --tls-cert/--tls-key/--tls-ca")
        raise ConnectionLostError(f"{host}:{port} hung up during the handshake ({hint})"
                                  ) from exc
    except BaseException:
        protocol.abort()
        raise
    protocol.name = f"{role}->{welcome.node_id}"
    return protocol, welcome.node_id


async def accept(protocol: FrameProtocol, me: Identity,
                 timeout: float = HANDSHAKE_TIMEOUT) -> tuple[str, str]:
    """Run the acceptor's side; returns (role, peer id) or raises after telling the peer why."""
    try:
        hello = await _expect(protocol, Hello, timeout)
        common = sorted(set(hello.versions) & set(SUPPORTED_VERSIONS))
        if not common:
            raise VersionMismatchError(f"peer speaks versions {hello.versions}, "
                                       f"we speak {SUPPORTED_VERSIONS}")
        if len(hello.nonce) != auth.NONCE_SIZE:
            raise RemoteProtocolError("handshake nonce of the wrong size")
        if hello.role not in ROLES:
            raise RemoteProtocolError(f"unknown connection role {hello.role!r}")
        nonce = auth.new_nonce()
        protocol.send(Welcome(version=common[-1], node_id=me.node_id, nonce=nonce,
                              proof=auth.proof(me.token, b"server", nonce, hello.nonce,
                                               me.node_id, hello.node_id)))
        reply = await _expect(protocol, Auth, timeout)
        expected = auth.proof(me.token, b"client", hello.nonce, nonce, hello.node_id,
                              me.node_id)
        if not auth.verify(expected, reply.proof):
            raise AuthenticationError(f"peer {hello.node_id!r} does not know the cluster token")
        protocol.send(Accepted(version=common[-1]))
        protocol.authenticate()  # before anything else it sends is read
    except HopliteError as exc:
        if protocol.closed.done():  # it hung up, or sent a bad frame (logged as it closed)
            log.debug("%s: handshake ended: %s", protocol.name, exc)
        else:
            _refused("%s: handshake refused: %s", protocol.name, exc)
            protocol.send(Error(rid=0, code=exc.code, message=str(exc), data={}))
            protocol.close()
        raise
    protocol.name = f"{hello.role}<-{hello.node_id}"
    return hello.role, hello.node_id


async def open_accepted(conn: socket.socket, me: Identity,
                        timeout: float = HANDSHAKE_TIMEOUT) -> FrameProtocol:
    """A :class:`FrameProtocol` on an accepted TCP socket, which then belongs to it; with TLS,
    after the TLS handshake. A refused or silent TLS peer is logged once and raises."""
    loop = asyncio.get_running_loop()
    context = me.tls.server if me.tls is not None else None
    try:
        host, port = conn.getpeername()[:2]
        peer = f"{host}:{port}"
    except OSError:  # reset already
        peer = "a peer gone already"
    # Ours, not the one returned: uvloop returns its SSL layer's protocol when ``ssl`` is given.
    protocol = FrameProtocol(name=f"inbound from {peer}", authenticated=False)
    try:
        await loop.connect_accepted_socket(
            lambda: protocol, conn, ssl=context,
            ssl_handshake_timeout=None if context is None else timeout)
    except OSError as exc:  # SSLError (a refused certificate, plaintext), a timeout, a reset
        reason = (describe(exc) if isinstance(exc, ssl.SSLError) else str(exc)
                  or f"{type(exc).__name__} (did it refuse our certificate?)")
        _refused("inbound from %s: %s refused: %s", peer,
                 "TLS handshake" if context is not None else "connection", reason)
        if context is None:
            raise ConnectionLostError(f"inbound from {peer}: {reason}") from exc
        raise AuthenticationError(f"TLS handshake with {peer} failed: {reason}") from exc
    return protocol


async def read_one_frame(conn: socket.socket,
                         max_header: int = HANDSHAKE_MAX_HEADER) -> Frame[WireMessage]:
    """Read exactly one frame from a raw non-blocking socket (nothing past it): the Unix
    socket's hello, before the connection is handed to a :class:`FrameProtocol`; its header
    is capped at ``max_header`` (a handshake's, by default)."""
    loop = asyncio.get_running_loop()
    reader = FrameReader(max_header=max_header)
    while True:
        n = await loop.sock_recv_into(conn, reader.get_buffer())
        if n == 0:
            raise ConnectionLostError("the other side closed during the handshake")
        for event in reader.buffer_updated(n):
            if isinstance(event, Frame):
                return event
            raise event.error
