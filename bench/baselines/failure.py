"""Failure runs of the baselines: one collective while a rank is killed or stopped.

The same experiment as ``hoplite bench OP --kill-node I --kill-after S --signal KILL|STOP``
(docs/design.md §8), for the systems hoplite is compared with. A rank's side is
:class:`FailureLog`: it records its process id, rank 0 marks the start of the failure run
(right after its barrier), and every rank records its outcome — the time it held its checked
result, or the error its collective raised — then parks, so that a rank that finished never
changes what the others see (an MPI rank that exits makes mpirun abort the job; a gloo rank
that exits closes its connections). The driver's side is :func:`watch`: it waits for the
start mark, signals the victim's process ``after`` seconds later, and collects every
survivor's outcome, counting one that neither answered nor exited within ``patience``
seconds of the signal as hung. Ranks are then stopped by the baseline's own teardown.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from bench.baselines.procs import alive, proc_stat

SIGNALS = {"KILL": signal.SIGKILL, "STOP": signal.SIGSTOP}
POLL = 0.01  # seconds between looks at the outcome directory
START_MARK = "start"


@dataclass(frozen=True)
class Failure:
    """What to do to whom: ``signal`` (KILL or STOP) to rank ``victim`` ``after`` seconds
    into the run; a survivor with nothing ``patience`` seconds after the signal is hung."""

    victim: int
    after: float
    signal: str = "KILL"
    patience: float = 60.0

    def __post_init__(self) -> None:
        if self.signal not in SIGNALS:
            raise ValueError(f"signal must be one of {sorted(SIGNALS)}, not {self.signal!r}")
        if not (self.after >= 0 and self.patience > 0):  # also refuses NaN
            raise ValueError("need after >= 0 and patience > 0")


@dataclass
class RankOutcome:
    """One survivor of a failure run. ``what``: correct, wrong, returned (its call returned and
    it has no result to check: a reduce's non-root), error (its collective raised),
    exited (ended with no outcome: killed by its launcher) or hung (nothing within the
    patience). ``seconds``: since the run started — the rank's own clock for a result or an
    error, the driver's (from the start mark) for an exit; None when hung."""

    rank: int
    what: str
    seconds: float | None = None
    detail: str = ""


# --------------------------------------------------------------------------------------------
# a rank's side


class FailureLog:
    """A rank's record of a failure run, as small files in the run's outcome directory."""

    def __init__(self, directory: str, rank: int) -> None:
        self.directory = directory
        self.rank = rank
        self._write(f"pid.{rank}", {"pid": os.getpid()})

    def _write(self, name: str, data: dict[str, Any]) -> None:
        """Write ``name`` whole or not at all (the driver may look at any moment)."""
        path = os.path.join(self.directory, name)
        with open(path + ".tmp", "w") as f:
            json.dump(data, f)
        os.replace(path + ".tmp", path)

    def failure_run(self, collective: Callable[[], None], check: Callable[[], bool | None]
                    ) -> NoReturn:
        """Right after the barrier: run ``collective`` as the failure run (rank 0 marks its
        start), record how it ended, then park. Whatever the system raises is the result."""
        t0 = time.perf_counter()
        if self.rank == 0:
            self._write(START_MARK, {"rank": self.rank})
        try:
            collective()
        except Exception as exc:
            self.failed(time.perf_counter() - t0, exc)
        else:
            self.done(time.perf_counter() - t0, check())
        self.park()

    def done(self, seconds: float, ok: bool | None) -> None:
        """The collective returned after ``seconds``; ``ok``: its result checked out (None:
        this rank receives no result to check, e.g. a reduce's non-root)."""
        what = "returned" if ok is None else "correct" if ok else "wrong"
        self._write(f"outcome.{self.rank}", {"what": what, "seconds": seconds})

    def failed(self, seconds: float, exc: BaseException) -> None:
        """The collective raised ``exc`` after ``seconds``."""
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        self._write(f"outcome.{self.rank}", {"what": "error", "seconds": seconds,
                                              "detail": detail})

    @staticmethod
    def park() -> NoReturn:
        """Wait to be stopped by the driver, leaving the other ranks undisturbed."""
        while True:
            time.sleep(3600)


# --------------------------------------------------------------------------------------------
# the driver's side


def _read(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            data: dict[str, Any] = json.load(f)
            return data
    except (OSError, ValueError):
        return None


async def watch(directory: str, world: int, failure: Failure, start_timeout: float,
                launcher_done: asyncio.Future[Any] | asyncio.Task[Any]) -> list[RankOutcome]:
    """Signal the victim ``failure.after`` s after rank 0's start mark in ``directory`` and
    collect the survivors' outcomes (rank order). RuntimeError if the run never started
    (``launcher_done``: the launcher ended first, or ``start_timeout`` passed)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + start_timeout
    start_path = os.path.join(directory, START_MARK)
    while not os.path.exists(start_path):
        if launcher_done.done() or loop.time() > deadline:
            raise RuntimeError("the failure run never started (see the ranks' logs)")
        await asyncio.sleep(POLL)
    t0 = loop.time()
    procs: dict[int, dict[int, int]] = {}
    for rank in range(world):
        info = _read(os.path.join(directory, f"pid.{rank}"))
        stat = None if info is None else proc_stat(int(info["pid"]))
        if info is None or stat is None:
            raise RuntimeError(f"rank {rank} has no live process at the start")
        procs[rank] = {int(info["pid"]): stat[1]}
    await asyncio.sleep(max(0.0, t0 + failure.after - loop.time()))
    for pid in alive(procs[failure.victim]):
        os.kill(pid, SIGNALS[failure.signal])
    give_up = loop.time() + failure.patience
    outcomes: dict[int, RankOutcome] = {}
    survivors = [r for r in range(world) if r != failure.victim]
    while len(outcomes) < len(survivors) and loop.time() < give_up:
        for rank in survivors:
            if rank in outcomes:
                continue
            data = _read(os.path.join(directory, f"outcome.{rank}"))
            if data is not None:
                outcomes[rank] = RankOutcome(rank, str(data["what"]), float(data["seconds"]),
                                             str(data.get("detail", "")))
            elif not alive(procs[rank]):
                outcomes[rank] = RankOutcome(rank, "exited", loop.time() - t0,
                                             "ended with no outcome")
        await asyncio.sleep(POLL)
    for rank in survivors:
        outcomes.setdefault(rank, RankOutcome(
            rank, "hung", None, f"nothing {failure.patience:.0f} s after the signal"))
    return [outcomes[r] for r in survivors]
