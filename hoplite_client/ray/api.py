"""Hoplite inside Ray: start a daemon on every Ray node, and reach the local one from tasks.

From the driver, :func:`init` (after ``ray.init``, or starting Ray as Ray's own libraries do)
creates the detached supervisor actor, which starts one ``hoplited`` per Ray node with a fresh
cluster token (:mod:`.supervisor`); it is idempotent. Inside any task or actor (or the
driver), ``await client()`` or :func:`client_sync` connects to the daemon of the node it runs
on. Object ids pickle, so tasks pass them through Ray calls; Ray's object store stays for
everything else. :func:`shutdown` stops exactly what :func:`init` started. docs/quickstart.md.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

import ray

from hoplite_client.client import CONNECT_TIMEOUT, Client, connect
from hoplite_client.ray.supervisor import (
    GONE_TIMEOUT,
    NAMESPACE,
    SUPERVISOR,
    Supervisor,
    daemon_name,
)
from hoplite_client.sync import SyncClient
from hoplite_client.wire.errors import HopliteError, InvalidArgumentError

# How often the supervisor looks for Ray nodes that joined or died.
WATCH_INTERVAL = 5.0
# The resource only Ray's head node has, and the sliver of it the supervisor asks for.
HEAD_NODE_RESOURCE = "node:__internal_head__"
HEAD_NODE_SHARE = 0.001


class RaySetupError(HopliteError):
    """Hoplite could not be set up in this Ray cluster, or is not: ``node`` names the Ray
    node concerned, if one is."""

    code = "ray_setup"


def init(capacity: str | None = None, port: int = 0, daemon_args: Sequence[str] = (),
         watch_interval: float = WATCH_INTERVAL) -> None:
    """Start a ``hoplited`` on every node of the Ray cluster (and on nodes that join later),
    unless hoplite runs in it already. ``capacity``: each store's size (default: half the
    node's memory); ``port``: the peer port (0: any free one); ``daemon_args``: more
    ``hoplited`` options. A node whose daemon cannot start fails the call with a
    :class:`RaySetupError` naming it and the cause, and nothing started is left running."""
    if not watch_interval > 0:  # also refuses NaN
        raise InvalidArgumentError(f"watch_interval must be positive, not {watch_interval}")
    if not 0 <= port <= 65535:
        raise InvalidArgumentError(f"port must be within 0..65535, not {port}")
    if not ray.is_initialized():
        ray.init()
    if _supervisor() is not None:
        return
    remote: Any = ray.remote(Supervisor)
    try:
        # On the head node, as Ray's own state actors: it lives as long as the Ray cluster
        # (the GCS runs there), whichever node the driver is on.
        supervisor = remote.options(
            name=SUPERVISOR, namespace=NAMESPACE, lifetime="detached", num_cpus=0,
            max_restarts=0, resources={HEAD_NODE_RESOURCE: HEAD_NODE_SHARE},
        ).remote(secrets.token_hex(32), capacity, port, list(daemon_args), watch_interval)
    except ValueError:  # another driver's init() created it a moment ago
        return
    try:
        failures: list[dict[str, Any]] = ray.get(supervisor.start.remote())
    except ray.exceptions.RayError as exc:
        _end_supervisor(supervisor)
        raise RaySetupError(f"the hoplite supervisor failed: {exc}") from exc
    if failures:
        _end_supervisor(supervisor)
        first = failures[0]
        others = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise RaySetupError(f"no hoplite daemon on Ray node {first['ray_node']} "
                            f"{first['host']}{others}: {first['error']}",
                            node=first["ray_node"], host=first["host"])


def shutdown() -> None:
    """Stop every daemon :func:`init` started, and its supervisor; nothing if none runs."""
    supervisor = _supervisor()
    if supervisor is None:
        return
    try:
        ray.get(supervisor.stop.remote())
    finally:
        _end_supervisor(supervisor)


def _end_supervisor(supervisor: Any) -> None:
    """Kill the supervisor; return once Ray has freed its name (see ``kill_and_forget``)."""
    ray.kill(supervisor)
    deadline = time.monotonic() + GONE_TIMEOUT
    while _supervisor() is not None and time.monotonic() < deadline:
        time.sleep(0.1)


def nodes() -> dict[str, str]:
    """The running daemons by Ray node id: the address their peers reach them at."""
    supervisor = _supervisor()
    if supervisor is None:
        raise RaySetupError("hoplite is not running in this Ray cluster: "
                            "call hoplite_client.ray.init() first")
    result: dict[str, str] = ray.get(supervisor.nodes.remote())
    return result


async def client(timeout: float | None = CONNECT_TIMEOUT) -> Client:
    """A client of this Ray node's daemon (in a task, an actor or the driver)."""
    info = await _local_daemon().info.remote()
    return await connect(_socket_of(info), timeout=timeout)


def client_sync() -> SyncClient:
    """A blocking client of this Ray node's daemon, for synchronous tasks."""
    info = ray.get(_local_daemon().info.remote())
    return SyncClient(_socket_of(info))


def _supervisor() -> Any:
    try:
        return ray.get_actor(SUPERVISOR, namespace=NAMESPACE)
    except ValueError:
        return None


def _local_daemon() -> Any:
    """The daemon actor of the node this process runs on."""
    if not ray.is_initialized():
        raise RaySetupError("not in a Ray worker or driver: hoplite_client.ray.client() runs "
                            "in a task or actor, or after ray.init()")
    node = ray.get_runtime_context().get_node_id()
    try:
        return ray.get_actor(daemon_name(node), namespace=NAMESPACE)
    except ValueError:
        raise RaySetupError(f"no hoplite daemon on Ray node {node}: call "
                            f"hoplite_client.ray.init() first (a node that joined gets one "
                            f"within {WATCH_INTERVAL:.0f} s)", node=node) from None


def _socket_of(info: dict[str, Any]) -> str:
    if not info.get("socket"):
        raise RaySetupError(f"the hoplite daemon of Ray node {info.get('ray_node')} is not "
                            f"running", node=info.get("ray_node", ""))
    socket: str = info["socket"]
    return socket
