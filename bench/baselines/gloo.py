"""torch.distributed with the gloo backend: broadcast, reduce, allreduce and gather.

One process per host of the emulated test bed (rank i in host i's namespace), gloo bound to
the host's veth (``GLOO_SOCKET_IFNAME``). Rank 0 creates the rendezvous ``TCPStore`` on its
198.18.x address with port 0 and prints the port it got; the other ranks are started with it.

A run (docs/design.md §7): every rank resets its inputs, passes ``dist.barrier()``, then times the
collective from its own barrier exit to its own completion; the run's latency is the maximum
of these over the ranks, collected after all runs with an all_reduce(MAX) that is not timed.
A staggered run (``interval``) has rank i call it i · interval after the barrier, and times
it from the last rank's call to the last rank's end (bench/baselines/common.py).
Every run's result is checked (broadcast and gather exactly, sums within float32 rounding).

Collectives: ``dist.broadcast``, ``dist.reduce`` (SUM to rank 0), ``dist.all_reduce`` (SUM)
and ``dist.gather`` to rank 0 — gloo implements gather itself, no all_gather is needed.

Usage (root):  python -m bench.baselines.gloo --nodes 8 --rate 1Gbit --op broadcast --size 32MiB
From Python:   latencies = await run(testbed, "broadcast", size, repeat)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from bench.baselines.common import (
    MAX_INTERVAL,
    OPS,
    REPO_ROOT,
    BaselineUnavailable,
    cli_parser,
    expected_sum,
    float32_data,
    from_last_call,
    measure,
    module_command,
    sum_matches,
    wait_turn,
)
from bench.baselines.failure import Failure, FailureLog, RankOutcome, watch
from bench.baselines.procs import tail

STAGGERED = True
INSTALL_HINT = ("torch.distributed (gloo) baseline needs torch: "
                "pip install torch==2.13.0 (the CPU wheel)")
START_TIMEOUT = 120.0  # 8 processes importing torch on a loaded 2-core machine
MIN_RATE_FOR_TIMEOUT = 10e6  # bytes/s: the run timeout assumes at least this per rank's data
RUN_SLACK = 20.0  # seconds per run on top of that (barrier, checks, a loaded machine)
KILL_GRACE = 5.0
RESULT_TAG = "GLOO-RESULT "


# --------------------------------------------------------------------------------------------
# one rank (runs inside its host's namespace)


def worker(rank: int, world: int, master: str, port: int, op: str, size: int,
           runs: int, op_timeout: float, outcome_dir: str | None = None,
           interval: float = 0.0) -> int:
    """Run ``runs`` timed ``op``s as ``rank``; rank 0 prints the result line. Exit code.
    ``outcome_dir``: the last run is a failure run (bench/baselines/failure.py);
    ``interval``: a staggered run (rank i calls the collective i · interval late)."""
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    log = None if outcome_dir is None else FailureLog(outcome_dir, rank)
    store = dist.TCPStore(master, port if rank else 0, world, is_master=(rank == 0),
                          timeout=timedelta(seconds=START_TIMEOUT), wait_for_workers=False)
    if rank == 0:
        print(json.dumps({"port": store.port}), flush=True)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=op_timeout))

    mine = float32_data(size, rank)
    n = mine.size
    buf = torch.empty(n, dtype=torch.float32)
    buf_np = buf.numpy()
    gathered = [torch.empty(n, dtype=torch.float32) for _ in range(world)] if rank == 0 else None
    # what this rank checks after every run
    if op == "broadcast":
        expected: Any = float32_data(size, 0) if rank else None
    elif op == "reduce":
        expected = expected_sum(size, world) if rank == 0 else None
    elif op == "allreduce":
        expected = expected_sum(size, world)
    else:
        expected = [float32_data(size, r) for r in range(world)] if rank == 0 else None

    def check() -> bool | None:
        """Does this rank hold the right result of the run just done (None: it gets none)?"""
        if expected is None:
            return None
        if op == "broadcast":
            return bool(np.array_equal(buf_np, expected))
        if op in ("reduce", "allreduce"):
            return sum_matches(buf_np, expected, world)
        assert gathered is not None
        return all(np.array_equal(g.numpy(), e) for g, e in zip(gathered, expected, strict=True))

    def collective() -> None:
        if op == "broadcast":
            dist.broadcast(buf, src=0)
        elif op == "reduce":
            dist.reduce(buf, dst=0, op=dist.ReduceOp.SUM)
        elif op == "allreduce":
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        else:
            dist.gather(buf, gather_list=gathered, dst=0)

    starts, ends, ok = [], [], True
    for run_index in range(runs):
        # inputs for this run (the collectives work in place)
        if op == "broadcast" and rank:
            buf_np.fill(0)
        else:
            buf_np[:] = mine
        if gathered is not None:
            for g in gathered:
                g.zero_()
        dist.barrier()
        if log is not None and run_index == runs - 1:
            log.failure_run(collective, check)
        wait_turn(rank, interval)
        starts.append(time.perf_counter())
        collective()
        ends.append(time.perf_counter())
        good = check() is not False
        if not good:
            print(f"gloo rank {rank}: wrong {op} result", file=sys.stderr, flush=True)
        ok = ok and good

    # not timed: the slowest rank per run (from the last call, if staggered), and whether
    # every rank got the right result
    if interval > 0:
        last = torch.tensor([starts, ends], dtype=torch.float64)
        dist.all_reduce(last, op=dist.ReduceOp.MAX)
        latencies = from_last_call(last[0].numpy(), last[1].numpy())
    else:
        worst = torch.tensor([e - s for s, e in zip(starts, ends, strict=True)],
                             dtype=torch.float64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        latencies = worst.tolist()
    all_ok = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(all_ok, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(RESULT_TAG + json.dumps({"latencies": latencies,
                                       "ok": bool(all_ok.item())}), flush=True)
    dist.destroy_process_group()
    return 0 if ok else 3


# --------------------------------------------------------------------------------------------
# driver


def available() -> None:
    """Raise :class:`BaselineUnavailable` unless torch (with gloo) can be imported."""
    if importlib.util.find_spec("torch") is None:
        raise BaselineUnavailable(INSTALL_HINT)


async def _stop(process: asyncio.subprocess.Process) -> None:
    """Terminate ``process`` (by its PID) if still running, then reap it; SIGCONT too, since
    a rank stopped by a failure run acts on SIGTERM only once it runs again."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
            process.send_signal(signal.SIGCONT)
        try:
            await asyncio.wait_for(process.wait(), KILL_GRACE)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    await process.wait()


