"""The paper's applications (bench/apps) in a real local Ray cluster of three nodes, on plain
Ray and on Ray + Hoplite: each app's smoke mode, and runs where a node is removed mid-run and
the app goes on with the survivors. The apps check every reduce and broadcast result
themselves (a wrong one fails the run); here the reports must be sane. One cluster serves
every test: the Ray runs first, then Hoplite starts once for the Hoplite runs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import MiB, process_gone

ray = pytest.importorskip("ray", reason="hoplite[ray] is not installed")

from ray_daemons import daemon_pids  # noqa: E402

import hoplite_client.ray as hray  # noqa: E402
from bench.apps.common import LocalRayCluster  # noqa: E402
from bench.apps.suite import APPS, app_args, run_app  # noqa: E402

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

NODES = 3
LEFT = {"async_sgd": "workers_left", "rl_broadcast": "rollouts_left",
        "serving": "replicas_left"}


class Cluster:
    """The shared Ray cluster, with Hoplite started on demand (and kept for later tests)."""

    def __init__(self) -> None:
        self.ray = LocalRayCluster(NODES)
        self.hoplite = False
        self.daemons: list[int] = []

    def run(self, app: str, system: str, *argv: str) -> dict[str, Any]:
        """One run of ``app`` on ``system`` with the smoke options and ``argv``."""
        args = app_args(app, system, ["--smoke", "--nodes", str(NODES), *argv])
        if system == "hoplite" and not self.hoplite:
            hray.init(capacity=args.capacity, watch_interval=1.0)
            self.hoplite = True
        result = run_app(self.ray, app, args)
        if self.hoplite:
            self.daemons += daemon_pids()
        return result

    def stop(self) -> None:
        """Stop Hoplite (if started), then Ray."""
        try:
            if self.hoplite:
                hray.shutdown()
        finally:
            self.ray.stop()


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """The cluster of this module; stopped at the end, every daemon it ran checked gone."""
    before = os.environ.get("RAY_TMPDIR")
    shared = Cluster()
    shared.ray.start()
    ray_files = os.environ["RAY_TMPDIR"]
    try:
        yield shared
    finally:
        shared.stop()
    assert not [pid for pid in set(shared.daemons) if not process_gone(pid)]
    assert not os.path.exists(ray_files) and os.environ.get("RAY_TMPDIR") == before


def check_report(result: dict[str, Any], app: str, system: str,
                 iterations: int) -> dict[str, Any]:
    """The fields every report has, sane (at least ``iterations`` iterations); its values."""
    assert (result["app"], result["system"], result["nodes"]) == (app, system, NODES)
    assert result["size"] == MiB
    values: dict[str, Any] = result["values"]
    assert values["throughput"] is not None and values["throughput"] > 0
    assert values["iterations"] >= iterations
    return values


RUNS = [(system, app) for system in ("ray", "hoplite") for app in APPS]


@pytest.mark.parametrize(("system", "app"), RUNS, ids=[f"{s}-{a}" for s, a in RUNS])
def test_smoke_run_reports_positive_throughput(cluster: Cluster, system: str, app: str) -> None:
    values = check_report(cluster.run(app, system), app, system,
                          app_args(app, system).iterations)
    assert values["retries"] == 0
    assert values[LEFT[app]] == NODES
    if app == "serving":
        assert len(values["model_load_s"]) == 3 and min(values["model_load_s"]) > 0
        assert values["query"]["p50_ms"] > 0
    if app == "rl_broadcast":
        assert values["round"]["p50_ms"] > 0


# Hoplite's runs only: a removed node on plain Ray tests Ray's recovery, not ours (the app's
# kill option is the same code on both systems, and plain Ray's runs are in the smoke tests).
KILLS = [("hoplite", "async_sgd"), ("hoplite", "serving")]


@pytest.mark.parametrize(("system", "app"), KILLS, ids=[f"{s}-{a}" for s, a in KILLS])
def test_a_node_removed_mid_run_leaves_the_survivors_going(cluster: Cluster, system: str,
                                                          app: str) -> None:
    """Node 2 is removed 2 s in; the app goes on with the others for at least as long, and
    reports its throughput on both sides of the kill."""
    values = check_report(cluster.run(app, system, "--kill-node", "2", "--kill-after", "2",
                                      "--iterations", "5"), app, system, 5)
    assert values["throughput_before_kill"] > 0 and values["throughput_after_kill"] > 0
    assert values["stall_s"] is not None and values["stall_s"] >= 0
    assert values[LEFT[app]] == NODES - 1
