"""The gloo (torch.distributed) and OpenMPI (mpi4py) baselines in a small emulated test bed.

The test-bed tests need root, iproute2 and the baseline's packages; without them they are
skipped with the install hint, so the suite passes on a machine without these heavy packages.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import sys
import time
from types import SimpleNamespace

import numpy as np
import pytest

from bench.baselines import gloo, mpi
from bench.baselines.common import (
    REPO_ROOT,
    BaselineUnavailable,
    expected_sum,
    float32_data,
    from_last_call,
    sum_matches,
    wait_turn,
)
from bench.baselines.failure import Failure, watch
from bench.compare import parse_case
from hoplite_client.wire.units import parse_size
from hoplited.tools.scenarios import optimum
from hoplited.tools.testbed import Testbed, netns_pids

MBIT = 1_000_000
NODES = 3
SIZE = 2 << 20
REPEAT = 2
OPS = ("broadcast", "reduce", "allreduce", "gather")


def _skip_reason(name: str) -> str | None:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return "the emulated test bed needs root and iproute2 (ip, tc)"
    if name == "gloo" and importlib.util.find_spec("torch") is None:
        return gloo.INSTALL_HINT
    if name == "mpi" and (shutil.which("mpirun") is None
                          or importlib.util.find_spec("mpi4py") is None):
        return mpi.INSTALL_HINT
    return None


# --------------------------------------------------------------------------------------------
# helpers (no test bed)


def test_float32_data_is_deterministic_and_differs_per_rank() -> None:
    a, b = float32_data(4096, 0), float32_data(4096, 1)
    assert a.dtype == np.float32 and a.size == 1024
    assert np.array_equal(a, float32_data(4096, 0)) and not np.array_equal(a, b)
    assert float(a.min()) >= 0.0 and float(a.max()) < 1.0


def test_sum_check_tolerates_rounding_but_not_errors() -> None:
    nodes, size = 8, 1 << 16
    expected = expected_sum(size, nodes)
    as_float32 = np.zeros(size // 4, dtype=np.float32)
    for rank in reversed(range(nodes)):  # another order, float32 accumulation
        as_float32 += float32_data(size, rank)
    assert sum_matches(as_float32, expected, nodes)
    wrong = as_float32.copy()
    wrong[123] += 0.01
    assert not sum_matches(wrong, expected, nodes)
    assert not sum_matches(as_float32[:-1], expected, nodes)


def test_optimum_and_sizes() -> None:
    """The baselines' command lines share hoplite's parse_size and optimum (docs/design.md §7)."""
    assert parse_size("32MiB") == 32 << 20 and parse_size("2MB") == 2_000_000
    s = 32 << 20
    assert optimum("broadcast", s, 8, 1e9) == pytest.approx(s * 8 / 1e9)
    assert optimum("reduce", s, 8, 1e9) == pytest.approx(s * 8 / 1e9)
    assert optimum("allreduce", s, 8, 1e9) == pytest.approx(2 * s * 8 / 1e9)
    assert optimum("gather", s, 8, 1e9) == pytest.approx(7 * s * 8 / 1e9)


@pytest.mark.parametrize("text, case", [
    ("broadcast:32MiB", ("broadcast", 32 << 20, 0.0)),
    ("allreduce:32MiB@0.1", ("allreduce", 32 << 20, 0.1)),
    ("reduce:1MiB@0", ("reduce", 1 << 20, 0.0)),
])
def test_a_compare_case_names_its_op_size_and_interval(text: str,
                                                       case: tuple[str, int, float]) -> None:
    assert parse_case(text) == case


@pytest.mark.parametrize("text", ["broadcast:1MiB@0.1", "gather:1MiB@0.1", "allreduce:1MiB@-1",
                                  "allreduce:1MiB@nan", "allreduce:1MiB@11", "allreduce:1MiB@x"])
def test_a_compare_case_refuses_inputs_apart_where_they_cannot_be(text: str) -> None:
    with pytest.raises(ValueError):
        parse_case(text)


def test_a_staggered_run_is_timed_from_the_last_call() -> None:
    starts, ends = np.array([10.0, 20.0]), np.array([10.5, 20.25])
    assert from_last_call(starts, ends) == [0.5, 0.25]
    before = time.perf_counter()
    wait_turn(0, 5.0)  # rank 0 never waits
    wait_turn(3, 0.01)
    assert time.perf_counter() - before >= 0.03


async def test_missing_packages_raise_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = SimpleNamespace(size=NODES)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(BaselineUnavailable, match="pip install torch==2.13.0"):
        await gloo.run(fake, "broadcast", SIZE, 1)
    with pytest.raises(BaselineUnavailable, match="apt-get install"):
        await mpi.run(fake, "broadcast", SIZE, 1)


# --------------------------------------------------------------------------------------------
# in the emulated test bed


async def _no_process_left(tb: Testbed) -> None:
    """Every rank, orted and mpirun has gone from the hosts (zombies aside, briefly)."""
    deadline = time.monotonic() + 10
    while True:
        left = {h.netns: netns_pids(h.netns) for h in tb.hosts}
        if not any(left.values()):
            return
        assert time.monotonic() < deadline, f"processes left in the test bed: {left}"
        await asyncio.sleep(0.2)


@pytest.mark.parametrize("name", ["gloo", "mpi"])
@pytest.mark.parametrize("op", OPS)
async def test_baseline_in_testbed(name: str, op: str) -> None:
    reason = _skip_reason(name)
    if reason:
        pytest.skip(reason)
    baseline = {"gloo": gloo, "mpi": mpi}[name]
    async with Testbed(NODES, 500 * MBIT) as tb:
        latencies = await baseline.run(tb, op, SIZE, REPEAT, warmup=1)
        await _no_process_left(tb)
    assert len(latencies) == REPEAT
    assert all(t > 0 for t in latencies)
    # sanity only (the machine is shared): nothing beats the links by much
    best = optimum(op, SIZE, NODES, 500 * MBIT)
    ring = {"allreduce": (NODES - 1) / NODES}.get(op, 1.0)  # ring allreduce: 2(N-1)/N · S
    assert min(latencies) > 0.5 * ring * best


@pytest.mark.parametrize("name", ["gloo", "mpi"])
async def test_a_staggered_allreduce_in_testbed(name: str) -> None:
    """Ranks called 0.2 s apart: every run's result is checked (by the ranks) and timed from
    the last call; a sanity bound only, the machine is shared."""
    reason = _skip_reason(name)
    if reason:
        pytest.skip(reason)
    baseline = {"gloo": gloo, "mpi": mpi}[name]
    async with Testbed(NODES, 500 * MBIT) as tb:
        latencies = await baseline.run(tb, "allreduce", SIZE, REPEAT, warmup=1, interval=0.2)
        await _no_process_left(tb)
    assert len(latencies) == REPEAT
    ring = (NODES - 1) / NODES * optimum("allreduce", SIZE, NODES, 500 * MBIT)
    assert all(t > 0.5 * ring for t in latencies)


# --------------------------------------------------------------------------------------------
# failure runs (bench/baselines/failure.py)

RANK_SCRIPT = """
import os, sys, time
from bench.baselines.failure import FailureLog
directory, rank, role = sys.argv[1], int(sys.argv[2]), sys.argv[3]
log = FailureLog(directory, rank)
if role == "starter":  # as after a barrier: every rank has written its pid
    while len([n for n in os.listdir(directory) if n.startswith("pid.")]) < int(sys.argv[4]):
        time.sleep(0.01)
    log.failure_run(lambda: time.sleep(0.2), lambda: True)
