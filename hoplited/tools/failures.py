"""Failure runs: one collective while a node is killed (SIGKILL) or silenced (SIGSTOP).

``hoplite bench OP --kill-node I --kill-after S [--signal KILL|STOP]`` first measures OP
failure-free (the ordinary scenarios), then runs it once more and, ``S`` seconds after the
clock starts, sends the signal to node ``I``'s daemon. Every survivor's outcome is recorded:
the time it held its checked result, or the typed error it got. The victim's own client is
not a participant (its daemon is gone or frozen). For reduce, allreduce and gather the
victim's input is lost with it; as a task framework restarts the task that made it, the run
puts the same input again, under the same id, on the next survivor (retrying while the
directory still counts the old copy as live): for a SIGKILL, by default
(``reput="noticed"``) once the application could know of the death, when the killed
daemon's own client sees its connection close; ``reput="at-signal"`` puts it again right
after the signal, which no application can see. A silenced or cut-off node shows a client
nothing before the cluster's verdict, which the put itself meets (refused while the lost copy
is trusted), so there the put is tried from the signal on. With ``--backup`` (reduce and
allreduce: then a reduce of N of the N+1 inputs that every node gets, where without a backup
the allreduce is ``allreduce()`` as in the failure-free runs), the reduce instead has one
input beyond the first N, a *backup* of another value
(the input of an N+1-th node) that the next survivor puts as the clock starts, after the
reduce chose its N inputs (a straggler, ready by the time the node dies): the backup takes
the lost slot and the result is checked against the sum it makes. The figure of merit is the
last survivor's time over the failure-free median (docs/design.md §5, §8: at most 1.5 for
SIGKILL).

Broadcast also takes node 0, the object's original holder, as the victim: node 1 first gets a
whole copy (untimed), then nodes 2.. receive while node 0 dies; the failure-free runs of that
case are the same shape without the signal. ``--victim-owns`` picks the ids so that the
victim's directory shard owns the one that matters (the broadcast object, the victim's input):
the hardest placement, where the silent or dead node is also the id's owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from numpy.typing import NDArray

import hoplite_client
from hoplite_client.wire.errors import HopliteError, InvalidArgumentError
from hoplited.cluster.membership import rendezvous_owner
from hoplited.tools.local_cluster import LocalCluster
from hoplited.tools.scenarios import BenchContext, reduced_ok, same_bytes
from hoplited.tools.testbed import EmulatedCluster

# A survivor that has nothing after this long counts as hung: the run must end.
FAILURE_TIMEOUT = 120.0
SIGNALS = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP}
# How often a refused re-put is tried again.
REPUT_POLL = 0.1
# The data index of the object broadcast beside the op (``run_with_failure(beside=True)``):
# none of the inputs'.
BESIDE = 1_000
OPS = ("broadcast", "reduce", "allreduce", "gather")
# When a killed node's lost input is put again: once an application could know of the death
# (its node's client sees the connection close), or at the signal itself (what no application
# can see).
REPUTS = ("noticed", "at-signal")


@dataclass
class Outcome:
    """One survivor: seconds until it held its result or got its error (``error``; a result
    checked wrong afterwards: "wrong result")."""

    node: int
    seconds: float | None = None
    error: str | None = None


@dataclass
class FailureRun:
    """The failure run of one op, next to its failure-free runs."""

    op: str
    victim: int
    signal: str
    kill_after: float
    failure_free: list[float]
    outcomes: list[Outcome] = field(default_factory=list)
    backup: bool = False  # a backup input replaced the victim's, instead of it put again
    folds: dict[int, int] = field(default_factory=dict)  # node -> lost inputs folded there
    victim_owns: bool = False  # the victim's shard owned the object's or its input's id
    reput: str = "noticed"  # when the lost input was put again (REPUTS)

    @property
    def all_survived(self) -> bool:
        return all(o.error is None for o in self.outcomes)

    @property
    def last(self) -> float | None:
        """When the last survivor held its result (None if any failed)."""
        if not self.all_survived or not self.outcomes:
            return None
        return max(o.seconds for o in self.outcomes if o.seconds is not None)

    @property
    def last_error(self) -> float | None:
        """When the last survivor that failed got its error (None if none failed)."""
        times = [o.seconds for o in self.outcomes if o.error is not None and o.seconds is not None]
        return max(times) if times else None

    @property
    def ratio(self) -> float | None:
        """The last survivor's time over the failure-free median."""
        last = self.last
        return None if last is None else last / statistics.median(self.failure_free)


