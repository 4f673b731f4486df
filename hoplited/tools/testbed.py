"""Emulated cluster: N network namespaces joined by a private bridge, every link rate-limited.

Loopback has no link bandwidth, so a benchmark on it measures the CPU, not the collective.
A :class:`Testbed` (root only) builds, for a run with the random prefix ``hpl-1a2b3c-``::

    hpl-1a2b3c-br            bridge namespace: bridge ``hpl-1a2b3c-br``, nothing else
    hpl-1a2b3c-h0 .. hN-1    host namespaces: lo + veth ``hpl-1a2b3c-v<i>`` = 198.18.0.<i+1>/15
                             whose peer ``hpl-1a2b3c-p<i>`` is a port of the bridge

Every link is limited to RATE in both directions by a ``tbf`` qdisc on both veth ends (the
host end shapes the uplink, the bridge end the downlink); ``netem`` and fair-queueing qdiscs
do not exist in this kernel (docs/design.md §7). Nothing routes out: the only route in a host
namespace is the connected 198.18.0.0/15 (RFC 2544 benchmarking range).

What a run creates is written to a state file under :data:`STATE_DIR` *before* it is created,
with the creator's PID, so a crashed run is cleaned up by the next one
(:func:`cleanup_leftovers`). Teardown happens on exit, on failure, on Ctrl-C, on SIGTERM (a
handler is installed while the test bed is up, if the application has none) and at
interpreter exit.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import ipaddress
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

from hoplite_client.wire.errors import HopliteError, InvalidArgumentError
from hoplited.tools.local_cluster import LocalCluster

log = logging.getLogger("hoplite.testbed")
T = TypeVar("T")

# Where runs record what they created; /run is a tmpfs, so a reboot (which also drops every
# namespace) leaves no stale record behind.
STATE_DIR = "/run/hoplite-testbed"
# RFC 2544 benchmarking range, the one docs/design.md §7 allows; a /15 holds any test bed we build.
SUBNET = ipaddress.ip_network("198.18.0.0/15")
# docs/design.md §7: the calibrated default is 1 Gbit/s links with jumbo veth (MTU 65000).
DEFAULT_RATE_BPS = 1_000_000_000
DEFAULT_MTU = 65000
# Interface names are at most 15 bytes (IFNAMSIZ - 1): "hpl-" + 6 hex + "-" + "v" + 3 digits.
MAX_NODES = 999
PREFIX_RE = re.compile(r"^hpl-[0-9a-f]{6}-$")
# Our namespaces and nothing else: the cleanup refuses any name not of this form.
NETNS_RE = re.compile(r"^hpl-[0-9a-f]{6}-(br|h[0-9]{1,3})$")
MIN_MTU = 1280  # below this Linux refuses IPv6 and TCP gets silly; no use for a benchmark

# tbf sizing, measured here with one TCP flow over a 2-host test bed (MTU 65000 and 1500):
# a bucket of 2 ms of tokens carries 99% of RATE at 1 and 2 Gbit/s (1 ms: 96%, 0.5 ms: 85%);
# it must also hold at least one 64 KiB GSO packet, or tbf has to split every one of them.
BURST_SECONDS = 0.002
MIN_BURST_BYTES = 64 * 1024
# The FIFO behind the bucket: 10 ms of traffic (enough for several flows sharing one link
# without loss bursts, short enough not to bloat RTTs), and at least four 64 KiB packets.
QUEUE_SECONDS = 0.010
MIN_QUEUE_BYTES = 4 * 64 * 1024

COMMAND_TIMEOUT = 30.0  # one ip/tc batch; namespace creation on a loaded 2-core VM is slow
KILL_GRACE = 5.0  # SIGTERM to SIGKILL for processes left inside our namespaces
CHECK_SECONDS = 2.0  # check_links: long enough that the initial bucket burst is noise
CHECK_MIN_RATIO = 0.7  # check_links fails below this fraction of RATE
CHECK_PORT_TIMEOUT = 20.0  # the receiver helper must print its port within this


class TestbedError(HopliteError):
    """The emulated test bed could not be built, checked or removed."""

    __test__ = False  # not a pytest test class despite the name
    code = "testbed"


class TestbedPermissionError(TestbedError, PermissionError):
    """Building a test bed needs root (network namespaces, veths, qdiscs)."""


# --------------------------------------------------------------------------------------------
# rates


_RATE_UNITS = {"": 1, "bit": 1, "k": 10**3, "kbit": 10**3, "m": 10**6, "mbit": 10**6,
               "g": 10**9, "gbit": 10**9, "t": 10**12, "tbit": 10**12, "kibit": 1 << 10,
               "mibit": 1 << 20, "gibit": 1 << 30, "tibit": 1 << 40}


def parse_rate(text: str) -> int:
    """'1Gbit', '500Mbit', '2gbit', '1.5G', '200000000' → bits per second (SI units, as tc).

    ``bps``/``MB`` are refused: in tc they mean *bytes* per second, an easy factor-8 mistake.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z/]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _RATE_UNITS:
        raise InvalidArgumentError(f"not a link rate: {text!r} (try 1Gbit, 500Mbit, 2gbit)")
    bps = int(float(m.group(1)) * _RATE_UNITS[unit])
    if bps <= 0:
        raise InvalidArgumentError(f"link rate must be positive: {text!r}")
    return bps


