"""torch.distributed with the gloo backend: broadcast, reduce, allreduce and gather.

One process per host of the emulated test bed (rank i in host i's namespace), gloo bound to
the host's veth (``GLOO_SOCKET_IFNAME``). Rank 0 creates the rendezvous ``TCPStore`` on its
198.18.x address with port 0 and prints the port it got; the other ranks are started with it.

A run (docs/design.md §7): every rank resets its inputs, passes ``dist.barrier()``, then times the
collective from its own barrier exit to its own completion; the run's latency is the maximum
of these over the ranks, collected after all runs with an all_reduce(MAX) that is not timed.
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
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from bench.baselines.common import (
    OPS,
    REPO_ROOT,
    BaselineUnavailable,
    cli_parser,
    expected_sum,
    float32_data,
    measure,
    module_command,
    sum_matches,
)
from bench.baselines.procs import tail

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
           runs: int, op_timeout: float) -> int:
    """Run ``runs`` timed ``op``s as ``rank``; rank 0 prints the result line. Exit code."""
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
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

    durations, ok = [], True
    for _ in range(runs):
        # inputs for this run (the collectives work in place)
        if op == "broadcast" and rank:
            buf_np.fill(0)
        else:
            buf_np[:] = mine
        if gathered is not None:
            for g in gathered:
                g.zero_()
        dist.barrier()
        t0 = time.perf_counter()
        if op == "broadcast":
            dist.broadcast(buf, src=0)
        elif op == "reduce":
            dist.reduce(buf, dst=0, op=dist.ReduceOp.SUM)
        elif op == "allreduce":
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
        else:
            dist.gather(buf, gather_list=gathered, dst=0)
        durations.append(time.perf_counter() - t0)
        if expected is None:
            continue
        if op == "broadcast":
            good = bool(np.array_equal(buf_np, expected))
        elif op in ("reduce", "allreduce"):
            good = sum_matches(buf_np, expected, world)
        else:
            assert gathered is not None
            good = all(np.array_equal(g.numpy(), e)
                       for g, e in zip(gathered, expected, strict=True))
        if not good:
            print(f"gloo rank {rank}: wrong {op} result", file=sys.stderr, flush=True)
        ok = ok and good

    # not timed: the slowest rank per run, and whether every rank got the right result
    worst = torch.tensor(durations, dtype=torch.float64)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    all_ok = torch.tensor([1 if ok else 0], dtype=torch.int32)
    dist.all_reduce(all_ok, op=dist.ReduceOp.MIN)
    if rank == 0:
        print(RESULT_TAG + json.dumps({"latencies": worst.tolist(),
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
    """Terminate ``process`` (by its PID) if still running, then reap it."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), KILL_GRACE)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
    await process.wait()


async def run(testbed: Any, op: str, size: int, repeat: int, warmup: int = 1) -> list[float]:
    """Latency in seconds of each of ``repeat`` gloo ``op``s of ``size`` bytes of float32
    (after ``warmup`` ones) over the hosts of ``testbed``, rank i in host i, root rank 0.

    Raises :class:`BaselineUnavailable` without torch, ``RuntimeError`` if a rank fails or a
    result is wrong.
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, not {op!r}")
    world = testbed.size
    if world < 2 or size < 4 or repeat < 1 or warmup < 0:
        raise ValueError("need at least 2 hosts, size >= 4, repeat >= 1 and warmup >= 0")
    available()
    runs = warmup + repeat
    op_timeout = RUN_SLACK + world * size / MIN_RATE_FOR_TIMEOUT
    total_timeout = START_TIMEOUT + runs * op_timeout
    master = testbed.hosts[0].ip
    me = module_command("bench.baselines.gloo") + ["--worker"]

    def argv(rank: int, port: int) -> list[str]:
        return [*testbed.exec_prefix(rank), *me,
                "--rank", str(rank), "--world", str(world), "--master", master,
                "--port", str(port), "--op", op, "--size", str(size), "--runs", str(runs),
                "--op-timeout", str(op_timeout)]

    def env(rank: int) -> dict[str, str]:
        return dict(os.environ, GLOO_SOCKET_IFNAME=testbed.hosts[rank].ifname,
                    OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    processes: list[asyncio.subprocess.Process] = []
    with tempfile.TemporaryDirectory(prefix="hoplite-gloo-") as tmp:
        logs = [os.path.join(tmp, f"rank{r}.log") for r in range(world)]

        async def start(rank: int, port: int) -> asyncio.subprocess.Process:
            with open(logs[rank], "wb") as err:
                process = await asyncio.create_subprocess_exec(
                    *argv(rank, port), env=env(rank), cwd=REPO_ROOT,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE if rank == 0 else asyncio.subprocess.DEVNULL,
                    stderr=err)
            processes.append(process)
            return process

        def failure(what: str) -> RuntimeError:
            codes = [p.returncode for p in processes]
            detail = "".join(f"\n--- rank {r} stderr ---\n{tail(logs[r])}"
                             for r in range(len(processes)) if tail(logs[r]).strip())
            return RuntimeError(f"gloo {op}: {what} (exit codes {codes}){detail}")

        try:
            root = await start(0, 0)
            assert root.stdout is not None
            try:
                line = await asyncio.wait_for(root.stdout.readline(), START_TIMEOUT)
                port = int(json.loads(line)["port"])
            except (TimeoutError, ValueError, KeyError, TypeError):
                await _stop(root)
                raise failure("rank 0 did not start its TCPStore") from None
            for rank in range(1, world):
                await start(rank, port)
            try:
                out, _ = await asyncio.wait_for(root.communicate(), total_timeout)
                codes = [await asyncio.wait_for(p.wait(), START_TIMEOUT) for p in processes]
            except TimeoutError:
                raise failure(f"no result within {total_timeout:.0f} s") from None
            results = [json.loads(line[len(RESULT_TAG):])
                       for line in out.decode(errors="replace").splitlines()
                       if line.startswith(RESULT_TAG)]
            if any(codes) or not results:
                raise failure("a rank failed")
            if not results[-1]["ok"]:
                raise failure(f"wrong {op} result")
        finally:
            await asyncio.gather(*(_stop(p) for p in processes))
    latencies = [float(t) for t in results[-1]["latencies"]]
    return latencies[warmup:]


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
        a = p.parse_args(argv[1:])
        return worker(a.rank, a.world, a.master, a.port, a.op, a.size, a.runs, a.op_timeout)
    args = cli_parser(__doc__.splitlines()[0]).parse_args(argv)
    try:
        asyncio.run(measure("gloo", run, args))
    except BaselineUnavailable as exc:
        print(f"unavailable: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
