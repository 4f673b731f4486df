"""A soak: a mixed workload at twice the store's capacity for a while, then the health checks.

``hoplite soak`` / ``make soak`` (docs/operations.md, "Soak"). A local cluster with small
stores runs puts, broadcasts (gets of one object on several nodes), reduces, deletes and
clients that disconnect in the middle of a get, from several clients per node at once. The
workload keeps up to ``pressure`` times one store's capacity of objects alive, and broadcasts
copy them to every node, so each store sees more than it can hold: only eviction of copies
that exist elsewhere, or a ``CapacityError``, lets a put through. Every result is checked.

Passing means: every daemon still runs; its resident memory stayed within its capacity plus
a small constant above its idle size; no error but ``CapacityError`` reached the workload;
once the workload deleted its objects and its clients left, every store, shard and transfer
table is empty again (the arena back at its baseline); no traceback in any daemon's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

import hoplite_client
from hoplite_client.wire.errors import CapacityError, HopliteError, InvalidArgumentError
from hoplite_client.wire.ids import ObjectID
from hoplited.tools.local_cluster import LocalCluster

MiB = 1 << 20
INLINE_SIZE = 16 * 1024  # small objects: carried inline by the directory, no data transfer
OP_TIMEOUT = 60.0  # generous: the machine running the soak is loaded
SAMPLE_EVERY = 1.0  # seconds between two memory samples of every daemon
SETTLE_TIMEOUT = 60.0  # after the workload: how long the daemons may take to become empty
ALLOWED_ERRORS = ("CapacityError",)
# How often each kind of step is chosen, out of the total.
WEIGHTS = {"put": 30, "broadcast": 30, "reduce": 12, "delete": 14, "drop_mid_get": 8,
           "drop_holding_view": 6}


@dataclass(frozen=True)
class SoakSettings:
    """What the soak runs: the cluster, how long, and how hard."""

    nodes: int = 3
    capacity: int = 64 * MiB
    duration: float = 120.0
    workers: int = 2  # per node; each has a client on every node
    max_object: int = 4 * MiB
    pressure: float = 2.0  # live objects, in units of one store's capacity
    rss_slack: int = 128 * MiB  # allowed above idle RSS + capacity
    leak_slack: int = 32 * MiB  # allowed growth of anonymous memory after the warm-up
    seed: int = 0

    def check(self) -> None:
        """Refuse settings the soak cannot run with."""
        if self.nodes < 2:
            raise InvalidArgumentError("a soak needs at least 2 nodes")
        if not self.duration > 0 or self.workers < 1:
            raise InvalidArgumentError("the soak needs a positive duration and workers")
        if not 64 * 1024 < self.max_object <= self.capacity // 4:
            raise InvalidArgumentError("objects must be above 64 KiB and at most a quarter of "
                                       "the capacity, so several fit in one store")
        if not self.pressure > 0:
            raise InvalidArgumentError("pressure must be positive")


@dataclass
class Memory:
    """Resident memory of one daemon (bytes): when idle, the peak, anonymous after warm-up."""

    idle_rss: int = 0
    peak_rss: int = 0
    warm_anon: int = 0
    end_anon: int = 0


@dataclass
class SoakReport:
    """What the soak did and whether the daemons came through it."""

    settings: SoakSettings
    seconds: float = 0.0
    steps: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: list[str] = field(default_factory=list)
    bytes_put: int = 0
    bytes_checked: int = 0
    memory: list[Memory] = field(default_factory=list)
    evictions: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        """The report as text, one fact per line."""
        s = self.settings
        out = [f"soak: {s.nodes} nodes x {s.capacity / MiB:.0f} MiB, {s.workers} workers per "
               f"node, {self.seconds:.0f} s, live objects up to {s.pressure:g}x a store",
               "steps: " + ", ".join(f"{k} {v}" for k, v in sorted(self.steps.items())),
               f"bytes put {self.bytes_put / MiB:.0f} MiB, checked {self.bytes_checked / MiB:.0f}"
               f" MiB",
               "errors: " + (", ".join(f"{k} {v}" for k, v in sorted(self.errors.items()))
                             or "none")]
        for i, m in enumerate(self.memory):
            out.append(f"node {i}: RSS idle {m.idle_rss / MiB:.0f} MiB, peak "
                       f"{m.peak_rss / MiB:.0f} MiB (limit "
                       f"{(m.idle_rss + s.capacity + s.rss_slack) / MiB:.0f}), anonymous "
                       f"{m.warm_anon / MiB:.0f} -> {m.end_anon / MiB:.0f} MiB"
                       + (f", evictions {self.evictions[i]}" if i < len(self.evictions) else ""))
        out.extend(f"sample error: {e}" for e in self.error_samples)
        out.append("PASSED" if self.ok else "FAILED:\n  " + "\n  ".join(self.problems))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"settings": vars(self.settings), "seconds": self.seconds,
                "steps": dict(self.steps), "errors": dict(self.errors),
                "bytes_put": self.bytes_put, "bytes_checked": self.bytes_checked,
                "memory": [vars(m) for m in self.memory], "evictions": self.evictions,
                "problems": self.problems, "ok": self.ok}


def values(tag: int, elements: int) -> NDArray[np.float32]:
    """An object's contents: exact in float32 (below 2**24), distinct per tag."""
    return np.arange(elements, dtype=np.float32) + np.float32(tag % 1024)