def format_rate(bps: float) -> str:
    """1e9 → '1 Gbit/s', 2.5e8 → '250 Mbit/s'."""
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.0f} bit/s"


def tbf_params(rate_bps: int, mtu: int) -> tuple[int, int]:
    """(burst, limit) in bytes for a tbf at ``rate_bps`` on a link of ``mtu``."""
    rate_bytes = rate_bps / 8
    burst = max(int(rate_bytes * BURST_SECONDS), MIN_BURST_BYTES, 2 * (mtu + 14))
    queue = max(int(rate_bytes * QUEUE_SECONDS), MIN_QUEUE_BYTES)
    return burst, burst + queue


# --------------------------------------------------------------------------------------------
# commands


def require_root() -> None:
    """Raise :class:`TestbedPermissionError` unless we are root; :class:`TestbedError` if
    ``ip``/``tc`` are missing."""
    if os.geteuid() != 0:
        raise TestbedPermissionError(
            "the emulated test bed needs root (network namespaces, veth links, tc qdiscs); "
            "run as root, e.g. with sudo")
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        raise TestbedError(f"{' and '.join(missing)} not found: install iproute2")


def _run_sync(argv: Sequence[str], stdin: str = "", check: bool = True) -> str:
    """Run a command to completion (teardown: must not be interrupted by cancellation)."""
    try:
        done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TestbedError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        raise TestbedError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


async def _run(argv: Sequence[str], stdin: str = "") -> str:
    """Run a command (an ``ip``/``tc`` batch during setup); raise TestbedError if it fails."""
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(COMMAND_TIMEOUT):
            out, err = await process.communicate(stdin.encode())
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        raise TestbedError(f"{' '.join(argv)} failed: {err.decode(errors='replace').strip()}"
                           + (f"\ninput:\n{stdin}" if stdin else ""))
    return out.decode()


async def _all(*aws: Awaitable[T]) -> list[T]:
    """Like ``asyncio.gather``, but every awaitable has finished when it raises (the first
    error), so nothing still runs in a namespace that the caller then deletes."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


def netns_list() -> set[str]:
    """Names of every network namespace ``ip netns`` knows."""
    out = _run_sync(["ip", "netns", "list"], check=False)
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def netns_pids(netns: str) -> list[int]:
    """PIDs of the live processes inside namespace ``netns`` (none if it does not exist)."""
    out = _run_sync(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in out.split() if p.isdigit() and int(p) != os.getpid()]


def _signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def kill_inside(namespaces: Sequence[str]) -> list[int]:
    """Stop the processes left in our namespaces (SIGTERM, then SIGKILL); returns their PIDs.

    Only processes whose network namespace is one of ``namespaces`` are touched: things a run
    (or a user of ``hoplite testbed up``) started there.
    """
    found = sorted({pid for ns in namespaces for pid in netns_pids(ns)})
    if not found:
        return []
    log.warning("stopping processes left in the test bed: %s", found)
    _signal_all(found, signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE
    left = found
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = sorted({pid for ns in namespaces for pid in netns_pids(ns)})
    _signal_all(left, signal.SIGKILL)
    return found


def delete_namespaces(namespaces: Sequence[str]) -> None:
    """Delete those of ``namespaces`` that exist (their veths go with them)."""
    ours = [ns for ns in namespaces if NETNS_RE.match(ns)]
    present = netns_list()
    doomed = [ns for ns in ours if ns in present]
    if doomed:
        _run_sync(["ip", "-force", "-batch", "-"], "".join(f"netns del {ns}\n" for ns in doomed),
                  check=False)
    still = set(doomed) & netns_list()
    if still:
        raise TestbedError(f"could not delete namespaces {sorted(still)}")


# --------------------------------------------------------------------------------------------
# state files


def _proc_start_time(pid: int) -> int | None:
    """The start time of ``pid`` (clock ticks since boot), or None if it does not exist; with
    the PID it names one process even after PIDs wrap around."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _creator_alive(state: dict[str, Any]) -> bool:
    pid = state.get("pid")
    if not isinstance(pid, int):
        return False
    started = _proc_start_time(pid)
    return started is not None and started == state.get("pid_start_time")


