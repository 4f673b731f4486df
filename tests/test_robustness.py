"""Robustness: hostile bytes, wrong tokens, unsafe settings, dead and frozen daemons, lost clients.

Everything runs against real ``hoplited`` processes; raw sockets speak the wire format by hand
(blocking sockets driven from worker threads, so the event loop keeps running meanwhile).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
from typing import Any

import msgpack
import numpy as np
import pytest
from helpers import FAST_HEARTBEAT

import hoplite_client
from hoplite_client.net.handshake import Identity, dial
from hoplite_client.wire import auth
from hoplite_client.wire.errors import AuthenticationError, HopliteError
from hoplite_client.wire.frames import (
    MAGIC,
    MAX_HEADER,
    PRELUDE,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    Frame,
    FrameReader,
    encode_header,
)
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import (
    Accepted,
    Auth,
    ClientHello,
    ClientWelcome,
    Create,
    Created,
    Error,
    Hello,
    Status,
    StatusReply,
    Welcome,
)
from hoplited.cluster.membership import rendezvous_owner

IO_TIMEOUT = 30.0  # generous: the machine is loaded
MiB = 1024 * 1024


# --- helpers ---------------------------------------------------------------------------------
def raw_frame(kind: int, header: bytes, payload: bytes = b"", magic: bytes = MAGIC) -> bytes:
    """A frame built by hand (any kind, any header bytes)."""
    return PRELUDE.pack(magic, PROTOCOL_VERSION, kind, len(header), len(payload)) + header + payload


def address(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host, int(port)


def recv_until_close(sock: socket.socket, timeout: float = IO_TIMEOUT) -> tuple[bytes, bool]:
    """Everything the peer sends until it closes (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    data = b""
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def errors_in(data: bytes) -> list[Error]:
    """Decode a daemon's answer; every frame in it must be an Error."""
    events = FrameReader().feed(data)
    assert events and all(isinstance(e, Frame) and isinstance(e.msg, Error) for e in events), events
    return [e.msg for e in events]


class RawConn:
    """A blocking socket speaking frames by hand (TCP or the daemon's Unix socket)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(IO_TIMEOUT)
        self.reader = FrameReader()
        self.events: list[Any] = []

    @classmethod
    def tcp(cls, listen: str) -> RawConn:
        return cls(socket.create_connection(address(listen), timeout=IO_TIMEOUT))

    @classmethod
    def unix(cls, path: str) -> RawConn:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(IO_TIMEOUT)
            sock.connect(path)
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next_frame(self) -> Frame:
        while not self.events:
            data = self.sock.recv(65536)
            assert data, "the daemon closed the connection"
            self.events.extend(self.reader.feed(data))
        event = self.events.pop(0)
        assert isinstance(event, Frame), event
        return event

    def client_handshake(self) -> ClientWelcome:
        """ClientHello → ClientWelcome with the arena fd (closed here: we never map it)."""
        self.send(encode_header(ClientHello(versions=SUPPORTED_VERSIONS, pid=os.getpid())))
        data, fds, _, _ = socket.recv_fds(self.sock, 4096, 1)
        for fd in fds:
            os.close(fd)
        assert len(fds) == 1, "the welcome carried no arena fd"
        self.events.extend(self.reader.feed(data))
        welcome = self.next_frame().msg
        assert isinstance(welcome, ClientWelcome), welcome
        return welcome

    def close(self) -> None:
        self.sock.close()


def memfd_holders(name: str) -> set[int]:
    """Pids that map ``memfd:<name>`` or hold an fd on it (vanishing processes ignored)."""
    needle = f"memfd:{name}"
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/maps", errors="replace") as f:
                if needle in f.read():
                    pids.add(int(entry))
                    continue
        except OSError:
            pass
        try:
            fds = os.listdir(f"/proc/{entry}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if needle in os.readlink(f"/proc/{entry}/fd/{fd}"):
                    pids.add(int(entry))
                    break
            except OSError:
                continue
    return pids


def shm_files() -> set[str]:
    # POSIX semaphores (sem.*) of unrelated programs are not shared memory we care about.
    return {n for n in os.listdir("/dev/shm") if not n.startswith("sem.")}


async def eventually(check, timeout: float = IO_TIMEOUT, what: str = "condition") -> Any:
    """Poll the async ``check`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s (last: {result!r})")
        await asyncio.sleep(0.2)


async def run_hoplited(*args: str, timeout: float = 60.0) -> tuple[int, str]:
    """Run ``python -m hoplited ARGS`` to completion (killed and reaped on timeout)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hoplited", *args, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, err.decode(errors="replace")


@pytest.fixture
def open_client(connect):
    """The conftest ``connect``: a client closed at teardown."""
    return connect


async def wait_member_dead(client: hoplite_client.Client, node_id: str) -> None:
    """Poll ``client.status()`` until its daemon lists ``node_id`` as not alive."""

    async def dead() -> bool:
        members = (await client.status())["local"]["members"]
        return any(m["node_id"] == node_id and m["alive"] is False for m in members)

    await eventually(dead, what=f"member {node_id} declared dead")


async def put_get_roundtrip(put_socket: str, get_socket: str) -> None:
    """A small and a large object put through one daemon come back intact through another."""
    async with await hoplite_client.connect(put_socket) as a, await hoplite_client.connect(get_socket) as b:
        small = np.arange(100, dtype=np.int32)
        large = np.arange(MiB // 8, dtype=np.float64)  # 1 MiB: goes through shared memory
        ids = [await a.put(small), await a.put(large)]
        for oid, want in zip(ids, (small, large)):
            got = await b.get(oid, timeout=IO_TIMEOUT)
            np.testing.assert_array_equal(got, want)
            del got


# --- 1. garbage on the TCP port --------------------------------------------------------------
async def test_tcp_garbage_is_refused_and_daemon_keeps_serving(make_cluster):
    """Junk, oversized/bad preludes, a mistyped Hello and a silent socket do not hurt a daemon."""
    cluster = await make_cluster(2)
    listen = cluster.nodes[0].listen
    idle = RawConn.tcp(listen)  # says nothing, stays open
    try:
        junk = b"\xff\xfe" + random.Random(1).randbytes(62)  # cannot start with b"HP"
        oversized = PRELUDE.pack(MAGIC, PROTOCOL_VERSION, Hello.KIND, MAX_HEADER + 1, 0)
        hello = msgpack.packb([SUPPORTED_VERSIONS, "intruder", auth.new_nonce(), "peer"])
        bad_magic = raw_frame(Hello.KIND, hello, magic=b"XX")
        for data, strict in ((junk, False), (oversized, True), (bad_magic, True)):
            conn = RawConn.tcp(listen)
            try:
                conn.send(data)
                answer, closed = await asyncio.to_thread(recv_until_close, conn.sock)
            finally:
                conn.close()
            assert closed, f"connection left open after {data[:16]!r}"
            if answer or strict:
                assert [e.code for e in errors_in(answer)] == ["protocol"]

        # A Hello whose ``versions`` is a string: the frame is rejected with an Error.
        conn = RawConn.tcp(listen)
        try:
            conn.send(raw_frame(Hello.KIND, msgpack.packb(["1", "intruder", b"n" * 16, "peer"])))
            reply = (await asyncio.to_thread(conn.next_frame)).msg
            assert isinstance(reply, Error) and reply.code == "protocol", reply
        finally:
            conn.close()

        await put_get_roundtrip(cluster.nodes[0].socket, cluster.nodes[1].socket)

        # The silent connection is dropped once the handshake timeout passes.
        answer, closed = await asyncio.to_thread(recv_until_close, idle.sock, 60.0)
        assert closed, "a connection that never says Hello is kept open forever"
        assert [e.code for e in errors_in(answer)] == ["timeout"]
    finally:
        idle.close()


# --- 2. garbage on the Unix socket -----------------------------------------------------------
async def test_unix_socket_garbage(make_cluster):
    """Junk handshakes are dropped; bad frames after a handshake get Errors; oversized closes."""
    cluster = await make_cluster(1)
    path = cluster.nodes[0].socket

    for data in (b"\x00junk-instead-of-a-client-hello" * 4,
                 encode_header(ClientHello(versions=[99], pid=1))):
        conn = RawConn.unix(path)
        try:
            conn.send(data)
            answer, closed = await asyncio.to_thread(recv_until_close, conn.sock)
        finally:
            conn.close()
        assert closed and answer == b"", (answer, closed)

    conn = RawConn.unix(path)
    try:
        welcome = await asyncio.to_thread(conn.client_handshake)
        assert welcome.node_id == cluster.nodes[0].node_id
        conn.send(raw_frame(99, msgpack.packb([7])))  # unknown kind
        conn.send(raw_frame(Status.KIND, b"\xc1"))  # not msgpack
        conn.send(raw_frame(Status.KIND, msgpack.packb(["rid-as-a-string"])))  # wrong type
        conn.send(encode_header(Status(rid=9)))
        replies = [(await asyncio.to_thread(conn.next_frame)).msg for _ in range(4)]
        assert [(type(r), r.rid) for r in replies] == [(Error, 7), (Error, 0), (Error, 0),
                                                       (StatusReply, 9)], replies
        assert all(r.code == "protocol" for r in replies[:3])
        assert replies[3].info["local"]["node_id"] == welcome.node_id

        conn.send(PRELUDE.pack(MAGIC, PROTOCOL_VERSION, Status.KIND, MAX_HEADER + 1, 0))
        answer, closed = await asyncio.to_thread(recv_until_close, conn.sock)
        assert closed, "an oversized header left the connection open"
        if answer:
            assert [e.code for e in errors_in(answer)] == ["protocol"]
    finally:
        conn.close()

    await put_get_roundtrip(path, path)


async def test_request_right_after_the_welcome_is_answered(make_cluster):
    """A request sent the moment the ClientWelcome arrives (or pipelined) is answered."""
    cluster = await make_cluster(1)
    hello = encode_header(ClientHello(versions=SUPPORTED_VERSIONS, pid=os.getpid()))
    status = encode_header(Status(rid=1))

    def at_once(pipelined: bool) -> Any:
        conn = RawConn.unix(cluster.nodes[0].socket)
        try:
            if pipelined:  # the daemon reads exactly one frame for the hello, nothing past it
                conn.send(hello + status)
                data, fds, _, _ = socket.recv_fds(conn.sock, 4096, 1)
                for fd in fds:
                    os.close(fd)
                conn.events.extend(conn.reader.feed(data))
                assert isinstance(conn.next_frame().msg, ClientWelcome)
            else:
                conn.client_handshake()
                conn.send(status)
            try:
                return conn.next_frame().msg
            except TimeoutError:
                return None
        finally:
            conn.close()

    for attempt, pipelined in enumerate([False] * 10 + [True]):
        reply = await asyncio.to_thread(at_once, pipelined)
        assert reply is not None, (f"attempt {attempt} (pipelined={pipelined}): no reply within "
                                   f"{IO_TIMEOUT}s to a Status sent right after the handshake")
        assert isinstance(reply, StatusReply) and reply.rid == 1, reply


# --- 3. wrong token --------------------------------------------------------------------------
async def test_wrong_token_is_refused(make_cluster, open_client):
    """Dialing with a wrong token fails both ways; a daemon with another token cannot join."""
    cluster = await make_cluster(1)
    host, port = address(cluster.seed)

    with pytest.raises(AuthenticationError):
        await dial(host, port, "peer", Identity("intruder", b"not-the-token"))

    # The acceptor's side: a dialer that answers the Welcome with a bogus proof.
    conn = RawConn.tcp(cluster.seed)
    try:
        nonce = auth.new_nonce()
        conn.send(encode_header(Hello(versions=SUPPORTED_VERSIONS, node_id="intruder",
                                      nonce=nonce, role="peer")))
        assert isinstance((await asyncio.to_thread(conn.next_frame)).msg, Welcome)
        conn.send(encode_header(Auth(proof=bytes(32))))
        answer, closed = await asyncio.to_thread(recv_until_close, conn.sock)
        assert closed
        assert not any(isinstance(e.msg, Accepted) for e in FrameReader().feed(answer))
        assert [e.code for e in errors_in(answer)] == ["auth"]
    finally:
        conn.close()

    other_token = os.path.join(cluster.workdir, "other-token")
    with open(other_token, "w") as f:
        f.write("a-completely-different-token")
    code, err = await run_hoplited(
        "--listen", "127.0.0.1:0", "--socket", os.path.join(cluster.workdir, "intruder.sock"),
        "--capacity", "16MiB", "--token-file", other_token, "--join", cluster.seed)
    assert code != 0
    assert "token" in err and "could not join" in err, err

    client = await open_client(cluster.nodes[0].socket)
    members = (await client.status())["local"]["members"]
    assert [m["node_id"] for m in members] == [cluster.nodes[0].node_id]


# --- 4. no token on a public address ---------------------------------------------------------
async def test_public_address_requires_token_or_insecure():
    """--listen 0.0.0.0 without a token exits 2 naming the token; with --insecure it serves."""
    tmp = tempfile.mkdtemp(prefix="hoplite-rb-")
    try:
        sock = os.path.join(tmp, "d.sock")
        code, err = await run_hoplited("--listen", "0.0.0.0:0", "--socket", sock,
                                       "--capacity", "16MiB")
        assert code == 2, err
        assert "token" in err, err

        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hoplited", "--listen", "0.0.0.0:0", "--socket", sock,
            "--capacity", "16MiB", "--insecure", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert b'"ready"' in line and b'"listen": "0.0.0.0:' in line, line
        finally:
            if proc.returncode is None:
                proc.terminate()
            try:
                await asyncio.wait_for(proc.communicate(), 20)
            except TimeoutError:
                proc.kill()
                await proc.communicate()
        assert proc.returncode == 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- 5. SIGKILL and restart ------------------------------------------------------------------
async def test_sigkill_leaves_no_shared_memory_and_restart_works(make_cluster):
    """A SIGKILLed daemon's arena is gone once its clients are; restart on the same socket works."""
    cluster = await make_cluster(2)
    victim = cluster.nodes[1]
    arena_name = f"hoplite-{victim.node_id}"
    shm_before = shm_files()
    client = await hoplite_client.connect(victim.socket)
    try:
        big = np.arange(32 * MiB // 8, dtype=np.int64)
        oid = await client.put(big)
        view = await client.get(oid)
        assert view[-1] == big[-1]
        del view
        holders = await asyncio.to_thread(memfd_holders, arena_name)
        assert {victim.pid, os.getpid()} <= holders, holders  # the scan sees what it should
        cluster.kill(1)
        await asyncio.wait_for(victim.process.wait(), IO_TIMEOUT)
    finally:
        await client.close()
    del client

    async def arena_gone() -> bool:
        return not await asyncio.to_thread(memfd_holders, arena_name)

    await eventually(arena_gone, what=f"no process holding memfd:{arena_name}")
    assert shm_files() - shm_before == set()

    node = await cluster.restart(1)
    assert node.socket == victim.socket and node.pid != victim.pid
    await put_get_roundtrip(node.socket, cluster.nodes[0].socket)
    await put_get_roundtrip(cluster.nodes[0].socket, node.socket)


async def test_closed_client_unmaps_the_arena(make_cluster):
    """After Client.close() the client process no longer maps the daemon's arena."""
    cluster = await make_cluster(1)
    node = cluster.nodes[0]
    client = await hoplite_client.connect(node.socket)
    try:
        await client.put(np.ones(MiB, dtype=np.uint8))
    finally:
        await client.close()
    with open("/proc/self/maps") as f:
        mapped = f"memfd:hoplite-{node.node_id}" in f.read()
    assert not mapped, "a closed client still maps the daemon's whole arena"


async def test_put_whose_owner_just_died_succeeds(make_cluster, open_client):
    """A put whose directory owner was just SIGKILLed is not failed back to the client."""
    cluster = await make_cluster(2)
    c0 = await open_client(cluster.nodes[0].socket)
    ids = [n.node_id for n in cluster.nodes]
    oid = next(o for o in iter(ObjectID.random, None) if rendezvous_owner(o, ids) == ids[1])
    cluster.kill(1)
    await asyncio.wait_for(cluster.nodes[1].process.wait(), IO_TIMEOUT)
    data = np.arange(1000, dtype=np.int64)
    await asyncio.wait_for(c0.put(data, object_id=oid), 60.0)
    np.testing.assert_array_equal(await c0.get(oid, timeout=IO_TIMEOUT), data)


# --- 6. a frozen member ----------------------------------------------------------------------
async def test_stopped_member_is_declared_dead(make_cluster, open_client):
    """A SIGSTOPped member is declared dead; a get of its object fails instead of hanging."""
    cluster = await make_cluster(3, daemon_args=FAST_HEARTBEAT)
    c0 = await open_client(cluster.nodes[0].socket)
    c2 = await open_client(cluster.nodes[2].socket)
    oid = await c2.put(np.ones(MiB, dtype=np.uint8))  # large: its bytes live on node 2 only
    frozen = cluster.nodes[2].node_id
    cluster.kill(2, signal.SIGSTOP)
    try:
        await wait_member_dead(c0, frozen)
        with pytest.raises(HopliteError):
            await asyncio.wait_for(c0.get(oid, timeout=3.0), 60.0)
    finally:
        cluster.kill(2, signal.SIGCONT)


# --- 7. a client that goes away --------------------------------------------------------------
async def test_disconnected_client_releases_views_and_unsealed_objects(make_cluster,
                                                                      open_client):
    """Pins and unsealed creations of a client that disconnects are freed by the daemon."""
    cluster = await make_cluster(1)
    path = cluster.nodes[0].socket
    owner = await open_client(path)

    async def store() -> dict[str, int]:
        return (await owner.status())["local"]["store"]

    base = (await store())["arena_used"]
    oid = await owner.put(np.full(8 * MiB, 7, dtype=np.uint8))

    holder = await hoplite_client.connect(path)
    raw = RawConn.unix(path)
    try:
        view = await holder.get(oid)
        await asyncio.to_thread(raw.client_handshake)
        size = 16 * MiB
        raw.send(encode_header(Create(rid=1, oid=ObjectID.random(), size=size, dtype="|u1",
                                      shape=[size])))
        assert isinstance((await asyncio.to_thread(raw.next_frame)).msg, Created)
        await owner.delete(oid)  # still pinned by ``view``: the memory must stay
        st = await store()
        assert st["arena_used"] >= base + 24 * MiB and st["pinned_deleted"] == 1, st
    finally:
        await holder.close()
        raw.close()

    async def released() -> Any:
        st = await store()
        return st["arena_used"] == base and st["pinned_deleted"] == 0 and st["objects"] == 0

    await eventually(released, what="the arena back to its size before the client")
    del view
