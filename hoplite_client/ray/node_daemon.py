"""One Ray node's ``hoplited``, run by a zero-CPU Ray actor pinned to that node.

The actor starts the daemon as its child with ``--exit-with-parent``: Ray kills an actor
outright when its node dies or when it is killed, and the daemon then stops on its own within
half a second, so no daemon outlives the actor that started it. The daemon's socket, token
(removed once the daemon has read it) and log live in a private directory the actor removes
when it stops the daemon; a node that dies leaves the log behind, as Ray leaves its own. Starting
never raises: the caller gets the ready line's facts or the cause of the failure (the log's
last lines), so it can name the node in one typed error (:mod:`.api`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import ray

from hoplite_client import daemon_process
from hoplite_client.daemon_process import DaemonStartError


class NodeDaemon:
    """The daemon of the node this actor runs on: :meth:`start`, :meth:`info`, :meth:`stop`."""

    def __init__(self, token: str, capacity: str | None, port: int,
                 daemon_args: Sequence[str]) -> None:
        self._workdir = tempfile.mkdtemp(prefix="hoplite-ray-")
        self._token_file = os.path.join(self._workdir, "token")
        with open(os.open(self._token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600),
                  "w") as f:
            f.write(token)
        self._capacity, self._port, self._args = capacity, port, list(daemon_args)
        self._process: subprocess.Popen[bytes] | None = None
        self._info: dict[str, Any] = {}
        self.ray_node = ray.get_runtime_context().get_node_id()
        self.host: str = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]

    def start(self, join: Sequence[str]) -> dict[str, Any]:
        """Start the daemon, joining any of ``join`` (none: a new cluster). Returns its
        ready line's facts and ``socket``, or ``error`` with the cause."""
        if self._process is not None:
            return self.info()
        sock = os.path.join(self._workdir, "hoplited.sock")
        log_path = os.path.join(self._workdir, "hoplited.log")
        args = [sys.executable, "-m", "hoplited", "--listen", f"{self.host}:{self._port}",
                "--socket", sock, "--token-file", self._token_file, "--exit-with-parent",
                *(["--capacity", self._capacity] if self._capacity else []), *self._args]
        for peer in join:
            args += ["--join", peer]
        try:
            self._process, ready = daemon_process.start(args, log_path)
        except DaemonStartError as exc:
            self.stop()
            return {"error": str(exc), "ray_node": self.ray_node, "host": self.host}
        os.unlink(self._token_file)  # read at start: the secret stays in memory only
        self._info = {"node_id": ready["node_id"], "listen": ready["listen"], "socket": sock,
                      "pid": self._process.pid, "ray_node": self.ray_node, "host": self.host,
                      "log": log_path}
        return self.info()

    def info(self) -> dict[str, Any]:
        """Where clients and peers reach the daemon (empty before :meth:`start`)."""
        return dict(self._info)

    def stop(self) -> bool:
        """Stop the daemon (SIGTERM, then SIGKILL after a grace) and remove its directory.
        Whether a daemon was running."""
        process, self._process = self._process, None
        self._info = {}
        ran = process is not None and daemon_process.stop(process)
        shutil.rmtree(self._workdir, ignore_errors=True)
        return ran
