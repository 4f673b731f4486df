"""Start and stop a cluster of real ``hoplited`` processes on this machine.

Used by ``hoplite cluster``/``hoplite bench`` and by the tests. Each daemon gets its own Unix
socket and log file in a private temporary directory; the first one is the seed the others
join. Stopping sends SIGTERM (SIGKILL after a grace period) to exactly the processes started
here, and removes the directory.

By default every daemon listens on loopback. ``placement`` runs daemon i as
``prefix_i + [python, -m, hoplited, --listen, host_i:0, ...]`` instead, e.g. inside a network
namespace of an emulated test bed (``hoplited.tools.testbed``); the prefix must exec the
daemon (as ``ip netns exec`` does), so that the PID we hold is the daemon's. Clients still
connect from here: Unix sockets are paths, reachable from any network namespace.

``tls`` gives every daemon the same certificate, key and CA (``--tls-cert/--tls-key/--tls-ca``):
a cluster whose peer connections all run over mutual TLS (docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hoplite_client.net.tls import TlsFiles
from hoplite_client.wire.errors import HopliteError, HopliteTimeoutError, InvalidArgumentError

READY_TIMEOUT = 60.0  # a daemon start on a loaded 2-core machine can take seconds
STOP_GRACE = 10.0
LOOPBACK = "127.0.0.1"

# Per node: (command prefix, listen host).
Placement = Sequence[tuple[Sequence[str], str]]


@dataclass
class Node:
    """One daemon process of a local cluster."""

    index: int
    process: asyncio.subprocess.Process
    log_path: str
    socket: str
    node_id: str = ""
    listen: str = ""
    metrics: str = ""  # HOST:PORT of its Prometheus metrics, if served (--metrics-port)
    args: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        """The daemon's PID (the command prefix execs it, so it is the daemon's own)."""
        return self.process.pid

    @property
    def running(self) -> bool:
        """Has the daemon process not exited (yet)? A stopped (SIGSTOP) one still runs."""
        return self.process.returncode is None


class LocalCluster:
    """``async with LocalCluster(4) as cluster:`` — N daemons on loopback sharing a token."""

    def __init__(self, nodes: int = 4, capacity: str = "2GiB", daemon_args: Sequence[str] = (),
                 log_level: str = "info", workdir: str | None = None,
                 token: bytes | None = None, placement: Placement | None = None,
                 node_args: Mapping[int, Sequence[str]] | None = None,
                 tls: TlsFiles | None = None) -> None:
        if placement is not None and len(placement) < nodes:
            raise InvalidArgumentError(f"placement names {len(placement)} hosts for {nodes} nodes")
        self.placement = [(list(p), h) for p, h in placement] if placement is not None else None
        self.size = nodes
        self.capacity = capacity
        self.daemon_args = list(daemon_args)
        # per daemon, after the shared ones (the last of a repeated option wins): e.g. a
        # --listen and --advertise that put a fault-injecting proxy in front of one node
        self.node_args = {i: list(a) for i, a in (node_args or {}).items()}
        self.log_level = log_level
        self.tls = tls
        self.workdir = workdir or tempfile.mkdtemp(prefix="hoplite-cluster-")
        self._own_workdir = workdir is None
        self.token_file = os.path.join(self.workdir, "token")
        self.nodes: list[Node] = []
        with open(os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                  "wb") as f:
            f.write(token or secrets.token_hex(32).encode())

    async def __aenter__(self) -> LocalCluster:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def sockets(self) -> list[str]:
        """Each daemon's Unix socket, node 0 first: what clients connect to."""
        return [n.socket for n in self.nodes]

    @property
    def seed(self) -> str:
        """Node 0's HOST:PORT, the address the other daemons joined (``--join`` for more)."""
        return self.nodes[0].listen

    async def start(self) -> None:
        """Start the seed, then every other daemon at once, each joining the seed."""
        self.nodes.append(await self.spawn(0, join=None))
        rest = await asyncio.gather(*(self.spawn(i, join=self.seed)
                                      for i in range(1, self.size)), return_exceptions=True)
        for result in rest:
            if isinstance(result, Node):
                self.nodes.append(result)
        for result in rest:
            if isinstance(result, BaseException):
                raise result

    async def spawn(self, index: int, join: str | None,
                    extra_args: Sequence[str] = ()) -> Node:
        """Start daemon ``index`` and wait for its ready line."""
        sock = os.path.join(self.workdir, f"node{index}.sock")
        log_path = os.path.join(self.workdir, f"node{index}.log")
        prefix, host = self.placement[index] if self.placement else ([], LOOPBACK)
        args = [sys.executable, "-m", "hoplited", "--listen", f"{host}:0", "--socket", sock,
                "--capacity", self.capacity, "--token-file", self.token_file,
                "--log-level", self.log_level, *self._tls_args(), *self.daemon_args,
                *self.node_args.get(index, ()), *extra_args]
        if join:
            args += ["--join", join]
        with open(log_path, "ab") as log:
            process = await asyncio.create_subprocess_exec(
                *prefix, *args, stdout=asyncio.subprocess.PIPE, stderr=log,
                stdin=asyncio.subprocess.DEVNULL)
        node = Node(index, process, log_path, sock, args=args)
        try:
            assert process.stdout is not None
            async with asyncio.timeout(READY_TIMEOUT):
                line = await process.stdout.readline()
        except TimeoutError:
            await self._terminate(node)
            raise HopliteTimeoutError(f"daemon {index} not ready within {READY_TIMEOUT}s; "
                                      f"log: {log_path}") from None
        if not line:
            await process.wait()
            raise HopliteError(f"daemon {index} exited with {process.returncode}: "
                               f"{self.log_tail(node)}")
        ready = json.loads(line)
        node.node_id, node.listen = ready["node_id"], ready["listen"]
        node.metrics = ready.get("metrics", "")
        if ready.get("pid", node.pid) != node.pid:  # the prefix forked instead of exec-ing
            os.kill(ready["pid"], signal.SIGTERM)
            await self._terminate(node)
            raise HopliteError(f"daemon {index} runs as pid {ready['pid']}, not as the started "
                               f"pid {node.pid}: the command prefix {prefix} must exec it")
        return node

    def _tls_args(self) -> list[str]:
        tls = self.tls
        return [] if tls is None else ["--tls-cert", tls.cert, "--tls-key", tls.key,
                                       "--tls-ca", tls.ca]

    async def restart(self, index: int) -> Node:
        """Start daemon ``index`` again (after it was stopped or killed), joining a live one."""
        old = self.nodes[index]
        if old.running:
            await self._terminate(old)
        seed = next((n.listen for n in self.nodes if n.running and n.index != index), None)
        node = await self.spawn(index, join=seed)
        self.nodes[index] = node
        return node

    def kill(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to daemon ``index`` (SIGKILL, SIGSTOP, SIGCONT...)."""
        node = self.nodes[index]
        if node.running:
            os.kill(node.pid, sig)

    def log_tail(self, node: Node, lines: int = 20) -> str:
        """The last ``lines`` lines of ``node``'s log ("" if unreadable), for error messages."""
        try:
            with open(node.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    async def _terminate(self, node: Node) -> None:
        if node.running:
            try:
                node.process.send_signal(signal.SIGCONT)
                node.process.terminate()
                async with asyncio.timeout(STOP_GRACE):
                    await node.process.wait()
            except TimeoutError:
                node.process.kill()
                await node.process.wait()
            except ProcessLookupError:
                pass
        await node.process.wait()

    async def stop(self) -> None:
        """Stop every daemon started here and remove the working directory."""
        await asyncio.gather(*(self._terminate(n) for n in self.nodes))
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
