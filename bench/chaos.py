"""Failures at random moments: many short failure runs, each on a fresh local cluster.

Each trial draws, from ``--seed`` and its number, an op (broadcast, reduce, allreduce as the
daemons choose, allreduce in stripes, gather), 4 to 6 nodes, a size (inline to several MiB),
a victim, SIGKILL or SIGSTOP, whether the victim's shard owns the ids that matter and, for a
reduce, a backup input. It times one failure-free run of that shape, then runs it again and
signals the victim at a moment drawn uniformly from the start to 1.2 times that run's length
(:func:`hoplited.tools.failures.run_with_failure`: the victim's input is put again on
the next node, as a restarted task would; several victims' inputs on the spare nodes in
turn, :func:`~hoplited.tools.failures.helpers_for`). The design promises that every
survivor ends with the checked result (docs/design.md §5). A trial then deletes what it
made and checks that every survivor lets go of it all. The verdicts:

- ``ok``: every survivor held the right result, and afterwards nothing was left;
- ``error``: a survivor got a typed error instead, or a lost input could not be put again
  (the op cannot end without it: the run ends there, and names the error);
- ``wrong``: a survivor's result was wrong;
- ``hung``: the run had not ended TRIAL_TIMEOUT seconds after the signal;
- ``leak``: a survivor still held objects, entries, pins, transfers, reduce slots or
  allreduces LEAK_WAIT seconds after the deletes;
- ``crash``: a survivor's daemon exited, or logged a traceback or an ERROR line;
- ``degraded`` (``--cut-link`` only): a survivor got a typed error, and nothing else went
  wrong.

Anything but ``ok`` keeps the trial's daemon logs (the path is printed; ``--keep-logs``: every
trial's, to see how a run that ended well got there). ``--emulate RATE``
runs each trial in a fresh emulated cluster (network namespaces, links limited to RATE, as
``hoplite bench --emulate``; root only): transfers then last long enough for most signals to
land mid-transfer, where on loopback many land before or after. Usage:
    python -m bench.chaos --trials 50 --seed 1
    python -m bench.chaos --seed 1 --only 17      # trial 17 of seed 1 again
    python -m bench.chaos --trials 30 --seed 7 --emulate 1Gbit
    python -m bench.chaos --trials 30 --seed 9 --double   # two victims per trial
    python -m bench.chaos --trials 30 --seed 28 --victims 3   # three
    python -m bench.chaos --trials 30 --seed 13 --resume  # stopped victims run again
    python -m bench.chaos --trials 30 --seed 16 --long-pause  # ... after being declared dead
    python -m bench.chaos --trials 30 --seed 17 --restart  # killed victims started again
    python -m bench.chaos --trials 30 --seed 19 --emulate 1Gbit --partition  # cut off, healed
    python -m bench.chaos --trials 30 --seed 29 --emulate 1Gbit --partition --victims 2
    python -m bench.chaos --trials 30 --seed 23 --emulate 1Gbit --cut-link  # one link cut
    python -m bench.chaos --trials 30 --seed 61 --stagger  # inputs put one by one
    python -m bench.chaos --trials 30 --seed 69 --per-node 2  # two inputs on every node
    python -m bench.chaos --trials 30 --seed 73 --beside  # a broadcast during the op

``--victims K`` signals K nodes in each trial, each at a moment of its own drawn from the
same range, with the same signal (at least K + 3 nodes, no backup input; a broadcast's later
victims are neither of the two nodes holding the object before the run); ``--double`` is
``--victims 2``. The draws of every other parameter are those of the same seed with one.
``--resume`` sends a SIGSTOPped victim SIGCONT after a pause drawn from 0.5 to 3 s, below
the heartbeat timeout: it is suspected and then trusted again, never declared dead, and takes
its ids back. It is not a survivor whose
result is checked, but once it runs again it must let go of everything too. ``--long-pause``
is the same with a pause drawn from 5 to 8 s, past the heartbeat timeout: the victim is
declared dead, runs again, and must come back as a new member (docs/design.md §5, "Declared
dead, then running again"); the trial also checks that it serves again under a new node id
within REJOIN_WAIT and that every member then lists that id alive and the old one dead.
``--restart`` starts a SIGKILLed victim again 0.2 to 3 s after the signal, as a supervisor
would: a new member that joins while the run may still go on. It must hold nothing at the
end either, and every member must list exactly the members' current ids alive.
``--partition`` (with ``--emulate``) replaces each trial's signal by a cut: the victim's host
is cut off from all the others (blackhole routes) for 1 to 8 s, then joined again; with
``--victims K`` the K victims' hosts are cut off at the first one's moment, as one side or
each alone (drawn), and the rest, at least K + 1 nodes, is the largest side. A short
cut makes it suspected, a long one declared dead on both sides of the cut, and then the
smaller side (the victim) must come back as a new member (docs/design.md §5, "Partitions
heal"); the views and the let-go are checked as above. ``--cut-link`` (with ``--emulate``)
cuts only the link between the victim's host and one other node's, drawn from the rest, for
1 to 8 s: nobody is lost, so every node is a survivor. Requests that need that link may fail
while it is cut (docs/design.md §5, "A link broken between two members"), so a typed error is
``degraded`` there, not ``error``; either way the trial then checks that every node kept its
id and lists all the others alive and trusted within REJOIN_WAIT, and the let-go and logs as
above. ``--stagger`` (any of the above) draws no broadcast and no backup input: the op
begins first, and each node's task puts its input at its own moment, STAGGER apart (drawn
per trial), then asks for the result (every node of an allreduce, node 0 of a reduce or a
gather), as the staggered benchmarks do. The plans that wait for inputs (a ring's wait, the
last input on the root, a pair of combiners, docs/design.md §4) are then what the failure
hits; a victim signalled before its moment never puts, and its input is put again.
``--per-node K`` (any of the above) draws no broadcast and no backup input either: each node
puts K inputs, which a reduce merges on their node first (docs/design.md §4, "Several inputs
on one node"), and a victim loses all K, put again together. ``--beside`` draws no broadcast
op: node 0 also broadcasts an object of the trial's size to every node but the victims while
the op runs (its id owned by the victim's shard if the draw says so), and those gets are
judged with the op's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import json
import os
import random
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from typing import Any

import uvloop

import hoplite_client
from hoplite_client.wire.errors import HopliteError
from hoplited.tools.failures import (
    Outcome,
    check_others,
    check_victim,
    run_with_failure,
)
from hoplited.tools.local_cluster import LocalCluster
from hoplited.tools.scenarios import BenchContext, Progress
from hoplited.tools.testbed import emulated_cluster, parse_rate

DAEMON_ARGS = ["--heartbeat-interval", "0.5", "--heartbeat-timeout", "4"]
# On loopback objects cross in milliseconds, below a pair's least transfer: without this no
# trial there would end as a pair (docs/design.md §4, "A pair for the last two inputs").
LOOPBACK_ARGS = ["--pair-min-transfer", "0"]
CAPACITY = "512MiB"
OPS = ["broadcast", "reduce", "allreduce", "allreduce-striped", "gather"]
# inline to tens of MiB: on loopback a run of 32 MiB takes 0.1-0.3 s, long enough for a signal
# to land mid-transfer, where a run of 1 MiB is over in milliseconds
SIZES = {"broadcast": [16 << 10, 4 << 20, 32 << 20], "reduce": [16 << 10, 4 << 20, 32 << 20],
         "allreduce": [8 << 20, 32 << 20], "allreduce-striped": [12 << 20, 48 << 20],
         "gather": [16 << 10, 4 << 20, 16 << 20]}
# the signal lands uniformly in [0, LATEST) times the failure-free run's length
LATEST = 1.2
TRIAL_TIMEOUT = 90.0  # seconds after the signal: far past any repair's bound
LEAK_WAIT = 20.0
PAUSE = (0.5, 3.0)  # --resume: a stopped victim's pause, below the 4 s heartbeat timeout
LONG_PAUSE = (5.0, 8.0)  # --long-pause: past the heartbeat timeout and its interval
REJOIN_WAIT = 20.0  # --long-pause, --restart: from the end of the run until views agree
RESTART = (0.2, 3.0)  # --restart: how long after its SIGKILL a victim is started again
CUT_FOR = (1.0, 8.0)  # --partition: how long the victim's host is cut off
# --stagger: seconds between two puts, log-uniform: from inputs closer than a transfer of
# the smallest size on loopback to further apart than one of 32 MiB on 1 Gbit/s links
STAGGER = (0.005, 0.3)
BAD_LOG = ("Traceback", " ERROR ")


@dataclass
class Trial:
    """One trial's draw, and what came of it."""

    number: int
    op: str
    nodes: int
    size: int
    victim: int
    signal: str
    victim_owns: bool
    backup: bool
    kill_after: float = 0.0
    failure_free: float = 0.0
    verdict: str = ""
    detail: str = ""
    last: float | None = None  # seconds until the last survivor held its result
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    logs: str | None = None
    others: list[int] = field(default_factory=list)  # --victims K: the victims after the first
    others_after: list[float] = field(default_factory=list)  # ... and their moments
    apart: bool = False  # --partition with more victims: each cut off alone, not together
    resume_after: float | None = None  # --resume: a stopped victim's pause, in seconds
    long_pause: bool = False  # --long-pause: that pause is past the heartbeat timeout
    restart_after: float | None = None  # --restart: a killed victim started again, seconds
    link_to: int | None = None  # --cut-link: the other end of the cut link
    interval: float = 0.0  # --stagger: seconds between one node's put and the next's
    per_node: int = 1  # --per-node: inputs each node puts
    beside: bool = False  # --beside: a broadcast from node 0 runs beside the op
    keep_logs: bool = False  # --keep-logs: an ok trial's logs are kept too

    @property
    def mid_run(self) -> bool:
        """Whether the signal landed before the last survivor held its result."""
        return self.last is not None and self.kill_after < self.last

    def describe(self) -> str:
        extra = "".join([", victim owns", ", backup"][i] for i, on in
                        enumerate((self.victim_owns, self.backup)) if on)
        if self.interval:
            extra += f", inputs {self.interval * 1e3:.0f} ms apart"
        if self.per_node > 1:
            extra += f", {self.per_node} inputs a node"
        if self.beside:
            extra += ", a broadcast beside"
        size = (f"{self.size >> 20} MiB" if self.size >= 1 << 20 else f"{self.size >> 10} KiB")
        also = "".join(f" and node {o} at {a:.2f} s"
                       for o, a in zip(self.others, self.others_after))
        pause = ("" if self.resume_after is None
                 else f", SIGCONT {self.resume_after:.1f} s later")
        if self.restart_after is not None:
            pause = f", started again {self.restart_after:.1f} s later"
        if self.signal == "CUT":
            cut = ", ".join(str(v) for v in [self.victim, *self.others])
            how = "" if not self.others else " each alone" if self.apart else " together"
            return (f"{self.op} n={self.nodes} {size} node{'s' if self.others else ''} {cut} "
                    f"cut off{how} at {self.kill_after:.2f} s for {self.resume_after:.1f} s"
                    f"{extra}")
        if self.signal == "LINK":
            return (f"{self.op} n={self.nodes} {size} link {self.victim}-{self.link_to} cut "
                    f"at {self.kill_after:.2f} s for {self.resume_after:.1f} s{extra}")
        return (f"{self.op} n={self.nodes} {size} SIG{self.signal} node "
                f"{self.victim} at {self.kill_after:.2f} s{also}{pause}{extra}")


