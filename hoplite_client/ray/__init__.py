"""Hoplite for Ray users (``pip install hoplite[ray]``): :func:`init` from the driver starts a
daemon on every Ray node; ``await client()`` (or :func:`client_sync`) inside a task or actor
reaches the daemon of the node it runs on; :func:`shutdown` stops what :func:`init` started.
docs/quickstart.md shows a first program."""

from hoplite_client.ray.api import (
    RaySetupError,
    client,
    client_sync,
    init,
    nodes,
    shutdown,
)

__all__ = ["RaySetupError", "client", "client_sync", "init", "nodes", "shutdown"]