class _Job:
    """One launch of every rank of a gloo run: rank 0 first (it prints its store's port),
    then the others; :meth:`stop` ends them all."""

    def __init__(self, testbed: Any, op: str, size: int, runs: int, tmp: str,
                 outcome_dir: str | None = None, interval: float = 0.0) -> None:
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, not {op!r}")
        if testbed.size < 2 or size < 4 or runs < 1:
            raise ValueError("need at least 2 hosts, size >= 4 and at least one run")
        available()
        self.testbed, self.op, self.size, self.runs = testbed, op, size, runs
        self.world = testbed.size
        # the last rank of a staggered run calls (world - 1) * interval late
        self.op_timeout = RUN_SLACK + self.world * (size / MIN_RATE_FOR_TIMEOUT + interval)
        self.outcome_dir = outcome_dir
        self.interval = interval
        self.logs = [os.path.join(tmp, f"rank{r}.log") for r in range(self.world)]
        self.processes: list[asyncio.subprocess.Process] = []

    def _argv(self, rank: int, port: int) -> list[str]:
        argv = [*self.testbed.exec_prefix(rank), *module_command("bench.baselines.gloo"),
                "--worker", "--rank", str(rank), "--world", str(self.world),
                "--master", self.testbed.hosts[0].ip, "--port", str(port), "--op", self.op,
                "--size", str(self.size), "--runs", str(self.runs),
                "--op-timeout", str(self.op_timeout)]
        if self.outcome_dir is not None:
            argv += ["--outcome-dir", self.outcome_dir]
        if self.interval > 0:
            argv += ["--interval", repr(self.interval)]
        return argv

    async def _start(self, rank: int, port: int) -> asyncio.subprocess.Process:
        env = dict(os.environ, GLOO_SOCKET_IFNAME=self.testbed.hosts[rank].ifname,
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        with open(self.logs[rank], "wb") as err:
            process = await asyncio.create_subprocess_exec(
                *self._argv(rank, port), env=env, cwd=REPO_ROOT,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if rank == 0 else asyncio.subprocess.DEVNULL,
                stderr=err)
        self.processes.append(process)
        return process

    def failure(self, what: str) -> RuntimeError:
        """An error saying ``what`` went wrong, with every rank's exit code and stderr."""
        codes = [p.returncode for p in self.processes]
        detail = "".join(f"\n--- rank {r} stderr ---\n{tail(self.logs[r])}"
                         for r in range(len(self.processes)) if tail(self.logs[r]).strip())
        return RuntimeError(f"gloo {self.op}: {what} (exit codes {codes}){detail}")

    async def start(self) -> asyncio.subprocess.Process:
        """Start every rank; rank 0's process (its stdout carries the result line)."""
        root = await self._start(0, 0)
        assert root.stdout is not None
        try:
            line = await asyncio.wait_for(root.stdout.readline(), START_TIMEOUT)
            port = int(json.loads(line)["port"])
        except (TimeoutError, ValueError, KeyError, TypeError):
            raise self.failure("rank 0 did not start its TCPStore") from None
        for rank in range(1, self.world):
            await self._start(rank, port)
        return root

    async def stop(self) -> None:
        """End every rank still running."""
        await asyncio.gather(*(_stop(p) for p in self.processes))


async def run(testbed: Any, op: str, size: int, repeat: int, warmup: int = 1,
              interval: float = 0.0) -> list[float]:
    """Latency in seconds of each of ``repeat`` gloo ``op``s of ``size`` bytes of float32
    (after ``warmup`` ones) over the hosts of ``testbed``, rank i in host i, root rank 0;
    ``interval``: rank i calls each one i · interval late, timed from the last call.

    Raises :class:`BaselineUnavailable` without torch, ``RuntimeError`` if a rank fails or a
    result is wrong.
    """
    if repeat < 1 or warmup < 0 or not 0 <= interval <= MAX_INTERVAL:
        raise ValueError(f"need repeat >= 1, warmup >= 0 and an interval in 0..{MAX_INTERVAL}")
    with tempfile.TemporaryDirectory(prefix="hoplite-gloo-") as tmp:
        job = _Job(testbed, op, size, warmup + repeat, tmp, interval=interval)
        total_timeout = START_TIMEOUT + job.runs * job.op_timeout
        try:
            root = await job.start()
            try:
                out, _ = await asyncio.wait_for(root.communicate(), total_timeout)
                codes = [await asyncio.wait_for(p.wait(), START_TIMEOUT)
                         for p in job.processes]
            except TimeoutError:
                raise job.failure(f"no result within {total_timeout:.0f} s") from None
            results = [json.loads(line[len(RESULT_TAG):])
                       for line in out.decode(errors="replace").splitlines()
                       if line.startswith(RESULT_TAG)]
            if any(codes) or not results:
                raise job.failure("a rank failed")
            if not results[-1]["ok"]:
                raise job.failure(f"wrong {op} result")
        finally:
            await job.stop()
    latencies = [float(t) for t in results[-1]["latencies"]]
    return latencies[warmup:]


async def run_failure(testbed: Any, op: str, size: int, failure: Failure,
                      warmup: int = 1) -> list[RankOutcome]:
    """``warmup`` ordinary runs of ``op``, then one in which ``failure`` strikes: every
    survivor's outcome (bench/baselines/failure.py). gloo's own timeout is ``op_timeout``."""
    if not 0 < failure.victim < testbed.size or warmup < 0:
        raise ValueError(f"the victim must be a rank in 1..{testbed.size - 1}; warmup >= 0")
    with tempfile.TemporaryDirectory(prefix="hoplite-gloo-") as tmp:
        outcome_dir = os.path.join(tmp, "outcomes")
        os.mkdir(outcome_dir)
        job = _Job(testbed, op, size, warmup + 1, tmp, outcome_dir)
        try:
            root = await job.start()
            return await watch(outcome_dir, job.world, failure,
                               START_TIMEOUT + job.runs * job.op_timeout,
                               asyncio.ensure_future(root.wait()))
        finally:
            await job.stop()


# --------------------------------------------------------------------------------------------
# command line


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: measure in a fresh test bed, or (``--worker``) be one rank."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:  # internal: one rank
        p = argparse.ArgumentParser()
        for name in ("--rank", "--world", "--port", "--size", "--runs"):
            p.add_argument(name, type=int, required=True)
        p.add_argument("--master", required=True)
        p.add_argument("--op", choices=OPS, required=True)
        p.add_argument("--op-timeout", type=float, required=True)
        p.add_argument("--outcome-dir", default=None)
        p.add_argument("--interval", type=float, default=0.0)
        a = p.parse_args(argv[1:])
        return worker(a.rank, a.world, a.master, a.port, a.op, a.size, a.runs, a.op_timeout,
                      a.outcome_dir, a.interval)
    args = cli_parser(__doc__.splitlines()[0]).parse_args(argv)
    try:
        asyncio.run(measure("gloo", run, args))
    except BaselineUnavailable as exc:
        print(f"unavailable: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
