"""What hoplite_client.ray left running in the Ray cluster this process is connected to: its
named actors and the daemons they run (for the Ray and apps integration tests)."""

from __future__ import annotations

import ray


def hoplite_actors() -> list[str]:
    """The names of the actors in hoplite's Ray namespace (supervisor and daemon actors)."""
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["namespace"] == "hoplite"]


def daemon_pids() -> list[int]:
    """The daemons' PIDs, from their live actors."""
    pids = []
    for name in hoplite_actors():
        if name.startswith("hoplited:"):
            try:
                info = ray.get(ray.get_actor(name, namespace="hoplite").info.remote(),
                               timeout=60)
            except (ValueError, ray.exceptions.RayError):
                continue  # its node died, and the actor with it
            if info:
                pids.append(info["pid"])
    return pids
