"""Ensemble model serving (a Hoplite paper app), on Ray or on Ray + Hoplite.

A frontend (an actor on the head node) loads a model (a float32 array of ``--size`` bytes)
into one replica actor per Ray node: it shares the model once and every replica fetches it.
Then each query (a float32 array of ``--query-size`` bytes) is fanned out to every replica;
each computes its output (an array of the query's size, from the query and its model) and the
frontend sums the outputs of all replicas, the ensemble's answer.

- Ray: the model and each query are ``ray.put`` once and ``ray.get`` by every replica; the
  outputs are the replicas' return values, each ``ray.get`` by the frontend and added there;
- Hoplite: the model and each query are put once and every replica gets them; the outputs go
  under ids the frontend chose, and one ``reduce(ids, "sum")`` adds them in a tree ending at
  the frontend.

Every replica checks the model and the query it fetched against the frontend's CRC-32, and
the frontend compares every ensemble output with the exact expected one (small integers in
float32). With ``--kill-node K`` the replicas on the dead node are dropped: a query they did
not answer is asked again of the others. Reports the model-load latency of each load, and
query latency and throughput (before and after the kill).

Usage: python -m bench.apps.serving --system ray|hoplite [--smoke] [--nodes N] [--size S]
       [--query-size Q] [--loads L] [--iterations QUERIES] [--kill-node K --kill-after T]
"""

from __future__ import annotations

import argparse
import sys
import time
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
    latency_stats,
    main,
    parser,
)
from bench.apps.transport import Handle, TransportError, make_transport
from hoplite_client.wire.units import parse_size

APP = "serving"
MODEL_SEED = 3
MAX_RETRIES = 20


class Replica(Actor):
    """Holds a model and answers queries with it."""

    def __init__(self, system: str) -> None:
        self.transport = make_transport(system)
        self.model: NDArray[Any] | None = None

    def load(self, model: list[Handle], crc: int, readers: int, timeout: float) -> bool:
        """Fetch the model, check it and keep it."""
        self.model = None
        m = fetch_retrying(self.transport, model[0], timeout, readers)
        check_digest(m, crc, "the model a replica fetched")
        self.model = m
        return True

    @ray.method(num_returns=2)
    def infer(self, query: list[Handle], crc: int, readers: int, coef: tuple[int, int],
              slot: Any, timeout: float) -> tuple[bool, NDArray[Any] | None]:
        """Fetch and check the query; output ``(query + model[:n]) * a + b``."""
        if self.model is None:
            raise RuntimeError("a query before the model was loaded")
        q = fetch_retrying(self.transport, query[0], timeout, readers)
        check_digest(q, crc, "the query a replica fetched")
        a, b = coef
        out = (q + self.model[:q.size]) * np.float32(a) + np.float32(b)
        del q
        return True, self.transport.output(out, slot)