@dataclass
class Live:
    """One object the workload put and has not deleted."""

    tag: int
    elements: int
    users: int = 0

    @property
    def size(self) -> int:
        return self.elements * 4


class Pool:
    """The workload's live objects, oldest first, with use counts: the workload never deletes
    an object one of its own steps is reading, so any error it sees is the daemon's."""

    def __init__(self) -> None:
        self.objects: OrderedDict[ObjectID, Live] = OrderedDict()

    @property
    def size(self) -> int:
        return sum(o.size for o in self.objects.values())

    def add(self, oid: ObjectID, live: Live) -> None:
        self.objects[oid] = live

    def borrow(self, rng: random.Random) -> tuple[ObjectID, Live] | None:
        if not self.objects:
            return None
        oid = rng.choice(list(self.objects))
        live = self.objects[oid]
        live.users += 1
        return oid, live

    def give_back(self, live: Live) -> None:
        live.users -= 1

    def take_unused(self, oldest: bool, rng: random.Random) -> ObjectID | None:
        """Remove an object nobody reads (the oldest, or any) so it can be deleted."""
        idle = [oid for oid, o in self.objects.items() if o.users == 0]
        if not idle:
            return None
        oid = idle[0] if oldest else rng.choice(idle)
        del self.objects[oid]
        return oid


