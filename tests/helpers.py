"""Constants and helpers shared by the test tiers (tests/ is on sys.path: its conftest).

Raw sockets speak the wire format by hand (blocking sockets driven from worker threads, so the
event loop keeps running meanwhile).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import socket
import sys
import time
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import numpy as np

import hoplite_client
from hoplite_client.daemon_process import cpu_seconds
from hoplite_client.net.channel import Channel
from hoplite_client.net.endpoints import parse_address
from hoplite_client.net.handshake import Identity, dial
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.frames import (
    MAGIC,
    PRELUDE,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    Frame,
    FrameReader,
    encode_header,
)
from hoplite_client.wire.messages import (
    ClientHello,
    ClientWelcome,
    Error,
    Stats,
)

# Small arenas keep eight daemons cheap.
TEST_CAPACITY = "512MiB"
# Heartbeats fast enough for failure tests, slow enough for a loaded 2-core machine.
FAST_HEARTBEAT = ["--heartbeat-interval", "0.5", "--heartbeat-timeout", "4"]
IO_TIMEOUT = 30.0  # generous: the machine is loaded
MiB = 1024 * 1024


# --- helpers ---------------------------------------------------------------------------------
def top_level_imports(module: ModuleType) -> set[str]:
    """The top-level packages ``module``'s source imports: a pure core's must hold no I/O."""
    tree = ast.parse(inspect.getsource(module))
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    return imported


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
        self.arena_fd: int | None = None

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

    def client_handshake(self, keep_fd: bool = False) -> ClientWelcome:
        """ClientHello → ClientWelcome with the arena fd: closed here, or with ``keep_fd``
        kept in ``arena_fd`` for the caller to close."""
        self.send(encode_header(ClientHello(versions=SUPPORTED_VERSIONS, pid=os.getpid())))
        data, fds, _, _ = socket.recv_fds(self.sock, 4096, 1)
        assert len(fds) == 1, "the welcome carried no arena fd"
        if keep_fd:
            self.arena_fd = fds[0]
        else:
            os.close(fds[0])
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


def allowed_congestion() -> list[str]:
    """The TCP congestion controls this kernel lets any socket choose ([] off Linux)."""
    try:
        with open("/proc/sys/net/ipv4/tcp_allowed_congestion_control") as f:
            return f.read().split()
    except OSError:
        return []


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


async def every_node_stats(client: Any, nodes: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``client``'s ``status()`` record of each of ``nodes`` (ids), by id, asked again until
    each answered: the daemon reports a member that did not answer within its per-member
    status timeout as an error, which on a loaded machine is not the test's failure."""
    wanted = list(dict.fromkeys(nodes))  # in the order asked, once each

    async def answered() -> dict[str, dict[str, Any]] | None:
        records = {n["node_id"]: n for n in (await client.status())["nodes"]}
        if all(node in records and "error" not in records[node] for node in wanted):
            return {node: records[node] for node in wanted}
        return None

    result: dict[str, dict[str, Any]] = await eventually(answered, what="every node's status")
    return result


# The ``hoplite`` CLI, run as a module of the interpreter under test.
CLI = [sys.executable, "-m", "hoplited.tools.cli.main"]
RUN_TIMEOUT = 300.0  # a command's whole run, on a loaded machine


async def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run a command to its end (killed after RUN_TIMEOUT); its exit code, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL, env={**os.environ, **(env or {})})
    try:
        out, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, out.decode(), err.decode()


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


async def wait_member_dead(client: hoplite_client.Client, node_id: str) -> None:
    """Poll ``client.status()`` until its daemon lists ``node_id`` as not alive."""

    async def dead() -> bool:
        members = (await client.status())["local"]["members"]
        return any(m["node_id"] == node_id and m["alive"] is False for m in members)

    await eventually(dead, what=f"member {node_id} declared dead")


async def wait_declared_dead(cluster: Any, by: int, node_id: str) -> None:
    """``wait_member_dead`` asked of node ``by`` of ``cluster`` alone (``own_record``): while
    ``node_id`` is frozen and not yet dead, a client's status would wait on it for its
    status timeout at every look."""

    async def dead() -> bool:
        members = (await own_record(cluster, by))["members"]
        return any(m["node_id"] == node_id and m["alive"] is False for m in members)

    await eventually(dead, what=f"member {node_id} declared dead by node {by}")


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


# A daemon counts as idle when it uses less than IDLE_CPU seconds of CPU over IDLE_WINDOW (a
# third of a core; a spinning daemon takes a whole one, or half of one on a loaded machine).
IDLE_CPU = 0.7
IDLE_WINDOW = 2.0


async def assert_healthy_after_abuse(cluster: Any) -> None:
    """After hostile input: every daemon of ``cluster`` idle, no traceback in its log, and
    put/get still correct between the first two."""
    before = [cpu_seconds(n.pid) for n in cluster.nodes]
    await asyncio.sleep(IDLE_WINDOW)
    used = [cpu_seconds(n.pid) - b for n, b in zip(cluster.nodes, before, strict=True)]
    assert max(used) < IDLE_CPU, f"daemons busy after the abuse: {used} CPU s"
    for node in cluster.nodes:
        with open(node.log_path, errors="replace") as f:
            log = f.read()
        at = log.find("Traceback")
        assert at < 0, f"a traceback in daemon {node.index}'s log:\n{log[max(0, at - 400):at + 3000]}"
    await put_get_roundtrip(cluster.sockets[0], cluster.sockets[1])


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie nobody reaped yet counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def until(check: Callable[[], bool], timeout: float) -> None:
    """Poll ``check`` until it holds: the blocking ``eventually``, for tests driving a
    framework whose calls block (Ray, Dask)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not reached within {timeout}s"
        time.sleep(0.2)


async def dial_as_peer(cluster: Any, name: str, node: int = 0) -> tuple[FrameProtocol, Channel]:
    """A peer connection to ``cluster``'s node ``node`` as the (non-member) daemon ``name``,
    holding the cluster's token: a test speaks the peer protocol itself on it."""
    with open(cluster.token_file, "rb") as f:
        me = Identity(name, f.read().strip())
    host, port = cluster.nodes[node].listen.rsplit(":", 1)
    protocol, _ = await dial(host, int(port), "peer", me)
    return protocol, Channel(protocol)


async def own_record(cluster: Any, index: int) -> dict[str, Any]:
    """Node ``index``'s own status record (``local_stats`` with the cluster's token): no other
    member is asked, so a frozen one does not hold the answer up for its status timeout, as
    it does a client's ``status()``."""
    with open(cluster.token_file, "rb") as f:
        return await local_stats(cluster.nodes[index], f.read().strip())


async def local_stats(node: Any, token: bytes) -> dict[str, Any]:
    """``node``'s own record (a LocalCluster node), asked as a tool: a client's status would
    ask every member itself, so it dials links and waits on a silent member."""
    host, port = parse_address(node.listen)
    protocol, _ = await dial(host, port, "tool", Identity("test-tool", token))
    try:
        frame = await Channel(protocol).request(Stats(), timeout=IO_TIMEOUT)
    finally:
        protocol.close()
    info: dict[str, Any] = frame.msg.info
    return info