def draw(seed: int, number: int, victims: int = 1, resume: bool = False,
         long_pause: bool = False, restart: bool = False, partition: bool = False,
         cut_link: bool = False, stagger: bool = False, per_node: int = 1,
         beside: bool = False) -> Trial:
    """Trial ``number`` of ``seed``: the same draw on every machine (``victims``: how many
    nodes fail, each at a moment of its own; ``resume``: a stopped victim runs again;
    ``long_pause``: only after it was declared dead; ``restart``: a killed victim is started
    again; ``partition``: the victims are cut off instead of signalled, together or each
    alone; ``cut_link``: only one victim's link to one other node is; every other draw
    unchanged; ``stagger``: no broadcast or backup input, and the inputs are put one by one,
    STAGGER apart, once the op has begun; ``per_node``: no broadcast or backup input, and
    each node puts that many; ``beside``: no broadcast op, and a broadcast from node 0 runs
    beside the op)."""
    rng = random.Random(seed * 100_003 + number)
    op = rng.choice(OPS[1:] if stagger or per_node > 1 or beside else OPS)
    nodes = rng.randint(4, 6)
    base = "allreduce" if op.startswith("allreduce") else op
    backup = base == "reduce" and rng.random() < 0.3
    victim = rng.randrange(0 if base == "broadcast" else 1, nodes)
    check_victim(base, victim, nodes, backup)
    trial = Trial(number, op, nodes, rng.choice(SIZES[op]), victim,
                  "KILL" if rng.random() < 0.7 else "STOP", rng.random() < 0.3, backup,
                  kill_after=rng.random())  # a fraction, scaled once the run is timed
    if victims > 1:
        # at least three survivors; a cut side smaller than the rest (docs/design.md §5)
        trial.nodes = max(nodes, victims + 3, 2 * victims + 1 if partition else 0)
        trial.backup = False
        lowest = 2 if base == "broadcast" else 1
        for _ in range(victims - 1):
            taken = [victim, *trial.others]
            trial.others.append(rng.choice([i for i in range(lowest, trial.nodes)
                                            if i not in taken]))
            trial.others_after.append(rng.random())
        check_others(base, victim, trial.others, trial.nodes, trial.backup)
    if resume or long_pause:
        low, high = LONG_PAUSE if long_pause else PAUSE
        pause = low + (high - low) * rng.random()
        trial.resume_after = pause if trial.signal == "STOP" else None
        trial.long_pause = long_pause and trial.resume_after is not None
    if restart and trial.signal == "KILL":
        trial.restart_after = RESTART[0] + (RESTART[1] - RESTART[0]) * rng.random()
    if partition or cut_link:
        trial.signal = "LINK" if cut_link else "CUT"
        trial.resume_after = CUT_FOR[0] + (CUT_FOR[1] - CUT_FOR[0]) * rng.random()
    if cut_link:
        trial.link_to = rng.choice([i for i in range(trial.nodes) if i != victim])
    if partition and trial.others:
        trial.apart = rng.random() < 0.5
    if per_node > 1:
        trial.backup = False
        trial.per_node = per_node
    trial.beside = beside
    if stagger:
        trial.backup = False
        low, high = STAGGER
        trial.interval = low * (high / low) ** rng.random()
    return trial