@contextlib.contextmanager
def _state_lock(state_dir: str) -> Iterator[None]:
    """Serialise leftover cleanup and prefix choice between concurrent runs."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    fd = os.open(os.path.join(state_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        json.dump(data, f, indent=2)
    os.replace(tmp, path)


def read_states(state_dir: str = STATE_DIR) -> list[tuple[str, dict[str, Any]]]:
    """(path, state) of every recorded test bed; unreadable files are reported as empty."""
    try:
        names = sorted(n for n in os.listdir(state_dir) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    states = []
    for name in names:
        path = os.path.join(state_dir, name)
        try:
            with open(path) as f:
                state = json.load(f)
        except (OSError, ValueError):
            state = {}
        states.append((path, state if isinstance(state, dict) else {}))
    return states


def remove_recorded(path: str, state: dict[str, Any]) -> None:
    """Remove what one state file records (processes inside, namespaces), then the file."""
    namespaces = [ns for ns in state.get("namespaces", []) if isinstance(ns, str)]
    kill_inside(namespaces)
    delete_namespaces(namespaces)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _cleanup_leftovers_locked(state_dir: str, include_live: bool,
                              include_persistent: bool) -> list[str]:
    removed = []
    for path, state in read_states(state_dir):
        if state.get("persistent") and not include_persistent:
            continue
        if _creator_alive(state) and not include_live:
            continue
        log.info("removing test bed %s (creator pid %s)", state.get("prefix", path),
                 state.get("pid"))
        remove_recorded(path, state)
        removed.append(str(state.get("prefix") or os.path.basename(path)))
    return removed


def cleanup_leftovers(state_dir: str = STATE_DIR, include_live: bool = False,
                      include_persistent: bool = False) -> list[str]:
    """Remove test beds whose creator is dead (a crashed run); returns their prefixes.

    ``include_persistent`` also removes those made by ``hoplite testbed up`` (which exits on
    purpose); ``include_live`` also those whose creator still runs. Only namespaces recorded in
    a state file, and named like ours, are ever deleted.
    """
    require_root()
    with _state_lock(state_dir):
        return _cleanup_leftovers_locked(state_dir, include_live, include_persistent)


# --------------------------------------------------------------------------------------------
# the test bed


@dataclass(frozen=True)
class Host:
    """One emulated host: its namespace, address and interface."""

    index: int
    netns: str
    ip: str
    ifname: str  # the veth end inside ``netns``
    bridge_port: str  # its peer, a port of the bridge in the bridge namespace


@dataclass(frozen=True)
class LinkMeasurement:
    """One TCP stream of :meth:`Testbed.check_links`: ``src`` uplink → ``dst`` downlink."""

    src: int
    dst: int
    bytes: int
    seconds: float

    @property
    def bps(self) -> float:
        """The stream's throughput in bit/s (0 if it took no time)."""
        return self.bytes * 8 / self.seconds if self.seconds > 0 else 0.0


def host_address(index: int) -> str:
    """The address of host ``index``: 198.18.0.1, 198.18.0.2, ... (a /15 prefix)."""
    return str(SUBNET.network_address + index + 1)


