"""OpenMPI through mpi4py: Bcast, Reduce, Allreduce and Gather on float32 numpy buffers.

``mpirun`` runs inside host 0's namespace (docs/design.md §7) with a hostfile naming every host's
198.18.x address (``slots=1``, so rank i lands in host i; each rank checks it) and a generated
``plm_rsh_agent`` script that maps the address OpenMPI passes it to the host's namespace and
runs the ``orted`` command there with ``ip netns exec NS sh -c``. Transport: ``pml ob1`` with
``btl tcp,self`` (no UCX, no shared memory: the namespaces share one kernel but must talk over
their links); ``btl_tcp_if_include``/``oob_tcp_if_include`` name the test bed's subnet, the
one interface-independent way to say "the veth" when every host's veth has its own name.
``--bind-to none``: every orted thinks it has the machine to itself and would pin its rank to
core 0. ``--leave-session-attached``: orteds stay children of their agent instead of
daemonizing, so one that dies makes mpirun abort (rather than wait for it forever) and its
stderr reaches mpirun's log.

A run (docs/design.md §7): every rank resets its buffers, passes ``Barrier()``, then times the
collective from its own barrier exit to its own completion; the run's latency is the maximum
over the ranks, collected after all runs with an untimed ``Allreduce(MAX)``. A staggered run
(``interval``) has rank i call it i · interval after the barrier, and times it from the last
rank's call to the last rank's end (bench/baselines/common.py). Every run's
result is checked (Bcast and Gather exactly, sums within float32 rounding).

Usage (root):  python -m bench.baselines.mpi --nodes 8 --rate 1Gbit --op broadcast --size 32MiB
From Python:   latencies = await run(testbed, "broadcast", size, repeat)
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
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
INSTALL_HINT = ("MPI baseline needs OpenMPI and mpi4py: apt-get install -y openmpi-bin "
                "libopenmpi-dev && pip install mpi4py")
START_TIMEOUT = 120.0  # mpirun, N orteds and N Python ranks up on a loaded 2-core machine
MIN_RATE_FOR_TIMEOUT = 10e6  # bytes/s: the run timeout assumes at least this per rank's data
RUN_SLACK = 20.0  # seconds per run on top of that (barrier, checks, a loaded machine)
KILL_GRACE = 10.0  # mpirun gets this long after SIGTERM to take its job down
RESULT_TAG = "MPI-RESULT "


# --------------------------------------------------------------------------------------------
# one rank (started by mpirun / orted inside its host's namespace)


def worker(hosts: Sequence[str], op: str, size: int, runs: int,
           outcome_dir: str | None = None, interval: float = 0.0) -> int:
    """Run ``runs`` timed ``op``s; rank 0 prints the result line. Exit code.
    ``outcome_dir``: the last run is a failure run (bench/baselines/failure.py);
    ``interval``: a staggered run (rank i calls the collective i · interval late)."""
    import numpy as np
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    placed = _is_local(hosts[rank]) if world == len(hosts) else False
    if not all(comm.allgather(placed)):  # every rank must sit in its own host
        if rank == 0:
            print(RESULT_TAG + json.dumps({"error": "ranks not placed one per host in order: "
                                           f"world {world}, hosts {list(hosts)}"}), flush=True)
        return 4
    log = None if outcome_dir is None else FailureLog(outcome_dir, rank)

    mine = float32_data(size, rank)
    n = mine.size
    buf = np.empty(n, dtype=np.float32)  # broadcast / reduce / allreduce result
    gathered = np.empty((world, n), dtype=np.float32) if rank == 0 else None
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
            return bool(np.array_equal(buf, expected))
        if op in ("reduce", "allreduce"):
            return sum_matches(buf, expected, world)
        assert gathered is not None
        return all(np.array_equal(gathered[r], expected[r]) for r in range(world))

    def collective() -> None:
        if op == "broadcast":
            comm.Bcast(buf, root=0)
        elif op == "reduce":
            comm.Reduce(mine, buf if rank == 0 else None, op=MPI.SUM, root=0)
        elif op == "allreduce":
            comm.Allreduce(mine, buf, op=MPI.SUM)
        else:
            comm.Gather(mine, gathered, root=0)

    starts, ends, ok = [], [], True
    for run_index in range(runs):
        if op == "broadcast":
            buf[:] = mine if rank == 0 else 0
        else:
            buf.fill(0)
        if gathered is not None:
            gathered.fill(0)
        comm.Barrier()
        if log is not None and run_index == runs - 1:
            log.failure_run(collective, check)
        wait_turn(rank, interval)
        starts.append(time.perf_counter())
        collective()
        ends.append(time.perf_counter())
        good = check() is not False
        if not good:
            print(f"mpi rank {rank}: wrong {op} result", file=sys.stderr, flush=True)
        ok = ok and good

    # not timed: the slowest rank per run (from the last call, if staggered), and whether
    # every rank got the right result
    if interval > 0:
        last = np.empty((2, runs), dtype=np.float64)
        comm.Allreduce(np.array([starts, ends], dtype=np.float64), last, op=MPI.MAX)
        latencies = from_last_call(last[0], last[1])
    else:
        worst = np.empty(runs, dtype=np.float64)
        comm.Allreduce(np.array(ends, dtype=np.float64) - np.array(starts, dtype=np.float64),
                       worst, op=MPI.MAX)
        latencies = worst.tolist()
    all_ok = comm.allreduce(1 if ok else 0, op=MPI.MIN)
    if rank == 0:
        print(RESULT_TAG + json.dumps({"latencies": latencies, "ok": bool(all_ok)}),
              flush=True)
    return 0 if ok else 3


def _is_local(ip: str) -> bool:
    """Is ``ip`` an address of this (namespace's) host?"""
    with socket.socket() as s:
        try:
            s.bind((ip, 0))
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------------------------
# driver


def available() -> str:
    """The path of ``mpirun``; raise :class:`BaselineUnavailable` unless it and mpi4py exist."""
    mpirun = shutil.which("mpirun")
    if mpirun is None or importlib.util.find_spec("mpi4py") is None:
        raise BaselineUnavailable(INSTALL_HINT)
    return mpirun


def _agent_script(testbed: Any, tmp: str) -> str:
    """OpenMPI's ``plm_rsh_agent``: called as ``agent HOST COMMAND...`` (like ssh), run
    COMMAND in the namespace of the host whose address is HOST. Each host's orted keeps its
    session directory under ``tmp``, apart from the others: on one machine they would all
    make /tmp/ompi.HOST.UID/jf.JOB at once, and one now and then fails with "File exists"
    (as an allreduce of 1 MiB in bench.compare shows)."""
    cases = "".join(f"    {shlex.quote(h.ip)}) ns={shlex.quote(h.netns)} ;;\n"
                    for h in testbed.hosts)
    sessions = shlex.quote(os.path.join(tmp, "sessions"))
    return ("#!/bin/sh\n"
            "# generated by bench/baselines/mpi.py: OpenMPI's rsh agent for an emulated test bed\n"
            "while [ $# -gt 0 ]; do case \"$1\" in -*) shift ;; *) break ;; esac; done\n"
            "host=$1\nshift\n"
            "case \"$host\" in\n" + cases +
            "    *) echo \"mpi agent: no test-bed host $host\" >&2; exit 1 ;;\n"
            "esac\n"
            f"dir={sessions}/\"$ns\"\n"
            "mkdir -p \"$dir\"\n"
            "exec ip netns exec \"$ns\" env OMPI_MCA_orte_tmpdir_base=\"$dir\" sh -c \"$*\"\n")


def _children() -> dict[int, list[int]]:
    """Parent PID → child PIDs, from /proc."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with (contextlib.suppress(OSError, IndexError, ValueError),
              open(f"/proc/{entry}/stat") as f):
            ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def _descendants(pid: int) -> list[int]:
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _tagged(token: str) -> list[int]:
    """PIDs of the live processes whose command line contains ``token`` (a path unique to
    one run: the orteds carry the agent's path, the ranks their ``--tag``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as f:
            if token.encode() in f.read():
                found.append(int(entry))
    return found


async def _stop(process: asyncio.subprocess.Process, token: str) -> None:
    """Take down ``mpirun`` and whatever it started, all by PID: its descendants, then any
    process still carrying ``token`` on its command line (an orted that daemonized or lost
    its parent, a rank of this run) with the processes under it."""
    if process.returncode is None:
        family = _descendants(process.pid)
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)  # mpirun forwards it and stops its job
        _signal_all(family, signal.SIGCONT)  # a rank stopped by a failure run, so it can act
        try:
            await asyncio.wait_for(process.wait(), KILL_GRACE)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        _signal_all(family, signal.SIGKILL)  # whatever it did not take down
    await process.wait()
    deadline = time.monotonic() + KILL_GRACE  # orteds exit on their own once mpirun is gone
    while True:
        left = _tagged(token)
        if not left:
            return
        if time.monotonic() > deadline:
            _signal_all(left + [d for pid in left for d in _descendants(pid)], signal.SIGKILL)
            return
        await asyncio.sleep(0.1)


def _describe(pids: Sequence[int]) -> str:
    """PID, state, kernel wait channel and command of each of ``pids`` (for a hang report)."""
    lines = []
    for pid in dict.fromkeys(pids):
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read().strip()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
            lines.append(f"  {pid} {state} {wchan} {cmd}")
    return "\n".join(lines)


def _signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


async def _launch(testbed: Any, op: str, size: int, runs: int, tmp: str,
                  outcome_dir: str | None = None,
                  interval: float = 0.0) -> tuple[asyncio.subprocess.Process, str, str]:
    """Start ``mpirun`` (in host 0) for ``runs`` runs of ``op``, its files in ``tmp``:
    (the process, its log's path, the token on every command line of the run). Its stdout
    carries the result line, except in a failure run (``outcome_dir``)."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, not {op!r}")
    if testbed.size < 2 or size < 4 or runs < 1:
        raise ValueError("need at least 2 hosts, size >= 4 and at least one run")
    mpirun = available()
    ips = [h.ip for h in testbed.hosts]
    agent = os.path.join(tmp, "agent.sh")
    with open(agent, "w") as f:
        f.write(_agent_script(testbed, tmp))
    os.chmod(agent, 0o700)
    hostfile = os.path.join(tmp, "hosts")
    with open(hostfile, "w") as f:
        f.write("".join(f"{ip} slots=1 max_slots=1\n" for ip in ips))
    log = os.path.join(tmp, "mpirun.log")
    token = tmp + os.sep  # in the command line of every process of this run but mpirun's
    mca = {"plm_rsh_agent": agent, "plm_rsh_no_tree_spawn": "1",
           "pml": "ob1", "btl": "tcp,self", "osc": "^ucx",
           "btl_tcp_if_include": testbed.subnet, "oob_tcp_if_include": testbed.subnet,
           # orteds segfault now and then (OpenMPI 4.1.4, Debian 12) writing the hwloc
           # topology into shared memory, when several start at once on one machine
           "rtc_hwloc_vmhole": "none"}
    argv = testbed.exec_prefix(0) + [
        mpirun, "--allow-run-as-root", "-np", str(testbed.size), "--hostfile", hostfile,
        "--map-by", "node", "--bind-to", "none", "--leave-session-attached",
        *(x for key, value in mca.items() for x in ("--mca", key, value)),
        "-x", "OMP_NUM_THREADS=1", "-x", "PYTHONUNBUFFERED=1",
        "--wdir", REPO_ROOT,  # ranks run `python -m bench...` from the repository root
        *module_command("bench.baselines.mpi"), "--worker",
        "--hosts", ",".join(ips), "--op", op, "--size", str(size), "--runs", str(runs),
        "--tag", token]
    if outcome_dir is not None:
        argv += ["--outcome-dir", outcome_dir]
    if interval > 0:
        argv += ["--interval", repr(interval)]
    with open(log, "wb") as err:
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE if outcome_dir is None else asyncio.subprocess.DEVNULL,
            stderr=err, cwd=tmp, start_new_session=True)
    return process, log, token


def _run_timeout(testbed: Any, size: int, runs: int, interval: float = 0.0) -> float:
    """How long ``runs`` runs may take, start included, before the job counts as hung."""
    return START_TIMEOUT + runs * (RUN_SLACK + testbed.size * (size / MIN_RATE_FOR_TIMEOUT
                                                               + interval))


async def run(testbed: Any, op: str, size: int, repeat: int, warmup: int = 1,
              interval: float = 0.0) -> list[float]:
    """Latency in seconds of each of ``repeat`` MPI ``op``s of ``size`` bytes of float32
    (after ``warmup`` ones) over the hosts of ``testbed``, rank i in host i, root rank 0;
    ``interval``: rank i calls each one i · interval late, timed from the last call.

    Raises :class:`BaselineUnavailable` without OpenMPI or mpi4py, ``RuntimeError`` if the
    job fails or a result is wrong.
    """
    if repeat < 1 or warmup < 0 or not 0 <= interval <= MAX_INTERVAL:
        raise ValueError(f"need repeat >= 1, warmup >= 0 and an interval in 0..{MAX_INTERVAL}")
    runs = warmup + repeat
    timeout = _run_timeout(testbed, size, runs, interval)
    with tempfile.TemporaryDirectory(prefix="hoplite-mpi-") as tmp:
        process, log, token = await _launch(testbed, op, size, runs, tmp, interval=interval)
        try:
            out, _ = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            stuck = _describe([process.pid, *_descendants(process.pid), *_tagged(token)])
            await _stop(process, token)
            raise RuntimeError(f"mpi {op}: no result within {timeout:.0f} s; processes:\n"
                               f"{stuck}\nmpirun said:\n{tail(log, 60)}") from None
        finally:
            await _stop(process, token)
        results = [json.loads(line[len(RESULT_TAG):])
                   for line in out.decode(errors="replace").splitlines()
                   if line.startswith(RESULT_TAG)]
        if not results or "error" in results[-1] or process.returncode != 0:
            what = results[-1].get("error", "") if results else "no result"
            raise RuntimeError(f"mpi {op} failed (mpirun exit {process.returncode}): {what}\n"
                               f"{tail(log, 60)}")
        if not results[-1]["ok"]:
            raise RuntimeError(f"mpi {op}: wrong result\n{tail(log, 60)}")
    return [float(t) for t in results[-1]["latencies"][warmup:]]


async def run_failure(testbed: Any, op: str, size: int, failure: Failure,
                      warmup: int = 1) -> list[RankOutcome]:
    """``warmup`` ordinary runs of ``op``, then one in which ``failure`` strikes the victim
    rank's process: every survivor's outcome (bench/baselines/failure.py)."""
    if not 0 < failure.victim < testbed.size or warmup < 0:
        raise ValueError(f"the victim must be a rank in 1..{testbed.size - 1}; warmup >= 0")
    with tempfile.TemporaryDirectory(prefix="hoplite-mpi-") as tmp:
        outcome_dir = os.path.join(tmp, "outcomes")
        os.mkdir(outcome_dir)
        process, _, token = await _launch(testbed, op, size, warmup + 1, tmp, outcome_dir)
        try:
            return await watch(outcome_dir, testbed.size, failure,
                               _run_timeout(testbed, size, warmup + 1),
                               asyncio.ensure_future(process.wait()))
        finally:
            await _stop(process, token)


# --------------------------------------------------------------------------------------------
# command line


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: measure in a fresh test bed, or (``--worker``) be one rank."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:  # internal: one rank, started by mpirun
        import argparse

        p = argparse.ArgumentParser()
        p.add_argument("--hosts", required=True)
        p.add_argument("--op", choices=OPS, required=True)
        p.add_argument("--size", type=int, required=True)
        p.add_argument("--runs", type=int, required=True)
        p.add_argument("--tag", default="", help="ignored: marks this run's processes")
        p.add_argument("--outcome-dir", default=None)
        p.add_argument("--interval", type=float, default=0.0)
        a = p.parse_args(argv[1:])
        return worker(a.hosts.split(","), a.op, a.size, a.runs, a.outcome_dir, a.interval)
    args = cli_parser(__doc__.splitlines()[0]).parse_args(argv)
    try:
        asyncio.run(measure("mpi", run, args))
    except BaselineUnavailable as exc:
        print(f"unavailable: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