def rss(pid: int) -> tuple[int, int]:
    """(VmRSS, RssAnon) of a process, in bytes (0, 0 once it is gone)."""
    found = {"VmRSS": 0, "RssAnon": 0}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in found:
                    found[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return found["VmRSS"], found["RssAnon"]


class Workload:
    """The soak's clients and steps; errors and wrong results land in the report."""

    def __init__(self, settings: SoakSettings, cluster: LocalCluster, report: SoakReport) -> None:
        self.s = settings
        self.cluster = cluster
        self.report = report
        self.pool = Pool()
        self.tags = 0
        self.clients: list[list[hoplite_client.Client]] = []  # per worker: one per node

    def _tag(self) -> int:
        self.tags += 1
        return self.tags

    def _size(self, rng: random.Random) -> int:
        """Mostly shared-memory objects, log-uniform in size; a few inline ones."""
        if rng.random() < 0.1:
            return rng.randrange(4, INLINE_SIZE, 4)
        low, high = math.log(128 * 1024), math.log(self.s.max_object)
        return int(math.exp(rng.uniform(low, high))) // 4 * 4

    def _fail(self, exc: HopliteError, what: str) -> None:
        name = type(exc).__name__
        self.report.errors[name] += 1
        if name not in ALLOWED_ERRORS and len(self.report.error_samples) < 10:
            self.report.error_samples.append(f"{what}: {name}: {exc}")

    def _check(self, got: NDArray[Any], want: NDArray[Any], what: str) -> None:
        if got.shape != want.shape or not np.array_equal(got, want):
            self.report.problems.append(f"wrong bytes: {what}")
        else:
            self.report.bytes_checked += got.nbytes

    async def _delete(self, client: hoplite_client.Client, oid: ObjectID) -> None:
        try:
            await client.delete(oid)
        except HopliteError as exc:
            self._fail(exc, "delete")

    async def _make_room(self, client: hoplite_client.Client, rng: random.Random,
                         need: int) -> None:
        """Delete the oldest objects nobody reads until ``need`` more bytes stay in bounds."""
        budget = self.s.pressure * self.s.capacity
        while self.pool.size + need > budget:
            oid = self.pool.take_unused(oldest=True, rng=rng)
            if oid is None:
                return
            await self._delete(client, oid)

    async def put(self, rng: random.Random, clients: list[hoplite_client.Client]) -> None:
        client = rng.choice(clients)
        size = self._size(rng)
        await self._make_room(client, rng, size)
        live = Live(self._tag(), size // 4)
        try:
            oid = await client.put(values(live.tag, live.elements))
        except CapacityError as exc:  # the store is full of objects only it holds
            self._fail(exc, "put")
            oid_ = self.pool.take_unused(oldest=True, rng=rng)
            if oid_ is not None:
                await self._delete(client, oid_)
            return
        self.pool.add(oid, live)
        self.report.bytes_put += live.size

    async def broadcast(self, rng: random.Random, clients: list[hoplite_client.Client]) -> None:
        picked = self.pool.borrow(rng)
        if picked is None:
            return
        oid, live = picked
        try:
            getters = rng.sample(clients, rng.randint(1, len(clients)))
            want = values(live.tag, live.elements)
            results = await asyncio.gather(*(c.get(oid, timeout=OP_TIMEOUT) for c in getters),
                                           return_exceptions=True)
            for r in results:
                if isinstance(r, HopliteError):
                    self._fail(r, "get")
                elif isinstance(r, BaseException):
                    raise r
                else:
                    self._check(r, want, f"get of {oid.short()}")
            del results
        finally:
            self.pool.give_back(live)

    async def reduce(self, rng: random.Random, clients: list[hoplite_client.Client]) -> None:
        k = rng.randint(2, len(clients))
        holders = rng.sample(clients, k)
        elements = self._size(rng) // 4 or 1
        tags = [self._tag() for _ in holders]
        inputs: list[tuple[hoplite_client.Client, ObjectID]] = []
        root = rng.choice(clients)
        result: ObjectID | None = None
        try:
            for client, tag in zip(holders, tags, strict=True):
                inputs.append((client, await client.put(values(tag, elements))))
            result = await root.reduce([oid for _, oid in inputs], "sum", timeout=OP_TIMEOUT)
            got = await root.get(result, timeout=OP_TIMEOUT)
            want = sum((values(t, elements) for t in tags[1:]), values(tags[0], elements))
            self._check(got, want, f"reduce of {k} inputs")
            del got
        except HopliteError as exc:
            self._fail(exc, f"reduce into {result.short() if result else '-'} of "
                            f"{[oid.short() for _, oid in inputs]}")
        finally:
            for client, oid in inputs:
                await self._delete(client, oid)
            if result is not None:
                await self._delete(root, result)

    async def delete(self, rng: random.Random, clients: list[hoplite_client.Client]) -> None:
        oid = self.pool.take_unused(oldest=False, rng=rng)
        if oid is not None:
            await self._delete(rng.choice(clients), oid)

    async def drop_mid_get(self, rng: random.Random, clients: list[hoplite_client.Client]
                           ) -> None:
        """A client that leaves while its get is under way (or still waits for the object to
        exist): the daemon must cancel the get and keep nothing of it."""
        picked = self.pool.borrow(rng) if rng.random() < 0.8 else None
        oid = picked[0] if picked else ObjectID.random()  # never put: the get waits
        try:
            leaver = await hoplite_client.connect(rng.choice(self.cluster.sockets))
            get = asyncio.ensure_future(leaver.get(oid, timeout=OP_TIMEOUT))
            await asyncio.sleep(rng.uniform(0.0, 0.05))
            await leaver.close()
            with contextlib.suppress(HopliteError):  # lost with the connection, as it should
                await get  # an array, if it came first: unusable now, dropped unread
        finally:
            if picked:
                self.pool.give_back(picked[1])

    async def drop_holding_view(self, rng: random.Random,
                                clients: list[hoplite_client.Client]) -> None:
        """A client that leaves while it holds a view: the daemon frees its pin at once."""
        picked = self.pool.borrow(rng)
        if picked is None:
            return
        oid, live = picked
        try:
            leaver = await hoplite_client.connect(rng.choice(self.cluster.sockets))
            try:
                view = await leaver.get(oid, timeout=OP_TIMEOUT)
                self._check(view, values(live.tag, live.elements), f"view of {oid.short()}")
            finally:
                await leaver.close()
            del view  # after the close: the daemon saw no release for it
        finally:
            self.pool.give_back(live)

    async def worker(self, index: int, clients: list[hoplite_client.Client],
                     deadline: float) -> None:
        """Random steps, by their weights, until the deadline."""
        rng = random.Random(self.s.seed * 1009 + index)
        steps: dict[str, Callable[[random.Random, list[hoplite_client.Client]],
                                  Awaitable[None]]] = {
            "put": self.put, "broadcast": self.broadcast, "reduce": self.reduce,
            "delete": self.delete, "drop_mid_get": self.drop_mid_get,
            "drop_holding_view": self.drop_holding_view}
        kinds, weights = list(WEIGHTS), list(WEIGHTS.values())
        while time.monotonic() < deadline:
            kind = rng.choices(kinds, weights)[0]
            self.report.steps[kind] += 1
            try:
                await steps[kind](rng, clients)
            except HopliteError as exc:
                self._fail(exc, kind)

    async def watch(self, stop: asyncio.Event, warm_at: float) -> None:
        """Sample every daemon's memory until ``stop``; anonymous memory at ``warm_at`` is the
        reference a leak would grow from."""
        warmed = False
        while not stop.is_set():
            now = time.monotonic()
            for node, mem in zip(self.cluster.nodes, self.report.memory, strict=True):
                total, anon = rss(node.pid)
                mem.peak_rss = max(mem.peak_rss, total)
                if not warmed and now >= warm_at:
                    mem.warm_anon = anon
            warmed = warmed or now >= warm_at
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SAMPLE_EVERY):
                    await stop.wait()


async def run_soak(settings: SoakSettings, workdir: str | None = None) -> SoakReport:
    """Start a local cluster, run the workload for ``settings.duration``, check the daemons.
    ``workdir``: where the daemons' sockets and logs go, kept afterwards (default: removed)."""
    settings.check()
    report = SoakReport(settings)
    async with LocalCluster(settings.nodes, capacity=str(settings.capacity),
                            workdir=workdir) as cluster:
        report.memory = [Memory(idle_rss=rss(n.pid)[0]) for n in cluster.nodes]
        workload = Workload(settings, cluster, report)
        clients = [[await hoplite_client.connect(sock) for sock in cluster.sockets]
                   for _ in range(settings.nodes * settings.workers)]
        stop = asyncio.Event()
        start = time.monotonic()
        watcher = asyncio.ensure_future(workload.watch(stop, start + settings.duration / 10))
        try:
            await asyncio.gather(*(workload.worker(i, c, start + settings.duration)
                                   for i, c in enumerate(clients)))
            report.seconds = time.monotonic() - start
            for oid in list(workload.pool.objects):
                await workload._delete(clients[0][0], oid)
        finally:
            for row in clients:
                for client in row:
                    await client.close()
            stop.set()
            await watcher
        await _settle(cluster, report)
        _judge(cluster, report)
    return report


def _leftovers(info: dict[str, Any], own_clients: int) -> dict[str, int]:
    """What a daemon still holds that a finished workload should have left behind (beyond
    ``own_clients``: the client asking)."""
    store, shard = info.get("store", {}), info.get("directory", {})
    found = {"objects": store.get("objects", 0), "arena_used": store.get("arena_used", 0),
             "pinned_deleted": store.get("pinned_deleted", 0),
             "directory_entries": shard.get("entries", 0),
             "waiting_gets": shard.get("waiting_gets", 0),
             "transfers": info.get("transfers_count", 0),
             "reduce_tasks": info.get("reduce_tasks", 0),
             "clients": info.get("clients", 0) - own_clients}
    return {k: v for k, v in found.items() if v}


async def _settle(cluster: LocalCluster, report: SoakReport) -> None:
    """Wait for every daemon to hold nothing; what remains after SETTLE_TIMEOUT is a problem."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    async with await hoplite_client.connect(cluster.sockets[0]) as client:
        while True:
            infos = (await client.status())["nodes"]
            left = {i: found for i, info in enumerate(infos)
                    if (found := _leftovers(info, 1 if i == 0 else 0))}
            if not left or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        report.evictions = [info.get("store", {}).get("evictions", 0) for info in infos]
    report.problems.extend(f"node {i} still holds {what} after the workload"
                           for i, what in left.items())


def _judge(cluster: LocalCluster, report: SoakReport) -> None:
    """Memory bounds, unexpected errors, daemons alive, no traceback: problems if not."""
    s = report.settings
    for node, mem in zip(cluster.nodes, report.memory, strict=True):
        if not node.running:
            report.problems.append(f"node {node.index} exited with {node.process.returncode}")
            continue
        mem.end_anon = rss(node.pid)[1]
        if mem.peak_rss > mem.idle_rss + s.capacity + s.rss_slack:
            report.problems.append(f"node {node.index}: RSS peaked at {mem.peak_rss / MiB:.0f}"
                                   f" MiB, above idle + capacity + {s.rss_slack / MiB:.0f} MiB")
        if mem.end_anon > mem.warm_anon + s.leak_slack:
            report.problems.append(f"node {node.index}: anonymous memory grew from "
                                   f"{mem.warm_anon / MiB:.0f} to {mem.end_anon / MiB:.0f} MiB")
        with open(node.log_path, errors="replace") as f:
            if "Traceback" in f.read():
                report.problems.append(f"a traceback in node {node.index}'s log")
    unexpected = {k: v for k, v in report.errors.items() if k not in ALLOWED_ERRORS}
    if unexpected:
        report.problems.append(f"errors other than {', '.join(ALLOWED_ERRORS)}: {unexpected}")
    missing = [k for k in WEIGHTS if not report.steps[k]]
    if missing:
        report.problems.append(f"steps never run: {missing}")