class Testbed:
    """``async with Testbed(nodes, rate_bps, mtu=65000) as tb:`` — an emulated cluster.

    ``tb.hosts[i]`` has the namespace name and IP of host i; ``tb.exec_prefix(i) + argv``
    runs ``argv`` inside it. ``persistent=True`` (``hoplite testbed up``) keeps the test bed
    after the process exits, until :func:`cleanup_leftovers` with ``include_persistent``.
    """

    __test__ = False  # not a pytest test class despite the name

    def __init__(self, nodes: int, rate_bps: int = DEFAULT_RATE_BPS, mtu: int = DEFAULT_MTU, *,
                 persistent: bool = False, state_dir: str = STATE_DIR) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise InvalidArgumentError(f"a test bed has 1 to {MAX_NODES} hosts, not {nodes}")
        if rate_bps <= 0:
            raise InvalidArgumentError(f"link rate must be positive, not {rate_bps}")
        if not MIN_MTU <= mtu <= 65535:
            raise InvalidArgumentError(f"MTU must be within {MIN_MTU}..65535, not {mtu}")
        self.size = nodes
        self.rate_bps = int(rate_bps)
        self.mtu = mtu
        self.persistent = persistent
        self.state_dir = state_dir
        self.prefix = ""
        self.hosts: list[Host] = []
        self.state_path = ""
        self._up = False
        self._sigterm_task: asyncio.Task[Any] | None = None
        self._got_sigterm = False

    # -- names

    @property
    def bridge_netns(self) -> str:
        """The namespace holding the bridge (the bridge device has the same name)."""
        return f"{self.prefix}br"

    @property
    def namespaces(self) -> list[str]:
        """Every namespace of this test bed, hosts first, the bridge last."""
        return [h.netns for h in self.hosts] + [self.bridge_netns]

    @property
    def subnet(self) -> str:
        """The test bed's subnet, e.g. for MPI's ``btl_tcp_if_include``."""
        return str(SUBNET)

    def exec_prefix(self, index: int) -> list[str]:
        """``["ip", "netns", "exec", NAME]``: prepend to a command to run it in host ``index``.

        ``ip netns exec`` execs the command (no fork), so the PID of the started process is
        the command's own.
        """
        return ["ip", "netns", "exec", self.hosts[index].netns]

    def placement(self) -> list[tuple[list[str], str]]:
        """(exec prefix, address) per host, as :class:`LocalCluster` takes it."""
        return [(self.exec_prefix(h.index), h.ip) for h in self.hosts]

    # -- lifecycle

    async def __aenter__(self) -> Testbed:
        await self.up()
        self._catch_sigterm()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        terminated = self._release_sigterm()
        self.down()
        if terminated and exc_type is asyncio.CancelledError:
            raise SystemExit(128 + signal.SIGTERM)  # as if SIGTERM had killed us, but clean

    async def up(self) -> None:
        """Create the namespaces, bridge, links and qdiscs (tearing down on any failure)."""
        require_root()
        if self._up:
            raise TestbedError(f"test bed {self.prefix} is already up")
        self._reserve()
        atexit.register(self.down)
        self._up = True
        try:
            await self._create()
        except BaseException:
            self.down()
            raise
        if self.persistent:  # recorded as such only once complete: a half-built one is a leftover
            atexit.unregister(self.down)
            _write_json(self.state_path, self.state())

    def _reserve(self) -> None:
        """Clean dead runs' leftovers, pick an unused prefix, record what we will create."""
        with _state_lock(self.state_dir):
            _cleanup_leftovers_locked(self.state_dir, False, False)
            taken = netns_list()
            while True:
                prefix = f"hpl-{secrets.token_hex(3)}-"
                path = os.path.join(self.state_dir, f"{prefix}.json")
                if not os.path.exists(path) and not any(n.startswith(prefix) for n in taken):
                    break
            self.prefix, self.state_path = prefix, path
            self.hosts = [Host(i, f"{prefix}h{i}", host_address(i), f"{prefix}v{i}",
                               f"{prefix}p{i}") for i in range(self.size)]
            _write_json(path, self.state())

    def state(self) -> dict[str, Any]:
        """The record kept in the state file (also what ``hoplite testbed up`` prints)."""
        return {"prefix": self.prefix, "pid": os.getpid(),
                "pid_start_time": _proc_start_time(os.getpid()),
                "persistent": self.persistent and self._up, "created": time.time(),
                "nodes": self.size, "rate_bps": self.rate_bps, "mtu": self.mtu,
                "subnet": self.subnet, "namespaces": self.namespaces,
                "hosts": [asdict(h) for h in self.hosts]}

    async def _create(self) -> None:
        burst, limit = tbf_params(self.rate_bps, self.mtu)
        tbf = f"root tbf rate {self.rate_bps}bit burst {burst} limit {limit}"
        await _run(["ip", "-batch", "-"], self._root_batch())
        await _run(["ip", "-n", self.bridge_netns, "-batch", "-"], self._bridge_batch())
        await _all(*(_run(["ip", "-n", h.netns, "-batch", "-"], self._host_batch(h))
                     for h in self.hosts))
        await _run(["tc", "-n", self.bridge_netns, "-batch", "-"],
                   "".join(f"qdisc add dev {h.bridge_port} {tbf}\n" for h in self.hosts))
        await _all(*(_run(["tc", "-n", h.netns, "-batch", "-"], f"qdisc add dev {h.ifname} {tbf}\n")
                     for h in self.hosts))
        log.info("test bed %s up: %d hosts, %s links, MTU %d", self.prefix, self.size,
                 format_rate(self.rate_bps), self.mtu)

    def _root_batch(self) -> str:
        """Namespaces, and each veth created directly with its ends in place (so a crash
        never leaves an interface in the root namespace)."""
        lines = [f"netns add {ns}" for ns in self.namespaces]
        lines += [f"link add {h.ifname} netns {h.netns} mtu {self.mtu} type veth peer name "
                  f"{h.bridge_port} netns {self.bridge_netns} mtu {self.mtu}" for h in self.hosts]
        return "\n".join(lines) + "\n"

    def _bridge_batch(self) -> str:
        br = self.bridge_netns  # the bridge device is named like its namespace
        lines = ["link set lo up", f"link add {br} mtu {self.mtu} type bridge",
                 f"link set {br} addrgenmode none", f"link set {br} up"]
        for h in self.hosts:  # addrgenmode first: no IPv6 link-local chatter on the links
            lines += [f"link set {h.bridge_port} addrgenmode none",
                      f"link set {h.bridge_port} master {br} up"]
        return "\n".join(lines) + "\n"

    def _host_batch(self, host: Host) -> str:
        return (f"link set lo up\n"
                f"addr add {host.ip}/{SUBNET.prefixlen} dev {host.ifname}\n"
                f"link set {host.ifname} addrgenmode none\n"
                f"link set {host.ifname} up\n")

    async def partition(self, groups: Sequence[Sequence[int]], heal: bool = False) -> None:
        """Cut the hosts of each group off from the other groups' hosts (``heal``: join them
        again): blackhole routes in their namespaces drop whatever crosses between groups, in
        both directions, and nothing else (docs/design.md §5, "Partitions heal")."""
        op = "del" if heal else "add"
        batches: dict[int, str] = {}
        for group in groups:
            others = [j for other in groups if other is not group for j in other]
            for i in group:
                batches[i] = "".join(f"route {op} blackhole {self.hosts[j].ip}/32\n"
                                     for j in others)
        await _all(*(_run(["ip", "-n", self.hosts[i].netns, "-batch", "-"], batch)
                     for i, batch in batches.items() if batch))

    def down(self) -> None:
        """Remove everything this test bed created (idempotent; blocking, so that a second
        Ctrl-C cannot cut it short)."""
        if not self._up:
            return
        self._up = False
        atexit.unregister(self.down)
        remove_recorded(self.state_path, {"namespaces": self.namespaces})
        log.info("test bed %s removed", self.prefix)

    def _catch_sigterm(self) -> None:
        """While up, make SIGTERM cancel the task that entered (so ``__aexit__`` cleans up),
        unless the application handles SIGTERM itself."""
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        task = asyncio.current_task()
        if task is None:
            return
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._on_sigterm)
        except (RuntimeError, ValueError, NotImplementedError):  # not the main thread
            return
        self._sigterm_task = task

    def _on_sigterm(self) -> None:
        log.warning("SIGTERM: removing test bed %s", self.prefix)
        self._got_sigterm = True
        if self._sigterm_task is not None:
            self._sigterm_task.cancel()

    def _release_sigterm(self) -> bool:
        """Remove our SIGTERM handler; True if SIGTERM arrived while it was in place."""
        if self._sigterm_task is not None:
            self._sigterm_task = None
            with contextlib.suppress(RuntimeError, ValueError):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)
        return self._got_sigterm

    # -- link check

    async def check_links(self, pairs: Sequence[tuple[int, int]] | None = None,
                          seconds: float = CHECK_SECONDS,
                          min_ratio: float = CHECK_MIN_RATIO) -> list[LinkMeasurement]:
        """Measure with plain TCP that links carry about RATE; return one result per stream.

        ``pairs`` are (sender, receiver) host indices, measured at the same time; by default
        a ring i → i+1, which loads every uplink and every downlink exactly once. Raises
        :class:`TestbedError` if a stream gets less than ``min_ratio`` of RATE.
        """
        if pairs is None:
            pairs = [(i, (i + 1) % self.size) for i in range(self.size)] if self.size > 1 else []
        for src, dst in pairs:
            if src == dst or not (0 <= src < self.size and 0 <= dst < self.size):
                raise InvalidArgumentError(f"bad link pair ({src}, {dst})")
        results = await _all(*(self._measure(s, d, seconds) for s, d in pairs))
        slow = [r for r in results if r.bps < min_ratio * self.rate_bps]
        if slow:
            raise TestbedError(
                "links slower than configured " + format_rate(self.rate_bps) + ": " +
                ", ".join(f"h{r.src}→h{r.dst} {format_rate(r.bps)}" for r in slow))
        return results

    async def _measure(self, src: int, dst: int, seconds: float) -> LinkMeasurement:
        async with contextlib.AsyncExitStack() as stack:
            receiver = await stack.enter_async_context(helper_process(
                self.exec_prefix(dst) + [sys.executable, "-c", _RECEIVER, self.hosts[dst].ip,
                                         str(seconds + COMMAND_TIMEOUT)]))
            assert receiver.stdout is not None
            async with asyncio.timeout(CHECK_PORT_TIMEOUT):
                port = await receiver.stdout.readline()
            if not port.strip().isdigit():
                raise TestbedError(f"link check receiver in h{dst} failed to start")
            sender = await stack.enter_async_context(helper_process(
                self.exec_prefix(src) + [sys.executable, "-c", _SENDER, self.hosts[dst].ip,
                                         port.decode().strip(), str(seconds)]))
            timeout = seconds + COMMAND_TIMEOUT
            async with asyncio.timeout(timeout):
                out, _ = await receiver.communicate()
            async with asyncio.timeout(timeout):
                await sender.wait()
        try:
            report = json.loads(out)
        except ValueError:
            raise TestbedError(f"link check h{src}→h{dst} failed: sender exit "
                               f"{sender.returncode}, receiver said {out!r}") from None
        return LinkMeasurement(src, dst, int(report["bytes"]), float(report["seconds"]))


