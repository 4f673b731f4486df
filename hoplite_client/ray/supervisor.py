"""The detached Ray actor that keeps one ``hoplited`` on every Ray node.

:func:`~hoplite_client.ray.api.init` creates it once per Ray cluster (named, in the
``hoplite`` namespace) and asks it to :meth:`Supervisor.start`: a daemon actor
(:class:`~.node_daemon.NodeDaemon`, zero CPUs, pinned to its node) on every alive node, the
first one seeding the cluster and the others joining it. If any of them fails, everything
started is stopped again and the failures are returned, each naming its node. Afterwards the
supervisor looks at Ray's nodes every ``watch_interval`` seconds (:func:`.placement.reconcile`
decides): a node that joined gets a daemon, one that died is forgotten (its daemon went with
it). :meth:`Supervisor.stop` stops exactly the daemons it started.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hoplite_client.daemon_process import STOP_GRACE
from hoplite_client.ray.node_daemon import NodeDaemon
from hoplite_client.ray.placement import Daemon, Forget, Start, reconcile

log = logging.getLogger("hoplite.ray")

NAMESPACE = "hoplite"
SUPERVISOR = "supervisor"
# A daemon actor's start: creating the actor (Ray may start a worker process for it) and the
# daemon's own start (READY_TIMEOUT).
START_TIMEOUT = 120.0


# How long a killed actor may keep its name (Ray frees it once the actor is dead).
GONE_TIMEOUT = 30.0


def daemon_name(ray_node: str) -> str:
    """The name of the daemon actor of Ray node ``ray_node`` (in :data:`NAMESPACE`)."""
    return f"hoplited:{ray_node}"


async def kill_and_forget(actor: Any, name: str) -> None:
    """Kill ``actor`` and return once Ray has freed its ``name``: an ``init`` right after a
    ``shutdown`` (or after a failed start) can then use the name again."""
    ray.kill(actor)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GONE_TIMEOUT
    while loop.time() < deadline:
        try:
            ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return
        await asyncio.sleep(0.1)
    log.warning("the actor %s still has its name %.0f s after it was killed", name,
                GONE_TIMEOUT)


class Supervisor:
    """Starts, watches and stops the daemons of one Ray cluster (an async Ray actor)."""

    def __init__(self, token: str, capacity: str | None, port: int,
                 daemon_args: Sequence[str], watch_interval: float) -> None:
        self._config = (token, capacity, port, list(daemon_args))
        self._interval = watch_interval
        self._daemons: dict[str, Daemon] = {}
        self._actors: dict[str, Any] = {}  # ray node -> its NodeDaemon actor handle
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> list[dict[str, Any]]:
        """A daemon on every alive node; on any failure, none (all stopped again). Returns
        the failures: each a dict with ``ray_node``, ``host`` and ``error``."""
        failures = await self._pass(give_up=True)
        if failures:
            await self.stop()
            return failures
        self._watch = asyncio.ensure_future(self._watch_nodes())
        return []

    async def _pass(self, give_up: bool = False) -> list[dict[str, Any]]:
        """One reconcile pass: forget the dead, start what is missing (the seed first, alone,
        then the others joining it); the starts' failures (``give_up``: no more starts after
        the first failure)."""
        alive = [n["NodeID"] for n in ray.nodes()  # type: ignore[no-untyped-call]
                 if n.get("Alive")]
        failures: list[dict[str, Any]] = []
        for _ in range(2):  # the seed's turn, then the joiners'
            starts = []
            for ins in reconcile(alive, self._daemons, time.monotonic()):
                if isinstance(ins, Forget):
                    log.info("Ray node %s is gone, and its daemon with it", ins.node)
                    self._daemons.pop(ins.node, None)
                    self._actors.pop(ins.node, None)
                else:
                    starts.append(ins)
            if not starts or (failures and give_up):
                break
            results = await asyncio.gather(*(self._start(ins) for ins in starts))
            failures += [r for r in results if r is not None]
        return failures

    async def _start(self, ins: Start) -> dict[str, Any] | None:
        """Start the daemon of node ``ins.node``; its failure, or None."""
        self._daemons[ins.node] = Daemon()
        try:
            remote: Any = ray.remote(NodeDaemon)
            actor = remote.options(
                name=daemon_name(ins.node), namespace=NAMESPACE, lifetime="detached",
                num_cpus=0, max_restarts=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(ins.node, soft=False),
            ).remote(*self._config)
        except ValueError as exc:  # the name is taken: a daemon nobody here started
            self._daemons[ins.node] = Daemon(failed_at=time.monotonic())
            return {"error": f"{exc} (hoplite_client.ray.shutdown() stops it)",
                    "ray_node": ins.node, "host": ""}
        self._actors[ins.node] = actor
        try:
            async with asyncio.timeout(START_TIMEOUT):
                info = await actor.start.remote(list(ins.join))
        except (TimeoutError, ray.exceptions.RayError) as exc:
            info = {"error": f"{type(exc).__name__}: {exc}", "ray_node": ins.node, "host": ""}
        if "error" in info:
            log.warning("no hoplited on Ray node %s: %s", ins.node, info["error"])
            self._daemons[ins.node] = Daemon(failed_at=time.monotonic())
            await kill_and_forget(self._actors.pop(ins.node), daemon_name(ins.node))
            return dict(info)
        self._daemons[ins.node] = Daemon(listen=info["listen"])
        log.info("hoplited %s on Ray node %s at %s", info["node_id"], ins.node, info["listen"])
        return None

    async def _watch_nodes(self) -> None:
        """Every watch interval: a daemon for each node that joined, none for the dead."""
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self._pass()
            except ray.exceptions.RayError as exc:  # Ray itself is unwell: try again later
                log.warning("watching Ray's nodes: %s", exc)
            except Exception:  # a fault of ours must not end the watch unseen
                log.exception("watching Ray's nodes")

    def nodes(self) -> dict[str, str]:
        """The daemons listening, by Ray node: where their peers reach them."""
        return {node: d.listen for node, d in self._daemons.items() if d.listen}

    async def stop(self) -> int:
        """Stop every daemon started here (each actor stops its daemon, then goes). How
        many daemons were running."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        actors, self._actors = self._actors, {}
        self._daemons.clear()

        async def stop_one(node: str, actor: Any) -> bool:
            try:
                async with asyncio.timeout(2 * STOP_GRACE):
                    ran = bool(await actor.stop.remote())
            except (TimeoutError, ray.exceptions.RayError):
                ran = False  # its node died, or it hangs: killing the actor ends the daemon
            await kill_and_forget(actor, daemon_name(node))
            return ran
        return sum(await asyncio.gather(*(stop_one(n, a) for n, a in actors.items())))