class Frontend(Coordinator):
    """Loads the model into the replicas, then serves queries with all of them."""

    def __init__(self, system: str, size: int, query_size: int, loads: int, timeout: float,
                 iterations: int, kill_after: float | None) -> None:
        self.transport = make_transport(system)
        self.size, self.query_size, self.loads, self.timeout = size, query_size, loads, timeout
        self.progress = Progress(iterations, kill_after)
        self.rng = np.random.default_rng(11)

    def load(self, replicas: list[Any]) -> list[float]:
        """Load the model into every replica ``loads`` times; each load's latency (s)."""
        crew = Crew(replicas)
        model = integers(self.size, MODEL_SEED)
        crc = digest(model)
        latencies = []
        for _ in range(self.loads):
            start = time.perf_counter()
            handle = self.transport.share(model)
            live = sorted(crew.alive)
            calls = [Call(i, crew.actors[i].load.remote([handle], crc, len(live), self.timeout))
                     for i in live]
            try:
                crew.wait(calls, self.timeout)
            finally:
                self.transport.free([handle])
            if not all(c.ok for c in calls):
                raise RuntimeError("a replica died while the model loaded")
            latencies.append(time.perf_counter() - start)
        return latencies

    def serve(self, replicas: list[Any]) -> dict[str, Any]:
        """Queries until done; the latency and throughput report. A query's latency runs
        from its first attempt to its answer."""
        crew = Crew(replicas)
        model = integers(self.size, MODEL_SEED)
        latencies: list[float] = []
        seed = 0
        while not self.progress.done():
            seed += 1
            query = integers(self.query_size, seed)
            crc = digest(query)
            start = time.perf_counter()
            while not self._ask(crew, query, crc, seed, model):
                self.progress.retries += 1
                if self.progress.retries > MAX_RETRIES:
                    raise RuntimeError(f"{MAX_RETRIES} queries asked again: giving up")
            latencies.append(time.perf_counter() - start)
            self.progress.record()
        return {**self.progress.summary(), "query": latency_stats(latencies),
                "replicas": len(crew), "replicas_left": crew.census(self.timeout)}

    def _ask(self, crew: Crew, query: NDArray[Any], crc: int, seed: int,
             model: NDArray[Any]) -> bool:
        """Ask every live replica, sum their outputs, check the sum. False if a replica died
        (or the outputs were late): the query must be asked again of the others."""
        live = sorted(crew.alive)
        if not live:
            raise RuntimeError("every replica died")
        handle = self.transport.share(query)
        coefs = [(int(self.rng.integers(1, 9)), int(self.rng.integers(-8, 9))) for _ in live]
        calls, outputs = [], []
        for i, coef in zip(live, coefs, strict=True):
            slot = self.transport.slot()
            status, returned = crew.actors[i].infer.remote([handle], crc, len(live), coef, slot,
                                                           self.timeout)
            calls.append(Call(i, status))
            outputs.append(self.transport.handle(returned, slot))
        try:
            reduced = self.transport.sum_first(outputs, len(live), self.timeout,
                                               crew.waiter(calls, len(live)))
        except TransportError:
            crew.wait(calls, self.timeout)
            self.transport.free([handle] + [h for h, c in zip(outputs, calls, strict=True)
                                            if c.ok])
            return False
        a = sum(c[0] for c in coefs)
        b = sum(c[1] for c in coefs)
        expected = (query + model[:query.size]) * np.float32(a) + np.float32(b)
        check_equal(reduced.total, expected, f"the ensemble output of query {seed}")
        del reduced
        self.transport.free([handle, *outputs])
        return True


def run(setup: Setup, args: argparse.Namespace) -> dict[str, Any]:
    """One run of the app on ``setup``; its JSON result."""
    query_size = parse_size(args.query_size) if args.query_size else setup.size // 4
    if query_size < 4 or query_size % 4 or query_size > setup.size:
        raise ValueError(f"the query size must be a multiple of 4 bytes within the model's "
                         f"size, not {query_size}")
    replicas = Crew.start(ray.remote(Replica), setup.nodes, setup.system)
    try:
        frontends = Crew.start(ray.remote(Frontend), setup.nodes[:1], setup.system,
                               setup.size, query_size, args.loads, setup.timeout,
                               setup.iterations, setup.kill_window)
        try:
            frontend = frontends.actors[0]
            loads = ray.get(frontend.load.remote(replicas.actors))
            values = drive(setup, frontend, frontend.serve.remote(replicas.actors))
        finally:
            frontends.stop()
    finally:
        replicas.stop()
    values = {"model_load_s": [round(t, 4) for t in loads], "query_size": query_size, **values}
    return setup.result(APP, "queries/s", values)


def arguments() -> argparse.ArgumentParser:
    """The app's command line."""
    p = parser(__doc__ or APP, iterations=100, smoke_iterations=20)
    p.add_argument("--query-size", default=None,
                   help="bytes of a query and of each output (default: a quarter of --size)")
    p.add_argument("--loads", type=int, default=3, help="model loads to time")
    return p


def describe(values: dict[str, Any]) -> str:
    """The result's details, in a few words."""
    load = min(values["model_load_s"]) * 1e3
    return (f"model load {load:.1f} ms (best), query p50 {values['query']['p50_ms']:.1f} ms, "
            f"replicas left {values['replicas_left']}/{values['replicas']}")


def cli() -> int:
    """The command line: one run, its result as one JSON line."""
    return main(f"bench.apps.{APP}", run, arguments().parse_args())


if __name__ == "__main__":
    sys.exit(cli())
