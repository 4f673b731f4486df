"""Hoplite for Dask users (``pip install hoplite[dask]``): register
:class:`HopliteWorkerPlugin` with ``Client.register_plugin`` and every worker's host gets a
daemon, one per host, all in one cluster; ``await client()`` (or :func:`client_sync`) inside a
task reaches the daemon of the host it runs on. docs/quickstart.md shows a first program."""

from hoplite_client.dask.plugin import DaskSetupError, HopliteWorkerPlugin, client, client_sync

__all__ = ["DaskSetupError", "HopliteWorkerPlugin", "client", "client_sync"]
