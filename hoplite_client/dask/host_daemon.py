"""The one ``hoplited`` of a host, shared by the Dask workers that run there.

The workers of a host find it in a directory named for the cluster and the host. Two file
locks there make the sharing safe without any process owning the daemon:

- ``start.lock``, held exclusively while a worker starts the daemon or stops it, so a host
  never runs two;
- ``users.lock``, held shared by every worker that may use the daemon, for as long as it may.

The daemon runs with ``--exit-when-unused users.lock``: once no worker holds the lock (the
last one detached, or every worker of the host died and the kernel dropped their locks), it
stops by itself, so no daemon outlives the workers of its host. The last worker to detach
stops it at once and removes the directory, locks included: a worker that was waiting for
the old start lock sees that it is no longer the file at its path and takes the new one.
docs/quickstart.md, "Dask".
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import shutil
from collections.abc import Awaitable, Callable
from typing import Any

from hoplite_client import daemon_process
from hoplite_client.client import connect
from hoplite_client.wire.errors import HopliteError

# How long a live daemon may take to answer a worker that checks it is there.
CHECK_TIMEOUT = 5.0
LOCK_POLL = 0.05

# Starts the daemon in the given directory: its ready line's facts, with "pid" and "key".
Starter = Callable[[str], Awaitable[dict[str, Any]]]


class HostDaemon:
    """This host's daemon as one worker sees it: :meth:`attach`, then :meth:`detach`."""

    def __init__(self, workdir: str, cluster: str, host: str) -> None:
        self.directory = os.path.join(workdir, f"hoplite-dask-{cluster}-{host}")
        self.socket = os.path.join(self.directory, "hoplited.sock")
        self._info_path = os.path.join(self.directory, "daemon.json")
        self._users: int | None = None  # our shared lock on users.lock, while attached

    def lock_path(self, name: str) -> str:
        """One of the directory's lock files (``start`` or ``users``)."""
        return os.path.join(self.directory, f"{name}.lock")

    async def attach(self, start: Starter, timeout: float) -> dict[str, Any]:
        """Use the host's daemon, starting it with ``start`` if none runs; its facts. Waits up
        to ``timeout`` for another worker's start or stop to finish."""
        deadline = asyncio.get_running_loop().time() + timeout
        starting = await _locked(self.lock_path("start"), fcntl.LOCK_EX, deadline)
        try:
            # Shared: waits only while a daemon that found itself unused is still exiting.
            self._users = await _locked(self.lock_path("users"), fcntl.LOCK_SH, deadline)
            info = await self._running()
            if info is None:
                try:
                    info = await start(self.directory)
                except BaseException:
                    self._release()
                    raise
                self._write_info(info)
            return info
        finally:
            os.close(starting)

    async def detach(self, timeout: float) -> dict[str, Any] | None:
        """Stop using the daemon; the last worker to detach stops it. The stopped daemon's
        facts, or None if other workers still use it (or none ran)."""
        if self._users is None:
            return None
        deadline = asyncio.get_running_loop().time() + timeout
        stopping = await _locked(self.lock_path("start"), fcntl.LOCK_EX, deadline)
        try:
            self._release()
            last = os.open(self.lock_path("users"), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                try:
                    fcntl.flock(last, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return None  # other workers use it, or it found itself unused and exits
                info = self._read_info()
                if info is None:
                    return None
                await asyncio.to_thread(daemon_process.stop_pid, int(info["pid"]))
                shutil.rmtree(self.directory, ignore_errors=True)
                return info
            finally:
                os.close(last)
        finally:
            os.close(stopping)

    def _release(self) -> None:
        if self._users is not None:
            os.close(self._users)
            self._users = None

    async def _running(self) -> dict[str, Any] | None:
        """The facts of the daemon running here, if one does and answers."""
        info = self._read_info()
        if info is None or daemon_process.gone(int(info["pid"])):
            return None
        try:
            client = await connect(self.socket, timeout=CHECK_TIMEOUT)
        except (HopliteError, OSError):
            return None
        await client.close()
        return info

    def _read_info(self) -> dict[str, Any] | None:
        try:
            with open(self._info_path) as f:
                info: dict[str, Any] = json.load(f)
        except (FileNotFoundError, ValueError):
            return None
        return info

    def _write_info(self, info: dict[str, Any]) -> None:
        partial = self._info_path + ".new"
        with open(partial, "w") as f:
            json.dump(info, f)
        os.replace(partial, self._info_path)


async def _locked(path: str, mode: int, deadline: float) -> int:
    """A descriptor of ``path`` (created with its directory if need be) holding a flock in
    ``mode``, taken on the file that is at ``path`` once we hold it: a lock on a file the last
    worker removed meanwhile is let go and taken again. TimeoutError past ``deadline``.
    Polled, so that the worker's event loop never blocks on another process."""
    loop = asyncio.get_running_loop()
    while True:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if loop.time() > deadline:
                        raise TimeoutError(f"{path} stayed locked") from None
                    await asyncio.sleep(LOCK_POLL)
            if _same_file(fd, path):
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)


def _same_file(fd: int, path: str) -> bool:
    """Whether ``fd`` is the file now at ``path``."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False