@contextlib.asynccontextmanager
async def started_cluster(nodes: int, workdir: str,
                          rate_bps: int | None) -> AsyncIterator[LocalCluster]:
    """A fresh cluster for one trial: on loopback, or (``rate_bps``) in an emulated one."""
    if rate_bps is None:
        async with LocalCluster(nodes, capacity=CAPACITY, daemon_args=DAEMON_ARGS + LOOPBACK_ARGS,
                                workdir=workdir) as cluster:
            yield cluster
    else:
        async with emulated_cluster(nodes, rate_bps, capacity=CAPACITY,
                                    daemon_args=DAEMON_ARGS, workdir=workdir) as emulated:
            yield emulated


async def run_trial(trial: Trial, rate_bps: int | None = None) -> Trial:
    """Carry out ``trial``: time it failure-free, run it with its failure, check the end."""
    workdir = tempfile.mkdtemp(prefix="hoplite-chaos-")
    base = "allreduce" if trial.op.startswith("allreduce") else trial.op
    async with started_cluster(trial.nodes, workdir, rate_bps) as cluster:
        clients = [await hoplite_client.connect(s) for s in cluster.sockets]
        ctx = BenchContext(clients, trial.size, trial.interval, Progress(),
                           striped=trial.op == "allreduce-striped")
        for _ in range(2):  # the first warms connections and memory up; the second is timed
            made: list[hoplite_client.ObjectID] = []
            free = await run_with_failure(base, ctx, cluster, trial.victim, 0.0, None,
                                          trial.backup, trial.victim_owns, made,
                                          [(o, 0.0) for o in trial.others],
                                          per_node=trial.per_node, beside=trial.beside)
            if any(o.error is not None for o in free):
                return _ended(trial, "error", f"the failure-free run failed: {free}", workdir)
            trial.failure_free = max(o.seconds or 0.0 for o in free)
            await _delete(clients[0], made)
        trial.kill_after *= LATEST * trial.failure_free
        trial.others_after = [a * LATEST * trial.failure_free for a in trial.others_after]
        others = list(zip(trial.others, trial.others_after))
        old_ids = [node.node_id for node in cluster.nodes]
        made = []
        try:
            async with asyncio.timeout(max([trial.kill_after, *trial.others_after])
                                       + TRIAL_TIMEOUT):
                outcomes = await run_with_failure(base, ctx, cluster, trial.victim,
                                                  trial.kill_after, trial.signal,
                                                  trial.backup, trial.victim_owns, made,
                                                  others, trial.resume_after,
                                                  trial.restart_after, trial.link_to,
                                                  trial.apart, trial.per_node,
                                                  trial.beside)
        except TimeoutError:
            return _ended(trial, "hung", f"not over {TRIAL_TIMEOUT:g} s after the signal",
                          workdir)
        except HopliteError as exc:  # a victim started again could not join
            return _ended(trial, "error", f"{type(exc).__name__}: {exc}", workdir)
        trial.outcomes = [asdict(o) for o in outcomes]
        verdict, detail = _judge(outcomes)
        if "CapacityError" in detail:  # what filled the stores, before the deletes
            detail += f"; stores {await _stores(cluster, trial)}"
        if trial.signal == "LINK" and verdict == "error":
            verdict = "degraded"  # a request that needed the cut link: a typed error
        victims = (trial.victim, *trial.others)
        if trial.signal == "LINK" and verdict in ("ok", "degraded"):
            kept, detail = await _views_agree(cluster, {}, detail, old_ids)
            verdict = verdict if kept == "ok" else kept
        elif (trial.long_pause or trial.restart_after is not None
                or trial.signal == "CUT") and verdict == "ok":
            verdict, detail = await _views_agree(
                cluster, {i: old_ids[i] for i in victims}, detail)
        # a victim that ran again, or was started again, must let go of everything too
        again = trial.resume_after is not None or trial.restart_after is not None
        survivors = [i for i in range(trial.nodes)
                     if i not in victims or again or trial.signal == "LINK"]
        for i in survivors:
            await clients[i].close()
        if verdict in ("ok", "degraded"):
            checker = await hoplite_client.connect(cluster.sockets[survivors[0]])
            try:
                await _delete(checker, made)
                let_go, left = await _let_go(cluster, survivors)
                verdict = verdict if let_go == "ok" else let_go
                detail = f"{detail}, {left}"
            finally:
                await checker.close()
        dead = [i for i in survivors if not cluster.nodes[i].running]
        if dead:
            verdict, detail = "crash", f"daemons {dead} exited"
        bad = _bad_log_lines(workdir, [cluster.nodes[i].log_path for i in survivors])
        if bad and verdict in ("ok", "degraded", "leak"):
            verdict, detail = "crash", bad
    return _ended(trial, verdict, detail, workdir)