def check_victim(op: str, victim: int, nodes: int, backup: bool = False) -> None:
    """Refuse what this run cannot measure: an unknown op, a victim outside 1..nodes-1 (node
    0 is the op's root: its death is the caller's own error, not a survivor's; a broadcast's
    node 0 is only its original holder, and may die once node 1 has a copy), a backup input
    for an op that is not a reduce."""
    if op not in OPS:
        raise InvalidArgumentError(f"failure runs measure {', '.join(OPS)}, not {op}")
    lowest = 0 if op == "broadcast" else 1
    if nodes < 3 or not lowest <= victim < nodes:
        raise InvalidArgumentError(f"--kill-node must be between {lowest} and {nodes - 1} "
                                   f"(of at least 3 nodes)")
    if backup and op not in ("reduce", "allreduce"):
        raise InvalidArgumentError(f"--backup is for reduce and allreduce, not {op}")


def check_others(op: str, victim: int, others: Sequence[int], nodes: int, backup: bool) -> None:
    """Refuse victims beyond the first that this run cannot measure: each as the first
    (``check_victim``), all distinct. A broadcast's later victims are not node 0 or 1 (the
    holders before the run: with both gone nothing is left to broadcast); no backup input (it
    replaces one lost input only); at least three nodes survive."""
    if not others:
        return
    for other in others:
        check_victim(op, other, nodes, backup)
    victims = [victim, *others]
    if (backup or nodes < len(victims) + 3 or len(set(victims)) < len(victims)
            or (op == "broadcast" and min(others) < 2)):
        raise InvalidArgumentError(f"nodes {list(others)} cannot be further victims of a {op} "
                                   f"on {nodes} nodes (first victim {victim}, backup {backup})")


def helpers_for(victims: list[int], n: int) -> dict[int, int]:
    """The node that puts each victim's inputs again (a restarted task's node): the nodes
    after the first victim that are neither node 0 nor a victim, taken by the victims in
    turn. A victim's inputs stay together, but the victims' tasks spread as a scheduler
    spreads them: one node taking every lost input of three victims holding two 48 MiB
    inputs each would hold 384 MiB of inputs in a 512 MiB store before the collective's own
    buffers."""
    spare = [i % n for i in range(victims[0] + 1, victims[0] + n)
             if i % n != 0 and i % n not in victims]
    return {victim: spare[turn % len(spare)] for turn, victim in enumerate(victims)}


