"""Asynchronous SGD with a parameter server (a Hoplite paper app), on Ray or Ray + Hoplite.

One worker actor per Ray node keeps computing a gradient (a float32 array of the model's size,
synthetic and cheap) from the latest weights it was given and pushing it; the parameter server
(an actor on the head node) takes the FIRST k gradients pushed, adds them, applies the update
and shares the new weights, which the workers whose gradients it used fetch before their next
gradient; the other workers' gradients stay in the running for the next update.

- Ray: each gradient is the return value of the worker's call; the server ``ray.wait``s for k
  of them, ``ray.get``s them and adds them up; the weights are ``ray.put`` once and
  ``ray.get`` by each worker.
- Hoplite: the server names each gradient's id up front and the worker puts it there; one
  ``reduce(ids, "sum", num_objects=k)`` sums the first k ready, in a tree ending at the
  server; the weights are put once and every worker gets them.

Every sum is compared with the exact expected one (gradients are small integers in float32),
and every worker checks the weights it fetched against the server's CRC-32. With
``--kill-node K`` the server goes on with the surviving workers (k shrinks if fewer are left).
Reports updates per second (before and after the kill).

Usage: python -m bench.apps.async_sgd --system ray|hoplite [--smoke] [--nodes N] [--size S]
       [--iterations I] [--k K] [--kill-node K --kill-after T]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
from numpy.typing import NDArray

from bench.apps.common import (
    Actor,
    Call,
    Coordinator,
    Crew,
    Progress,
    Setup,
    check_digest,
    check_equal,
    digest,
    drive,
    fetch_retrying,
    integers,
    main,
    parser,
)
from bench.apps.transport import Handle, TransportError, make_transport

APP = "async_sgd"
PATTERN_SEED = 1  # the gradients' common shape: worker i's gradient is PATTERN * a + b
MAX_RETRIES = 20
LEARNING_RATE = 0.01


class Worker(Actor):
    """Computes gradients from the weights it is sent, one call at a time."""

    def __init__(self, system: str, size: int) -> None:
        self.transport = make_transport(system)
        self.pattern = integers(size, PATTERN_SEED)

    @ray.method(num_returns=2)
    def gradient(self, weights: list[Handle], crc: int, readers: int, coef: tuple[int, int],
                 slot: Any, timeout: float) -> tuple[bool, NDArray[Any] | None]:
        """Fetch and check the weights, push the gradient ``PATTERN * a + b``."""
        w = fetch_retrying(self.transport, weights[0], timeout, readers)
        check_digest(w, crc, "the weights a worker fetched")
        del w
        a, b = coef
        grad = self.pattern * np.float32(a) + np.float32(b)
        return True, self.transport.output(grad, slot)


@dataclass(eq=False)
class Pending:
    """A gradient being computed or pushed and not used yet."""

    call: Call
    handle: Handle
    coef: tuple[int, int]
    version: int  # of the weights it was computed from


class ParameterServer(Coordinator):
    """Sums the first k gradients, updates the weights, shares them (:meth:`run`)."""

    def __init__(self, system: str, size: int, k: int, timeout: float, iterations: int,
                 kill_after: float | None) -> None:
        self.transport = make_transport(system)
        self.size, self.k, self.timeout = size, k, timeout
        self.pattern = integers(size, PATTERN_SEED)
        self.progress = Progress(iterations, kill_after)
        self.rng = np.random.default_rng(7)

    def run(self, workers: list[Any]) -> dict[str, Any]:
        """Update until done; the throughput report."""
        crew = Crew(workers)
        weights = np.zeros(self.size // 4, dtype=np.float32)
        version = 0
        shared: dict[int, tuple[Handle, int]] = {0: (self.transport.share(weights),
                                                     digest(weights))}
        pending = [self._submit(crew, i, version, shared[version], len(crew))
                   for i in range(len(crew))]
        while not self.progress.done():
            crew.check([p.call for p in pending])
            pending = [p for p in pending if p.call.ok is not False and p.call.actor in crew.alive]
            if not crew.alive:
                raise RuntimeError("every worker died")
            k = min(self.k, len(crew.alive))
            calls = [p.call for p in pending]
            try:
                reduced = self.transport.sum_first([p.handle for p in pending], k, self.timeout,
                                                   crew.waiter(calls, k))
            except TransportError:
                self.progress.retries += 1
                if self.progress.retries > MAX_RETRIES:
                    raise
                continue
            used = [pending[i] for i in reduced.used]
            a = sum(p.coef[0] for p in used)
            b = sum(p.coef[1] for p in used)
            check_equal(reduced.total, self.pattern * np.float32(a) + np.float32(b),
                        f"the sum of {k} gradients")
            weights -= np.float32(LEARNING_RATE / k) * reduced.total  # shared copies stay
            del reduced
            version += 1
            shared[version] = (self.transport.share(weights), digest(weights))
            self.progress.record()
            pending = [p for p in pending if p not in used]
            self.transport.free([p.handle for p in used])
            stale = [v for v in shared if v != version and all(p.version != v for p in pending)]
            self.transport.free([shared.pop(v)[0] for v in stale])
            pending += [self._submit(crew, p.call.actor, version, shared[version], k)
                        for p in used]
        crew.wait([p.call for p in pending], self.timeout)  # let the last pushes land
        self.transport.free([p.handle for p in pending if p.call.ok]
                            + [h for h, _ in shared.values()])
        return {**self.progress.summary(), "k": self.k,
                "workers": len(crew), "workers_left": crew.census(self.timeout)}

    def _submit(self, crew: Crew, i: int, version: int, weights: tuple[Handle, int],
                readers: int) -> Pending:
        """Ask worker ``i`` for a gradient computed from weights ``version``."""
        coef = (int(self.rng.integers(1, 9)), int(self.rng.integers(-8, 9)))
        slot = self.transport.slot()
        status, returned = crew.actors[i].gradient.remote([weights[0]], weights[1], readers,
                                                          coef, slot, self.timeout)
        return Pending(Call(i, status), self.transport.handle(returned, slot), coef, version)


def run(setup: Setup, args: argparse.Namespace) -> dict[str, Any]:
    """One run of the app on ``setup``; its JSON result."""
    k = args.k or max(1, (len(setup.nodes) + 1) // 2)
    workers = Crew.start(ray.remote(Worker), setup.nodes, setup.system, setup.size)
    try:
        servers = Crew.start(ray.remote(ParameterServer), setup.nodes[:1], setup.system,
                             setup.size, k, setup.timeout, setup.iterations, setup.kill_window)
        try:
            server = servers.actors[0]
            values = drive(setup, server, server.run.remote(workers.actors))
        finally:
            servers.stop()
    finally:
        workers.stop()
    return setup.result(APP, "updates/s", values)


def arguments() -> argparse.ArgumentParser:
    """The app's command line."""
    p = parser(__doc__ or APP, iterations=50, smoke_iterations=20)
    p.add_argument("--k", type=int, default=None,
                   help="gradients per update (default: half the workers, rounded up)")
    return p


def describe(values: dict[str, Any]) -> str:
    """The result's details, in a few words."""
    return f"k={values['k']}, workers left {values['workers_left']}/{values['workers']}"


def cli() -> int:
    """The command line: one run, its result as one JSON line."""
    return main(f"bench.apps.{APP}", run, arguments().parse_args())


if __name__ == "__main__":
    sys.exit(cli())