@contextlib.asynccontextmanager
async def helper_process(argv: Sequence[str], cwd: str | None = None
                         ) -> AsyncIterator[asyncio.subprocess.Process]:
    """A helper process (its stdout piped), killed by its PID if still running when the
    block ends."""
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE)
    try:
        yield process
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await process.wait()


# The link check's two ends, run with ``python -c`` inside the namespaces. The receiver
# counts from the end of its first read, so connection setup and the bucket's initial burst
# hardly count; it stops at the sender's EOF.
_RECEIVER = """
import json, socket, sys, time
srv = socket.socket()
srv.bind((sys.argv[1], 0))
srv.listen(1)
srv.settimeout(float(sys.argv[2]))
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.settimeout(float(sys.argv[2]))
view = memoryview(bytearray(1 << 20))
total, t0 = 0, None
while True:
    n = conn.recv_into(view)
    if not n:
        break
    if t0 is None:
        t0 = time.perf_counter()
    else:
        total += n
print(json.dumps({"bytes": total, "seconds": time.perf_counter() - (t0 or 0)}), flush=True)
"""

_SENDER = """
import socket, sys, time
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])))
block = bytes(1 << 20)
end = time.perf_counter() + float(sys.argv[3])
while time.perf_counter() < end:
    conn.sendall(block)
conn.close()
"""


