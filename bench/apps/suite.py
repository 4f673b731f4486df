"""Several apps on several systems in one Ray cluster: what ``python -m bench.apps`` and
tests/integrations/test_apps.py run.

Starting a Ray cluster costs more than a smoke run of an app, so every run shares one
:class:`~bench.apps.common.LocalRayCluster`: the Ray runs first, then Hoplite starts on every
node for the Hoplite runs. A run that kills a node gets a fresh node in its place afterwards
(and, on Hoplite, waits for that node's daemon), so the next run has as many nodes again.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

import hoplite_client.ray as hray
from bench.apps import async_sgd, rl_broadcast, serving
from bench.apps.common import LocalRayCluster, hoplite_running, resolve, setup_of

APPS: dict[str, ModuleType] = {m.APP: m for m in (async_sgd, rl_broadcast, serving)}
# How long a fresh node may take to get its hoplited (the supervisor looks every second).
DAEMON_TIMEOUT = 120.0


def app_args(app: str, system: str, argv: Sequence[str] = ("--smoke",)) -> argparse.Namespace:
    """The options of ``app`` on ``system``, from the command-line words ``argv``."""
    return resolve(APPS[app].arguments().parse_args(["--system", system, *argv]))


def run_app(cluster: LocalRayCluster, app: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``app`` in ``cluster`` (Hoplite running already if ``args.system`` is
    hoplite); a node it kills is replaced afterwards."""
    if args.nodes > cluster.size:
        raise ValueError(f"{app} wants {args.nodes} nodes, the cluster has {cluster.size}")
    setup = setup_of(args, cluster.node_ids[:args.nodes], cluster.kill)
    try:
        result: dict[str, Any] = APPS[app].run(setup, args)
        return result
    finally:
        if args.kill_node is not None:
            cluster.restore()
            if args.system == "hoplite":
                wait_for_daemons(cluster.node_ids)


def wait_for_daemons(nodes: Sequence[str], timeout: float = DAEMON_TIMEOUT) -> None:
    """Return once every one of ``nodes`` has its ``hoplited``."""
    deadline = time.monotonic() + timeout
    while not set(nodes) <= set(hray.nodes()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no hoplited on some of {list(nodes)} after {timeout:.0f} s")
        time.sleep(0.5)


def run_suite(cluster: LocalRayCluster, systems: Sequence[str], apps: Sequence[str],
              argv: Sequence[str]) -> Iterator[dict[str, Any]]:
    """Each of ``apps`` on each of ``systems`` with the options ``argv``; their results."""
    for system in systems:
        runs = [(app, app_args(app, system, argv)) for app in apps]
        with hoplite_running(system, runs[0][1].capacity):  # the same for all: one --size
            for app, args in runs:
                yield run_app(cluster, app, args)


def table(results: Sequence[dict[str, Any]]) -> str:
    """The results as a small text table, one line per run."""
    lines = [f"{'app':<13} {'system':<8} {'nodes':>5} {'size':>9}  {'throughput':>20}  details"]
    for r in results:
        v = r["values"]
        size = f"{r['size'] / 2**20:g} MiB"
        rate = f"{v['throughput']} {r['metric']}"
        details = APPS[r["app"]].describe(v)
        if "throughput_before_kill" in v:
            details += (f"; killed: {v['throughput_before_kill']} before, "
                        f"{v['throughput_after_kill']} after, stall {v['stall_s']} s")
        if v["retries"]:
            details += f"; {v['retries']} retried"
        lines.append(f"{r['app']:<13} {r['system']:<8} {r['nodes']:>5} {size:>9}  {rate:>20}  "
                     f"{details}")
    return "\n".join(lines)