def _judge(outcomes: list[Outcome]) -> tuple[str, str]:
    wrong = [o.node for o in outcomes if o.error == "wrong result"]
    if wrong:
        return "wrong", f"nodes {wrong} held a wrong result"
    errors = [f"node {o.node}: {o.error}" for o in outcomes if o.error is not None]
    if errors:
        return "error", "; ".join(errors)
    return "ok", f"last survivor {max(o.seconds or 0.0 for o in outcomes):.2f} s"


async def _delete(client: hoplite_client.Client, oids: list[hoplite_client.ObjectID]) -> None:
    for oid in oids:
        try:
            await client.delete(oid)
        except HopliteError:
            pass  # never made (a failed run), or gone with its only holder


async def _views_agree(cluster: LocalCluster, paused: dict[int, str], detail: str,
                       kept: list[str] | None = None) -> tuple[str, str]:
    """Whether every member, within REJOIN_WAIT, lists exactly the members' current node ids
    alive: a victim paused past the heartbeat timeout (``paused``: its index and old node
    id) is back under a new id, which all list alive, and its old id is listed dead. (A
    victim whose signal came after the run ended was never stopped: its id is unchanged.)
    ``kept``: every node must still have that id, and suspect nobody."""
    deadline = time.monotonic() + REJOIN_WAIT
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            views = {}
            for i in range(cluster.size):
                client = await hoplite_client.connect(cluster.sockets[i])
                try:
                    local = (await client.status())["local"]
                finally:
                    await client.close()
                views[i] = (local["node_id"],
                            {n["node_id"] for n in local["members"]
                             if n["alive"] and not (kept and n["suspected"])})
        except HopliteError as exc:  # a victim between its two lives
            last = str(exc)
            await asyncio.sleep(0.5)
            continue
        current = {node_id for node_id, _ in views.values()}
        last = f"views {views}"
        if kept is not None and [views[i][0] for i in range(cluster.size)] != kept:
            return "error", f"a node runs under a new id: {views}"
        if all(alive == current for _, alive in views.values()):
            back = [i for i, old in paused.items() if views[i][0] != old]
            return "ok", f"{detail}, {len(back)} back as a new member"
        await asyncio.sleep(0.5)
    return "error", f"members disagree {REJOIN_WAIT:g} s after the run: {last}"