# --------------------------------------------------------------------------------------------
# daemons in the test bed


class EmulatedCluster(LocalCluster):
    """A :class:`LocalCluster` whose daemon i runs in host i of ``testbed``."""

    def __init__(self, testbed: Testbed, **kwargs: Any) -> None:
        super().__init__(testbed.size, placement=testbed.placement(), **kwargs)
        self.testbed = testbed


@contextlib.asynccontextmanager
async def emulated_cluster(nodes: int, rate_bps: int = DEFAULT_RATE_BPS,
                           capacity: str = "2GiB", mtu: int = DEFAULT_MTU, check: bool = False,
                           **kwargs: Any) -> AsyncIterator[EmulatedCluster]:
    """A started cluster of ``nodes`` daemons, each in its own host of a fresh :class:`Testbed`
    with ``rate_bps`` links; ``cluster.testbed`` is the test bed (for baselines in the same
    run). ``check=True`` runs :meth:`Testbed.check_links` first. Other keyword arguments go to
    :class:`LocalCluster`. Daemons stop, then the test bed goes, when the block ends.
    """
    async with Testbed(nodes, rate_bps, mtu) as testbed:
        if check:
            await testbed.check_links()
        cluster = EmulatedCluster(testbed, capacity=capacity, **kwargs)
        async with cluster:
            yield cluster
