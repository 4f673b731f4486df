"""RL weight broadcast (a Hoplite paper app), on Ray or on Ray + Hoplite.

A learner (an actor on the head node) updates its policy's weights (a float32 array of the
model's size) and broadcasts them to one rollout actor per Ray node after every update; each
rollout fetches them, runs a tiny rollout (a few observations against the weights) and reports
its reward back; the next update starts once every rollout reported.

- Ray: the learner ``ray.put``s the weights once and every rollout ``ray.get``s them (each
  node's object manager pulls a whole copy from a node that has one);
- Hoplite: the learner puts them once and every rollout gets them, the daemons passing blocks
  on from receiver to receiver.

Every rollout checks the weights it fetched against the learner's CRC-32, and the learner
checks every reward against the one its own weights give. With ``--kill-node K`` the rollouts
on the dead node are dropped (a round waits for the others only) and the rounds go on.
Reports iterations per second (before and after the kill) and the latency of a round
(broadcast, rollouts, replies).

Usage: python -m bench.apps.rl_broadcast --system ray|hoplite [--smoke] [--nodes N]
       [--size S] [--iterations I] [--kill-node K --kill-after T]
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
    FETCH_ATTEMPTS,
    Actor,
    Call,
    Coordinator,
    Crew,
    Progress,
    Setup,
    WrongResultError,
    check_digest,
    digest,
    drive,
    fetch_retrying,
    integers,
    latency_stats,
    main,
    parser,
)
from bench.apps.transport import Handle, make_transport

APP = "rl_broadcast"
WEIGHTS_SEED = 2
WEIGHT_BOUND = 512  # weights stay small integers in [-512, 512): rewards are exact
OBSERVATION = 64  # elements of the weights a rollout's observations touch
STEPS = 8  # observations per rollout


def reward(weights: NDArray[Any], seed: int) -> float:
    """The reward of a rollout seeded ``seed`` under ``weights`` (exact: small integers)."""
    obs = np.random.default_rng(seed).integers(-4, 5, (STEPS, OBSERVATION)).astype(np.float64)
    return float((obs @ weights[:OBSERVATION].astype(np.float64)).sum())


class Rollout(Actor):
    """Fetches the latest weights and plays a tiny episode with them."""

    def __init__(self, system: str) -> None:
        self.transport = make_transport(system)

    def rollout(self, weights: list[Handle], crc: int, readers: int, seed: int,
                timeout: float) -> float:
        """Fetch and check the weights; the episode's reward."""
        w = fetch_retrying(self.transport, weights[0], timeout, readers)
        check_digest(w, crc, "the weights a rollout fetched")
        return reward(w, seed)


class Learner(Coordinator):
    """Updates the weights and broadcasts them to the rollouts, round after round."""

    def __init__(self, system: str, size: int, timeout: float, iterations: int,
                 kill_after: float | None) -> None:
        self.transport = make_transport(system)
        self.size, self.timeout = size, timeout
        self.progress = Progress(iterations, kill_after)

    def run(self, rollouts: list[Any]) -> dict[str, Any]:
        """Rounds until done; the throughput report."""
        crew = Crew(rollouts)
        weights = integers(self.size, WEIGHTS_SEED, high=WEIGHT_BOUND)
        latencies: list[float] = []
        seed = 0
        while not self.progress.done():
            np.add(weights, 1, out=weights)  # the "update"
            np.subtract(weights, 2 * WEIGHT_BOUND, out=weights, where=weights >= WEIGHT_BOUND)
            crc = digest(weights)
            start = time.perf_counter()
            handle = self.transport.share(weights)
            live = sorted(crew.alive)
            if not live:
                raise RuntimeError("every rollout died")
            calls = [Call(i, crew.actors[i].rollout.remote([handle], crc, len(live), seed + i,
                                                           self.timeout)) for i in live]
            try:  # a rollout tries its fetch FETCH_ATTEMPTS times: a round has one more
                crew.wait(calls, (FETCH_ATTEMPTS + 1) * self.timeout)
            finally:
                self.transport.free([handle])
            for call in calls:
                if call.ok:
                    got, want = ray.get(call.status), reward(weights, seed + call.actor)
                    if got != want:
                        raise WrongResultError(f"rollout {call.actor}: reward {got}, "
                                               f"expected {want}")
            latencies.append(time.perf_counter() - start)
            self.progress.record()
            seed += len(rollouts)
        return {**self.progress.summary(), "round": latency_stats(latencies),
                "rollouts": len(crew), "rollouts_left": crew.census(self.timeout)}


def run(setup: Setup, args: argparse.Namespace) -> dict[str, Any]:
    """One run of the app on ``setup``; its JSON result."""
    rollouts = Crew.start(ray.remote(Rollout), setup.nodes, setup.system)
    try:
        learners = Crew.start(ray.remote(Learner), setup.nodes[:1], setup.system, setup.size,
                              setup.timeout, setup.iterations, setup.kill_window)
        try:
            learner = learners.actors[0]
            values = drive(setup, learner, learner.run.remote(rollouts.actors))
        finally:
            learners.stop()
    finally:
        rollouts.stop()
    return setup.result(APP, "iterations/s", values)


def arguments() -> argparse.ArgumentParser:
    """The app's command line."""
    return parser(__doc__ or APP, iterations=30, smoke_iterations=10)


def describe(values: dict[str, Any]) -> str:
    """The result's details, in a few words."""
    return (f"round p50 {values['round']['p50_ms']:.1f} ms, rollouts left "
            f"{values['rollouts_left']}/{values['rollouts']}")


def cli() -> int:
    """The command line: one run, its result as one JSON line."""
    return main(f"bench.apps.{APP}", run, arguments().parse_args())


if __name__ == "__main__":
    sys.exit(cli())