async def _stores(cluster: LocalCluster, trial: Trial) -> dict[int, str]:
    """What each node the signals spared holds: its objects, and the MiB of its arena in use,
    of reduce and allreduce buffers, and of deleted copies still read."""
    out = {}
    for i in range(trial.nodes):
        if i in (trial.victim, *trial.others):
            continue
        client = await hoplite_client.connect(cluster.sockets[i])
        try:
            st = (await client.status())["local"]["store"]
        finally:
            await client.close()
        out[i] = (f"{st['objects']} objects, {st['arena_used'] >> 20} MiB used, "
                  f"{st['buffer_bytes'] >> 20} MiB buffers, {st['pinned_deleted']} deleted "
                  f"and read ({st['pinned_deleted_bytes'] >> 20} MiB)")
    return out


async def _let_go(cluster: LocalCluster, survivors: list[int]) -> tuple[str, str]:
    """Whether every survivor holds nothing of the trial any more, within LEAK_WAIT."""
    deadline = time.monotonic() + LEAK_WAIT
    held: dict[int, dict[str, Any]] = {}
    while True:
        held = {}
        for i in survivors:
            client = await hoplite_client.connect(cluster.sockets[i])
            try:
                local = (await client.status())["local"]
            finally:
                await client.close()
            left = {"objects": local["store"]["objects"],
                    "arena_used": local["store"]["arena_used"],
                    "pinned_deleted": local["store"]["pinned_deleted"],
                    "entries": local["directory"]["entries"],
                    "waiting_gets": local["directory"]["waiting_gets"],
                    "transfers": local["transfers_count"],
                    "reduce_tasks": local["reduce_tasks"], "allreduces": local["allreduces"]}
            if any(left.values()):
                held[i] = {k: v for k, v in left.items() if v}
                if left["entries"]:  # which ids, their holders and stories: why they stayed
                    held[i]["listed"] = local["directory"].get("sample", [])
        if not held:
            return "ok", "nothing left"
        if time.monotonic() > deadline:
            return "leak", f"after {LEAK_WAIT:g} s: {held}"
        await asyncio.sleep(0.5)