async def run_with_failure(op: str, ctx: BenchContext, cluster: LocalCluster, victim: int,
                           kill_after: float, sig: str | None, backup: bool = False,
                           victim_owns: bool = False,
                           made: list[hoplite_client.ObjectID] | None = None,
                           others: Sequence[tuple[int, float]] = (),
                           resume_after: float | None = None,
                           restart_after: float | None = None,
                           link_to: int | None = None, apart: bool = False,
                           per_node: int = 1, beside: bool = False,
                           reput: str = "noticed") -> list[Outcome]:
    """Run ``op`` once, signalling node ``victim`` ``kill_after`` seconds in (``sig`` None:
    the same run without the signal); survivors' outcomes, in node order. ``backup``: a
    reduce's lost input is replaced by a backup. ``victim_owns``: the victim's shard owns
    the ids that matter. ``made``: gets every id the run puts or makes, to delete after.
    ``others``: more nodes, each with its own moment, that get the same signal
    (``check_others``). ``resume_after``: a stopped victim runs again that many seconds
    after its SIGSTOP (a pause: suspected, then trusted again, never declared dead if
    shorter than the heartbeat timeout); it stays out of the survivors all the same.
    ``restart_after``: a killed victim is started again that many seconds after its SIGKILL,
    as a supervisor would (a new member, joining while the run may still go on); the run
    counts as over once it has joined, and a failed start raises its error. ``sig`` "CUT"
    (an emulated cluster only): at ``kill_after`` the victims' hosts are cut off together
    from every other host (``apart``: each from every other) for ``resume_after`` seconds,
    then joined again (``Testbed.partition``); the others' moments are not used. ``sig``
    "LINK" (emulated, one victim): only the link between the victim's host and node
    ``link_to``'s is cut for that long; nobody is lost, so every participant is a survivor and
    no input is put again (docs/design.md §5, "A link broken between two members").
    ``ctx.interval`` > 0 (not broadcast, no backup): the collective begins first and node i
    puts its input i·interval after the clock starts (``Arrivals``); a victim signalled
    before its moment never puts, and its input is put again as above. ``per_node`` (not
    broadcast, no backup): every node puts that many inputs (``inputs_of``), which a reduce
    merges on their node (docs/design.md §4, "Several inputs on one node"); a victim's are
    all lost, and put again together. ``beside`` (not broadcast): node 0 also broadcasts an
    object of ``ctx.size`` to every other node but the victims during the run, whose gets
    are survivors' outcomes too: the failure then hits two collectives that share daemons,
    links and shards. ``reput``: when a lost input is put again (``REPUTS``)."""
    if reput not in REPUTS:
        raise InvalidArgumentError(f"reput must be one of {', '.join(REPUTS)}, not {reput}")
    clients = ctx.clients
    n = len(clients)
    owner = cluster.nodes[victim].node_id if victim_owns else None
    arrivals = Arrivals(ctx, per_node) if ctx.interval > 0 and op != "broadcast" else None
    setup, participants, ids = await _prepare(op, ctx, victim if backup else None, victim,
                                              owner, [node.node_id for node in cluster.nodes],
                                              [] if made is None else made, arrivals,
                                              per_node)
    moments = [(victim, kill_after), *others]
    hit = [v for v, _ in moments]  # signalled, or cut off
    victims = [] if sig == "LINK" else hit
    survivors = [i for i in participants if i not in victims]
    signalled: set[int] = set()  # victims whose signal has gone out
    reputs: list[asyncio.Future[None]] = []  # the lost inputs put again
    reputs_stop = asyncio.Event()
    # the first lost input that could not be put again: the op cannot end without it, so
    # every survivor's wait ends with its error rather than at the op's timeout
    reput_failed: asyncio.Future[HopliteError] = asyncio.get_running_loop().create_future()
    extra: hoplite_client.ObjectID | None = None
    if beside:
        if op == "broadcast":
            raise InvalidArgumentError("a broadcast beside the op goes with another op")
        extra = await clients[0].put(ctx.data(BESIDE), object_id=owned_id(
            owner, [node.node_id for node in cluster.nodes]))
        if made is not None:
            made.append(extra)
    t0 = time.perf_counter()
    if arrivals is not None:
        arrivals.start = t0

    helpers = {victim: clients[node] for victim, node in helpers_for(hit, n).items()}
    resumes: list[float] = []  # when each paused victim runs again (the loop's clock)
    returns: list[asyncio.Future[Any]] = []  # each killed victim started again, or cut healed
    rest = [i for i in range(n) if i not in hit]
    if link_to is not None:
        cut = [[victim], [link_to]]
    elif apart:
        cut = [*([v] for v in hit), rest]
    else:
        cut = [hit, rest]
    testbed = cluster.testbed if isinstance(cluster, EmulatedCluster) else None
    if sig in ("CUT", "LINK") and (testbed is None or resume_after is None
                                   or (sig == "LINK") != (link_to is not None)
                                   or (sig == "LINK" and (bool(others) or link_to == victim))
                                   or len(rest) <= len(hit)):
        raise InvalidArgumentError("a cut needs an emulated cluster, its length, and fewer "
                                   "victims than others (a cut link: one victim, and the "
                                   "other end, another node)")

    async def restart(node: int) -> None:
        assert restart_after is not None
        await asyncio.sleep(restart_after)
        await cluster.restart(node)

    async def cut_then_heal() -> None:
        assert resume_after is not None and testbed is not None
        await testbed.partition(cut)
        await asyncio.sleep(resume_after)
        await testbed.partition(cut, heal=True)

    async def signal_one(node: int, after: float) -> None:
        assert sig in SIGNALS
        await asyncio.sleep(max(0.0, t0 + after - time.perf_counter()))
        signalled.add(node)
        cluster.kill(node, SIGNALS[sig])
        if resume_after is not None and sig == "STOP":
            loop = asyncio.get_running_loop()
            loop.call_later(resume_after, cluster.kill, node, signal.SIGCONT)
            resumes.append(loop.time() + resume_after)
        if restart_after is not None and sig == "KILL":
            returns.append(asyncio.ensure_future(restart(node)))
        await lost(node)

    async def noticed(node: int) -> None:
        """Return once the application could know that ``node`` is gone: a killed daemon's
        client sees its connection close. A silent or cut-off node shows nothing a client
        sees before the cluster's own verdict, which the put meets: refused while the lost
        copy is trusted, retried (``put_again``)."""
        if reput == "noticed" and sig == "KILL":
            await clients[node].wait_closed()

    async def lost(node: int) -> None:
        if ids and not backup:  # the restarted task: the lost input again, elsewhere
            await noticed(node)
            # a put once sent completes even if this run ends first (docs/design.md §2.2):
            # the run's end stops the retries and waits for it, so no put lands after the
            # deletes that follow
            again = [asyncio.ensure_future(put_again(helpers[node], ids[m], ctx.data(m),
                                                     reputs_stop))
                     for m in inputs_of(node, n, per_node)]
            reputs.extend(again)  # each retrieved at the run's end
            for put in again:
                put.add_done_callback(failed_reput)
            await asyncio.gather(*(asyncio.shield(put) for put in again))

    def failed_reput(put: asyncio.Future[None]) -> None:
        error = None if put.cancelled() else put.exception()
        if isinstance(error, HopliteError) and not reput_failed.done():
            reput_failed.set_result(error)

    async def kill() -> None:
        if backup:  # a straggler's input: not chosen, ready before the node dies
            await helpers[victim].put(ctx.data(n), object_id=ids[n])
        if sig is None:
            return
        if sig not in ("CUT", "LINK"):
            await asyncio.gather(*(signal_one(node, after) for node, after in moments))
            return
        await asyncio.sleep(max(0.0, t0 + kill_after - time.perf_counter()))
        # the cut in a task of its own: once begun, made and healed in full
        returns.append(asyncio.ensure_future(cut_then_heal()))
        await asyncio.gather(*(lost(node) for node in victims))  # none for a cut link

    async def one(i: int) -> tuple[Outcome, Check | None]:
        try:
            check = await setup(i, clients[i])
        except HopliteError as exc:
            return Outcome(i, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"), None
        return Outcome(i, seconds=time.perf_counter() - t0), check

    async def get_extra(i: int) -> tuple[Outcome, Check | None]:
        assert extra is not None
        try:
            got = await clients[i].get(extra, timeout=FAILURE_TIMEOUT)
        except HopliteError as exc:
            return Outcome(i, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"), None

        async def check() -> bool:
            return same_bytes(got, ctx.data(BESIDE))
        return Outcome(i, seconds=time.perf_counter() - t0), check

    async def victim_puts(node: int) -> None:
        """A victim's own task puts its input at its moment, unless its node was signalled
        first (the task is then restarted elsewhere: ``lost``); a node cut off is alive and
        puts. Whatever the signal does to the put in flight is the victim's, not a
        survivor's, outcome."""
        assert arrivals is not None
        await arrivals.wait(node)
        if node in signalled:
            return
        with contextlib.suppress(HopliteError):
            await arrivals.put(node)

    killer = asyncio.ensure_future(kill())
    puts = [asyncio.ensure_future(victim_puts(v))
            for v in (victims if arrivals is not None else [])]
    # a victim that runs again (or was only cut off) completes the put it had sent
    runs_again = resume_after is not None or sig == "CUT"
    waits = asyncio.gather(
        *(one(i) for i in survivors),
        *(get_extra(i) for i in range(1, n) if extra is not None and i not in victims))
    try:
        either: list[asyncio.Future[Any]] = [waits, reput_failed]
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if waits.done():
            ended = waits.result()
        else:
            waits.cancel()
            await asyncio.gather(waits, return_exceptions=True)
            error = reput_failed.result()
            why = f"a lost input could not be put again: {type(error).__name__}: {error}"
            ended = [(Outcome(i, time.perf_counter() - t0, why), None) for i in survivors]
    finally:
        waits.cancel()
        reput_failed.cancel()
        killer.cancel()  # a signal still to come is not needed any more
        reputs_stop.set()
        if not runs_again:
            for put in puts:  # a victim's put that waits on its frozen daemon
                put.cancel()
        await asyncio.gather(killer, return_exceptions=True)
        if resumes:  # the paused victims run again before the run counts as over
            await asyncio.sleep(max(0.0, max(resumes) - asyncio.get_running_loop().time()))
        for back in returns:  # the killed ones have joined again, a cut is healed
            await back
        await asyncio.gather(*reputs, *puts, return_exceptions=True)
    # checked once every survivor is done: a check takes a core for a moment, and done
    # inside the run it would hold up the next survivor's clock
    for outcome, check in ended:
        if check is not None and not await check():
            outcome.error = "wrong result"
    return [outcome for outcome, _ in ended]


async def folds_by_node(client: hoplite_client.Client, cluster: LocalCluster) -> dict[int, int]:
    """How many lost reduce inputs each live node folded into a slot of its own so far
    (docs/design.md §5): how the repair went, for the report."""
    index = {node.node_id: i for i, node in enumerate(cluster.nodes)}
    status = await client.status()
    return {index[n["node_id"]]: n["reduce_folds"] for n in status["nodes"]
            if n["node_id"] in index and n.get("reduce_folds")}


# What a survivor does until it holds its result; it returns how to check that result.
Check = Callable[[], Awaitable[bool]]
Step = Callable[[int, hoplite_client.Client], Awaitable[Check]]


class Arrivals:
    """Inputs that arrive one by one (``ctx.interval`` > 0): node i's task puts its input
    i·interval after ``start``, once the collective has begun, as the staggered scenarios do
    (docs/design.md §4); what a collective must then plan around as inputs come."""

    def __init__(self, ctx: BenchContext, per_node: int = 1) -> None:
        self.ctx = ctx
        self.per_node = per_node
        self.ids: list[hoplite_client.ObjectID] = []
        self.start = time.perf_counter()

    async def wait(self, node: int) -> None:
        """Until node ``node``'s moment."""
        await asyncio.sleep(max(0.0, self.start + node * self.ctx.interval
                                - time.perf_counter()))

    async def put(self, node: int) -> None:
        """Put node ``node``'s inputs through its own client, at its moment."""
        await self.wait(node)
        client = self.ctx.clients[node]
        await asyncio.gather(*(client.put(self.ctx.data(m), object_id=self.ids[m])
                               for m in inputs_of(node, len(self.ctx.clients),
                                                  self.per_node)))


async def put_again(client: hoplite_client.Client, oid: hoplite_client.ObjectID,
                    data: NDArray[Any], stop: asyncio.Event | None = None) -> None:
    """Put ``oid`` again, as a restarted task would; refused while the directory still counts
    the lost copy as live (a frozen node not yet declared dead), or dropped before an owner
    had it (a copy of the lost version is complete elsewhere, docs/design.md §5), so retried
    until accepted, or until ``stop`` is set (the run is over: the put is not needed any
    more)."""
    deadline = time.monotonic() + FAILURE_TIMEOUT
    while True:
        try:
            await client.put(data, object_id=oid)
            return
        except (hoplite_client.ObjectExistsError, hoplite_client.ObjectDeletedError):
            if time.monotonic() > deadline:
                raise
            if stop is None:
                await asyncio.sleep(REPUT_POLL)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REPUT_POLL):
                    await stop.wait()
            if stop.is_set():
                return


def owned_id(owner: str | None, nodes: list[str]) -> hoplite_client.ObjectID:
    """A fresh id whose directory shard is ``owner`` among ``nodes`` (None: any)."""
    oid = hoplite_client.ObjectID.random()
    while owner is not None and rendezvous_owner(oid, nodes) != owner:
        oid = hoplite_client.ObjectID.random()
    return oid


async def _prepare(op: str, ctx: BenchContext, backup_for: int | None, victim: int,
                   owner: str | None, nodes: list[str], made: list[hoplite_client.ObjectID],
                   arrivals: Arrivals | None = None, per_node: int = 1
                   ) -> tuple[Step, list[int], list[hoplite_client.ObjectID]]:
    """Put the op's inputs; returns what each participant does, who participates, and the
    inputs a restarted task puts again (none for broadcast). ``backup_for``: a reduce gets
    one more input, not put yet, to replace that node's. ``owner``: the shard of the
    broadcast object, or of the victim's input. ``made`` gets every id put or made.
    ``arrivals``: the inputs are put one by one once the collective has begun
    (``_staggered``). ``per_node``: inputs on each node (``inputs_of``)."""
    clients = ctx.clients
    n = len(clients)
    if op == "broadcast":
        oid = await clients[0].put(ctx.data(0), object_id=owned_id(owner, nodes))
        made.append(oid)
        receivers = list(range(1, n))
        if victim == 0:  # the original holder dies after node 1 has a whole copy
            await clients[1].get(oid, timeout=FAILURE_TIMEOUT)
            receivers = receivers[1:]

        async def get_one(i: int, c: hoplite_client.Client) -> Check:
            got = await c.get(oid, timeout=FAILURE_TIMEOUT)

            async def check() -> bool:
                return same_bytes(got, ctx.data(0))
            return check
        return get_one, receivers, []
    ids = [owned_id(owner if m % n == victim else None, nodes) for m in range(n * per_node)]
    made.extend(ids)
    if backup_for is not None and (arrivals is not None or per_node > 1):
        raise InvalidArgumentError("a backup input goes with one input per node, "
                                   "put at once")
    if arrivals is not None:
        return await _staggered(op, ctx, ids, made, arrivals)
    await asyncio.gather(*(clients[m % n].put(ctx.data(m), object_id=oid)
                           for m, oid in enumerate(ids)))
    if op == "gather":
        async def gather(i: int, c: hoplite_client.Client) -> Check:
            arrays = await c.gather(ids, timeout=FAILURE_TIMEOUT)

            async def check() -> bool:
                return all(same_bytes(a, ctx.data(k)) for k, a in enumerate(arrays))
            return check
        return gather, [0], ids
    if backup_for is not None:
        ids.append(hoplite_client.ObjectID.random())
        made.append(ids[-1])
        for used in (tuple(range(n)), tuple(i for i in range(n + 1) if i != backup_for)):
            ctx.expected_sum(used)  # made now (the backup's data too): the clock is not running
    if op == "allreduce" and backup_for is None:  # as the failure-free run: a ring, if any
        result = await clients[0].allreduce(ids, "sum", timeout=FAILURE_TIMEOUT,
                                            striped=ctx.striped)
    else:  # an allreduce with a backup needs k of the inputs: a reduce every node gets
        result = await clients[0].reduce(ids, "sum", num_objects=n * per_node,
                                         timeout=FAILURE_TIMEOUT)
    made.append(result)

    async def get_sum(i: int, c: hoplite_client.Client) -> Check:
        got = await c.get(result, timeout=FAILURE_TIMEOUT)

        async def check() -> bool:
            if backup_for is None:
                return reduced_ok(ctx, got, tuple(range(len(ids))))
            # the backup is used only if the node died before the result was complete
            used = await clients[0].reduced_inputs(result, timeout=FAILURE_TIMEOUT)
            return reduced_ok(ctx, got, tuple(sorted(ids.index(oid) for oid in used)))
        return check
    return get_sum, (list(range(n)) if op == "allreduce" else [0]), ids


async def _staggered(op: str, ctx: BenchContext, ids: list[hoplite_client.ObjectID],
                     made: list[hoplite_client.ObjectID], arrivals: Arrivals
                     ) -> tuple[Step, list[int], list[hoplite_client.ObjectID]]:
    """The collective begins before any input exists, and every node's task puts its input at
    its moment (``arrivals``); then it asks for what it needs, as in the staggered scenarios:
    an allreduce's every node the result, a reduce's or a gather's node 0 its result. Every
    node is a participant: a put that fails is its outcome's error."""
    clients = ctx.clients
    arrivals.ids = ids
    result: hoplite_client.ObjectID | None = None
    if op == "allreduce":
        result = await clients[0].allreduce(ids, "sum", timeout=FAILURE_TIMEOUT,
                                            striped=ctx.striped)
    elif op == "reduce":
        result = await clients[0].reduce(ids, "sum", num_objects=len(ids),
                                         timeout=FAILURE_TIMEOUT)
    if result is not None:
        made.append(result)

    async def put_only() -> bool:
        return True  # the put itself returned: all this node's task had to do

    async def step(i: int, c: hoplite_client.Client) -> Check:
        await arrivals.put(i)
        if op == "gather" and i == 0:
            arrays = await c.gather(ids, timeout=FAILURE_TIMEOUT)

            async def gathered() -> bool:
                return all(same_bytes(a, ctx.data(k)) for k, a in enumerate(arrays))
            return gathered
        if result is not None and (op == "allreduce" or i == 0):
            got = await c.get(result, timeout=FAILURE_TIMEOUT)

            async def summed() -> bool:
                return reduced_ok(ctx, got, tuple(range(len(ids))))
            return summed
        return put_only
    return step, list(range(len(clients))), ids


def inputs_of(node: int, nodes: int, per_node: int) -> list[int]:
    """The indices, among every input, of the ``per_node`` inputs node ``node`` puts."""
    return [node + j * nodes for j in range(per_node)]
