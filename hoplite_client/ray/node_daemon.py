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

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import ray

# A daemon start on a loaded machine can take seconds (as in LocalCluster).
READY_TIMEOUT = 60.0
STOP_GRACE = 10.0


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
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log,
                                             stdin=subprocess.DEVNULL)
        line = self._ready_line()
        if line is None:
            error = self._failure(log_path)
            self.stop()
            return {"error": error, "ray_node": self.ray_node, "host": self.host}
        os.unlink(self._token_file)  # read at start: the secret stays in memory only
        ready = json.loads(line)
        self._info = {"node_id": ready["node_id"], "listen": ready["listen"], "socket": sock,
                      "pid": self._process.pid, "ray_node": self.ray_node, "host": self.host,
                      "log": log_path}
        return self.info()

    def _ready_line(self) -> bytes | None:
        """The daemon's ready line, or None if it exited or stayed silent too long."""
        assert self._process is not None and self._process.stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([self._process.stdout], [], [], left)
            if readable:
                line = self._process.stdout.readline()
                return line or None
        return None

    def _failure(self, log_path: str) -> str:
        """Why the start failed: the exit status and the log's last lines."""
        assert self._process is not None
        code = self._process.poll()
        try:
            with open(log_path, errors="replace") as f:
                tail = "".join(f.readlines()[-5:]).strip()
        except OSError:
            tail = ""
        status = f"exited with {code}" if code is not None else (
            f"not ready within {READY_TIMEOUT:.0f}s")
        return f"hoplited {status}: {tail or 'no log'}"

    def info(self) -> dict[str, Any]:
        """Where clients and peers reach the daemon (empty before :meth:`start`)."""
        return dict(self._info)

    def stop(self) -> bool:
        """Stop the daemon (SIGTERM, then SIGKILL after a grace) and remove its directory.
        Whether a daemon was running."""
        process, self._process = self._process, None
        self._info = {}
        ran = process is not None and process.poll() is None
        if process is not None:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)  # a stopped daemon cannot act on TERM
                process.terminate()
                try:
                    process.wait(STOP_GRACE)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if process.stdout is not None:
                process.stdout.close()
        shutil.rmtree(self._workdir, ignore_errors=True)
        return ran