def _bad_log_lines(workdir: str, paths: list[str]) -> str:
    found = []
    for path in paths:
        try:
            with open(path, errors="replace") as f:
                found += [f"{os.path.basename(path)}: {line.strip()}" for line in f
                          if any(mark in line for mark in BAD_LOG)]
        except OSError:
            continue
    return "; ".join(found[:3])


def _ended(trial: Trial, verdict: str, detail: str, workdir: str) -> Trial:
    trial.verdict, trial.detail = verdict, detail
    done = [o["seconds"] for o in trial.outcomes if o["error"] is None]
    trial.last = max(done) if done and verdict == "ok" else None
    if verdict == "ok" and not trial.keep_logs:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        kept = tempfile.mkdtemp(prefix=f"hoplite-chaos-{trial.number}-")
        for path in glob.glob(os.path.join(workdir, "*.log")):
            shutil.copy(path, kept)
        shutil.rmtree(workdir, ignore_errors=True)
        trial.logs = kept
    return trial


async def campaign(seed: int, numbers: list[int], json_path: str | None,
                   rate_bps: int | None = None, victims: int = 1,
                   resume: bool = False, long_pause: bool = False,
                   restart: bool = False, partition: bool = False,
                   cut_link: bool = False, keep_logs: bool = False,
                   stagger: bool = False, per_node: int = 1, beside: bool = False) -> int:
    trials = []
    for number in numbers:
        trial = draw(seed, number, victims, resume, long_pause, restart, partition, cut_link,
                     stagger, per_node, beside)
        trial.keep_logs = keep_logs
        started = time.monotonic()
        trial = await run_trial(trial, rate_bps)
        trials.append(trial)
        print(f"trial {number}: {trial.describe()} (failure-free {trial.failure_free:.2f} s): "
              f"{trial.verdict}{' (signal mid-run)' if trial.mid_run else ''}, {trial.detail} "
              f"[{time.monotonic() - started:.0f} s]"
              + (f"; logs in {trial.logs}" if trial.logs else ""), flush=True)
    counts: dict[str, int] = {}
    for trial in trials:
        counts[trial.verdict] = counts.get(trial.verdict, 0) + 1
    mid = sum(1 for t in trials if t.mid_run)
    print("verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
          + f"; the signal landed before the last survivor was done in {mid} of "
            f"{sum(1 for t in trials if t.last is not None)} ok trials")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"seed": seed, "rate_bps": rate_bps,
                       "trials": [asdict(t) for t in trials]}, f, indent=1)
    return 0 if set(counts) <= {"ok", "degraded"} else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first", type=int, default=0, help="number of the first trial")
    parser.add_argument("--only", type=int, default=None, help="run this trial alone")
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--emulate", default=None, metavar="RATE",
                        help="run in an emulated cluster with links of RATE (e.g. 1Gbit)")
    parser.add_argument("--victims", type=int, default=1, metavar="K",
                        help="K nodes fail in each trial, each at a moment of its own")
    parser.add_argument("--double", action="store_true", help="the same as --victims 2")
    parser.add_argument("--resume", action="store_true",
                        help="a SIGSTOPped victim gets SIGCONT after a pause of 0.5-3 s")
    parser.add_argument("--long-pause", action="store_true",
                        help="... after a pause of 5-8 s instead: once declared dead")
    parser.add_argument("--restart", action="store_true",
                        help="a SIGKILLed victim is started again 0.2-3 s later")
    parser.add_argument("--partition", action="store_true",
                        help="cut the victim off for 1-8 s instead of a signal (--emulate)")
    parser.add_argument("--cut-link", action="store_true",
                        help="cut only the victim's link to one other node (--emulate)")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep every trial's daemon logs, not only those that went wrong")
    parser.add_argument("--stagger", action="store_true",
                        help="inputs put one by one, 5-300 ms apart, once the op has begun")
    parser.add_argument("--per-node", type=int, default=1, metavar="K",
                        help="each node puts K inputs (no broadcast)")
    parser.add_argument("--beside", action="store_true",
                        help="node 0 broadcasts another object during the op (no broadcast)")
    args = parser.parse_args()
    victims = 2 if args.double else args.victims
    cuts = args.partition or args.cut_link
    if args.per_node < 1:
        parser.error("--per-node takes 1 or more")
    if victims < 1 or (args.double and args.victims not in (1, 2)):
        parser.error("--victims takes 1 or more (--double is --victims 2)")
    if cuts and (args.emulate is None or args.resume or args.long_pause or args.restart
                 or (args.partition and args.cut_link) or (args.cut_link and victims > 1)):
        parser.error("--partition and --cut-link need --emulate, and go with no other "
                     "failure option (--partition with --victims: a side of K nodes)")
    numbers = ([args.only] if args.only is not None
               else list(range(args.first, args.first + args.trials)))
    rate = None if args.emulate is None else parse_rate(args.emulate)
    raise SystemExit(uvloop.run(campaign(args.seed, numbers, args.json_path, rate,
                                         victims, args.resume, args.long_pause,
                                         args.restart, args.partition, args.cut_link,
                                         args.keep_logs, args.stagger, args.per_node,
                                         args.beside)))


if __name__ == "__main__":
    main()
