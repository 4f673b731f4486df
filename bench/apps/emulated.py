"""``--emulate RATE``: an app in the emulated test bed, one Ray node per network namespace.

As root: a :class:`~hoplited.tools.testbed.Testbed` of ``--nodes`` hosts whose links are
limited to RATE (``tc tbf``), a Ray cluster in it as the Ray baseline builds one
(:class:`bench.baselines.ray_baseline.RayCluster`: ``ray start --head`` in host 0's namespace,
``ray start --address`` in each other one, object stores sized for ``--size``), then the same
app command run again inside host 0's namespace (``ip netns exec``) as the Ray driver, told
where the cluster is by the hidden ``--inside`` option. That driver starts Hoplite on every
node with ``--system hoplite`` (``hoplite_client.ray.init``: each daemon listens on its
host's address), runs the app with Ray node i in host i, and prints the result line, which
the outer process passes on. ``--kill-node K`` SIGKILLs every process of host K's namespace
(its raylet, workers and ``hoplited``), as a crash of that machine would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import ray

from bench.apps.common import App, hoplite_running, hoplite_workdir, remove_when_quiet, setup_of
from bench.baselines.common import REPO_ROOT, module_command
from bench.baselines.procs import tail
from bench.baselines.ray_baseline import DRIVER_START_TIMEOUT, RayCluster
from hoplited.tools.testbed import Testbed, netns_pids, parse_rate

# The driver's whole run: the cluster's start is the outer process's, not counted here.
RUN_TIMEOUT = 3600.0


def run_emulated(module: str, argv: Sequence[str], args: argparse.Namespace) -> int:
    """Build the test bed and the Ray cluster, run ``module`` with ``argv`` inside host 0's
    namespace, print its result line."""
    result = asyncio.run(_outer(module, argv, args))
    print(result, flush=True)
    return 0


async def _outer(module: str, argv: Sequence[str], args: argparse.Namespace) -> str:
    # Stores for twice the size: Ray's object stores hold a few versions of the model too.
    async with Testbed(args.nodes, parse_rate(args.emulate)) as tb, \
            RayCluster(tb, 2 * args.size) as cluster:
        inside = {"address": cluster.address, "ips": [h.ip for h in tb.hosts],
                  "netns": [h.netns for h in tb.hosts]}
        log = os.path.join(cluster.tmp, "app-driver.log")
        command = tb.exec_prefix(0) + [*module_command(module), *argv, "--inside",
                                       json.dumps(inside)]
        with open(log, "wb") as err:
            process = await asyncio.create_subprocess_exec(
                *command, env=cluster.env(), cwd=REPO_ROOT, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=err, start_new_session=True)
        try:
            out, _ = await asyncio.wait_for(process.communicate(),
                                            DRIVER_START_TIMEOUT + RUN_TIMEOUT)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            raise
        lines = [line for line in out.decode(errors="replace").splitlines()
                 if line.startswith("{")]
        if process.returncode != 0 or not lines:
            raise RuntimeError(f"the app's driver failed (exit {process.returncode}):\n"
                               f"{tail(log, 40)}")
        return lines[-1]


def run_inside(app: App, args: argparse.Namespace) -> int:
    """The driver, inside host 0's namespace: run ``app`` on the cluster ``args.inside``
    describes; print its result line."""
    inside: dict[str, Any] = json.loads(args.inside)
    ips, namespaces = inside["ips"], inside["netns"]
    leftovers: list[str] = []
    with contextlib.redirect_stdout(sys.stderr):
        ray.init(address=inside["address"], _node_ip_address=ips[0], log_to_driver=False,
                 logging_level=logging.WARNING)
        try:
            by_ip = {n["NodeManagerAddress"]: n["NodeID"]
                     for n in ray.nodes() if n["Alive"]}  # type: ignore[no-untyped-call]
            nodes = [by_ip[ip] for ip in ips]

            def kill(index: int) -> None:
                workdir = hoplite_workdir(nodes[index])
                if workdir:
                    leftovers.append(workdir)
                for pid in netns_pids(namespaces[index]):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

            with hoplite_running(args.system, args.capacity):
                result = app(setup_of(args, nodes, kill), args)
        finally:
            ray.shutdown()
            for path in leftovers:
                remove_when_quiet(path)
    print(json.dumps(result), flush=True)
    return 0
