"""Hoplite inside Dask: a worker plugin that starts or finds the daemon of each worker's host,
and the client of that daemon for tasks.

``client.register_plugin(HopliteWorkerPlugin())`` runs :meth:`HopliteWorkerPlugin.setup` on
every worker, now and as workers join. The workers of one host share its daemon
(:mod:`.host_daemon`); a host's first daemon registers in the scheduler's metadata and joins the
daemons of the hosts registered before it (:mod:`.rendezvous`), so every host's daemon is in
one cluster, with the plugin's fresh token. Inside a task, ``await client()`` or
:func:`client_sync` reaches the daemon of the worker's host. Unregistering the plugin
(``client.unregister_worker_plugin(HopliteWorkerPlugin.name)``) or closing the workers stops
the daemons; a host whose workers all die loses its daemon within a second, and the other
daemons drop it from the membership. docs/quickstart.md, "Dask".
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import sys
import tempfile
import uuid
from collections.abc import Sequence
from typing import Any

from distributed import WorkerPlugin, get_worker
from distributed.comm.addressing import get_address_host

from hoplite_client import daemon_process
from hoplite_client.client import CONNECT_TIMEOUT, Client, connect
from hoplite_client.daemon_process import EXIT_NO_PEER, DaemonStartError
from hoplite_client.dask.host_daemon import HostDaemon
from hoplite_client.dask.rendezvous import STARTING, STOPPED, Join, Seed, decide, entry_key
from hoplite_client.sync import SyncClient
from hoplite_client.wire.errors import HopliteError, InvalidArgumentError
from hoplite_client.wire.units import parse_size

log = logging.getLogger("hoplite.dask")

# A worker's whole setup: waiting for its host's start lock, for the hosts registered before
# it, and its daemon's own start (daemon_process.READY_TIMEOUT).
START_TIMEOUT = 120.0
# How often a waiting worker looks at the registrations again.
RENDEZVOUS_POLL = 0.2
# How long a worker waits after its daemon found none of its peers (the daemon of an entry
# that went stale), before it looks at the registrations again.
REJOIN_DELAY = 1.0


class DaskSetupError(HopliteError):
    """Hoplite could not be set up for a Dask worker, or is not: ``host`` names the host
    concerned, if one is."""

    code = "dask_setup"


class HopliteWorkerPlugin(WorkerPlugin):
    """Gives every worker of a Dask cluster a ``hoplited`` on its host, one per host, all in
    one hoplite cluster. ``capacity``: each store's size (default: half the host's memory);
    ``port``: the peer port (0: any free one); ``daemon_args``: more ``hoplited`` options;
    ``workdir``: where each host keeps its daemon's socket, locks and log (default: the
    temporary directory)."""

    name = "hoplite"

    def __init__(self, capacity: str | None = None, port: int = 0,
                 daemon_args: Sequence[str] = (), workdir: str | None = None,
                 start_timeout: float = START_TIMEOUT) -> None:
        if capacity is not None:
            parse_size(capacity)  # a typo fails here, on the client, not on every worker
        if not 0 <= port <= 65535:
            raise InvalidArgumentError(f"port must be within 0..65535, not {port}")
        if not start_timeout > 0:  # also refuses NaN
            raise InvalidArgumentError(f"start_timeout must be positive, not {start_timeout}")
        self.capacity, self.port, self.daemon_args = capacity, port, list(daemon_args)
        self.workdir, self.start_timeout = workdir, start_timeout
        self._token = secrets.token_hex(32)
        self.cluster = hashlib.sha256(self._token.encode()).hexdigest()[:16]
        self._daemon: HostDaemon | None = None
        self.socket: str | None = None  # this worker's daemon, once set up

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_daemon": None, "socket": None}

    async def setup(self, worker: Any) -> None:
        """Attach this worker to its host's daemon, starting the daemon if none runs."""
        host = get_address_host(worker.address)
        daemon = HostDaemon(self.workdir or tempfile.gettempdir(), self.cluster, host)
        try:
            info = await daemon.attach(lambda directory: self._start(worker, host, directory),
                                       self.start_timeout)
        except TimeoutError:
            raise DaskSetupError(f"no hoplite daemon on host {host} (worker {worker.address}):"
                                 f" not started within {self.start_timeout:.0f}s",
                                 host=host) from None
        except OSError as exc:  # its directory, or the scheduler while we registered
            raise DaskSetupError(f"no hoplite daemon on host {host} (worker {worker.address}):"
                                 f" {exc}", host=host) from exc
        self._daemon, self.socket = daemon, daemon.socket
        log.info("worker %s uses hoplited %s at %s", worker.address, info["node_id"],
                 info["listen"])

    async def teardown(self, worker: Any) -> None:
        """Detach this worker; the last one of its host stops the daemon."""
        daemon, self._daemon, self.socket = self._daemon, None, None
        if daemon is None:
            return
        stopped = await daemon.detach(self.start_timeout)
        if stopped is not None:
            log.info("stopped hoplited %s on host %s", stopped["node_id"],
                     get_address_host(worker.address))
            try:
                await worker.scheduler.set_metadata(keys=self._entries() + [stopped["key"]],
                                                    value=STOPPED)
            except OSError as exc:  # the scheduler is closing too: its metadata goes with it
                log.info("could not mark hoplited %s stopped: %s", stopped["node_id"], exc)

    def _entries(self) -> list[str]:
        """Where this cluster's registrations live in the scheduler's metadata."""
        return ["hoplite", self.cluster, "hosts"]

    async def _start(self, worker: Any, host: str, directory: str) -> dict[str, Any]:
        """Register this host, then start its daemon as the seed or joining the hosts
        registered before it; its facts. A failed start marks the registration stopped."""
        key = entry_key(host, uuid.uuid4().hex[:12])
        await worker.scheduler.set_metadata(keys=self._entries() + [key], value=STARTING)
        try:
            ready = await self._rendezvous(worker, host, directory, key)
        except BaseException:
            with contextlib.suppress(OSError):
                await worker.scheduler.set_metadata(keys=self._entries() + [key],
                                                    value=STOPPED)
            raise
        await worker.scheduler.set_metadata(keys=self._entries() + [key], value=ready["listen"])
        return {**ready, "key": key}

    async def _rendezvous(self, worker: Any, host: str, directory: str,
                          key: str) -> dict[str, Any]:
        """Start the daemon once :func:`.rendezvous.decide` says how, as often as a join
        finds none of its peers, within the start timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.start_timeout
        while True:
            entries: dict[str, str | None] = await worker.scheduler.get_metadata(
                keys=self._entries(), default={})
            workers = (await worker.scheduler.identity())["workers"]
            decision = decide(list(entries.items()), key,
                              {get_address_host(address) for address in workers})
            if isinstance(decision, Seed | Join):
                peers = decision.peers if isinstance(decision, Join) else ()
                try:
                    return await asyncio.to_thread(self._run_daemon, host, directory, peers)
                except DaemonStartError as exc:
                    if exc.exit_code != EXIT_NO_PEER or loop.time() + REJOIN_DELAY > deadline:
                        raise DaskSetupError(f"no hoplite daemon on host {host} (worker "
                                             f"{worker.address}): {exc}", host=host) from None
                    log.info("host %s: none of %s answered; looking again", host, peers)
                    await asyncio.sleep(REJOIN_DELAY)
                    continue
            if loop.time() > deadline:
                raise TimeoutError("the hosts registered before us never started")
            await asyncio.sleep(RENDEZVOUS_POLL)

    def _run_daemon(self, host: str, directory: str,
                    peers: Sequence[str]) -> dict[str, Any]:
        """Start hoplited on ``host``, in ``directory``, joining any of ``peers``."""
        token_file = os.path.join(directory, "token")
        with open(os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(self._token)
        args = [sys.executable, "-m", "hoplited", "--listen", f"{host}:{self.port}",
                "--socket", os.path.join(directory, "hoplited.sock"),
                "--token-file", token_file,
                "--exit-when-unused", os.path.join(directory, "users.lock"),
                *(["--capacity", self.capacity] if self.capacity else []), *self.daemon_args]
        for peer in peers:
            args += ["--join", peer]
        try:
            process, ready = daemon_process.start(args, os.path.join(directory, "hoplited.log"),
                                                  detach=True)
        finally:
            os.unlink(token_file)  # read at start: the secret stays in memory only
        return {"node_id": ready["node_id"], "listen": ready["listen"], "pid": process.pid}


async def client(timeout: float | None = CONNECT_TIMEOUT) -> Client:
    """A client of the daemon of the host this Dask task runs on."""
    return await connect(_socket(), timeout=timeout)


def client_sync() -> SyncClient:
    """A blocking client of the daemon of the host this Dask task runs on."""
    return SyncClient(_socket())


def _socket() -> str:
    try:
        worker = get_worker()
    except ValueError:
        raise DaskSetupError("not in a Dask worker: hoplite_client.dask.client() runs inside "
                             "a task") from None
    plugin = worker.plugins.get(HopliteWorkerPlugin.name)
    if not isinstance(plugin, HopliteWorkerPlugin) or plugin.socket is None:
        raise DaskSetupError(f"no hoplite daemon for worker {worker.address}: register "
                             f"hoplite_client.dask.HopliteWorkerPlugin() first",
                             host=get_address_host(worker.address))
    return plugin.socket