elif role == "error":
    log.failed(0.1, RuntimeError("Connection closed by peer"))
elif role == "exit":
    time.sleep(0.5)
    sys.exit(1)
log.park()
"""


async def test_failure_watch_signals_the_victim_and_tells_every_end_apart(
        tmp_path: os.PathLike[str]) -> None:
    """Real processes as ranks: a result, the victim (killed), an error, an exit, a hang."""
    roles = ["starter", "victim", "error", "exit", "hang"]
    directory = str(tmp_path)
    procs = [await asyncio.create_subprocess_exec(
        *module_command_for_script(), directory, str(rank), role, str(len(roles)),
        cwd=REPO_ROOT) for rank, role in enumerate(roles)]
    try:
        outcomes = await watch(directory, len(roles), Failure(1, 0.1, "KILL", patience=2.0),
                               start_timeout=60, launcher_done=asyncio.Future())
        assert await asyncio.wait_for(procs[1].wait(), 10) == -9  # the victim got SIGKILL
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
            await p.wait()
    assert [(o.rank, o.what) for o in outcomes] == [
        (0, "correct"), (2, "error"), (3, "exited"), (4, "hung")]
    assert outcomes[0].seconds is not None and outcomes[0].seconds >= 0.2
    assert "Connection closed" in outcomes[1].detail
    assert outcomes[3].seconds is None


def module_command_for_script() -> list[str]:
    """``python -c RANK_SCRIPT``: a stand-in rank that imports bench from the repository root."""
    return [sys.executable, "-c", RANK_SCRIPT]


def test_failure_spec_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="signal"):
        Failure(1, 1.0, "HUP")
    with pytest.raises(ValueError):
        Failure(1, float("nan"))
    with pytest.raises(ValueError):
        Failure(1, 1.0, patience=0)


@pytest.mark.parametrize("name", ["gloo", "mpi"])
@pytest.mark.parametrize("sig", ["KILL", "STOP"])
async def test_baseline_failure_run_in_testbed(name: str, sig: str) -> None:
    """A rank killed or stopped mid-allreduce: every survivor has an outcome of a known kind,
    and nothing of the run is left in the test bed afterwards."""
    reason = _skip_reason(name)
    if reason:
        pytest.skip(reason)
    baseline = {"gloo": gloo, "mpi": mpi}[name]
    async with Testbed(NODES, 100 * MBIT) as tb:
        outcomes = await baseline.run_failure(tb, "allreduce", 16 << 20,
                                              Failure(1, 0.05, sig, patience=15.0))
        await _no_process_left(tb)
    assert [o.rank for o in outcomes] == [0, 2]
    assert all(o.what in ("correct", "error", "exited", "hung") for o in outcomes)
