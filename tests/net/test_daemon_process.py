"""The ``hoplited`` process under a supervisor: a store larger than the host is refused at
start, ``--exit-with-parent`` stops the daemon once the process that started it is gone (as
when Ray kills the actor of hoplite_client.ray with its node), ``--exit-when-unused`` once no
process holds its lock (the Dask workers of a host), and a join nobody answers has its own
exit status."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import textwrap

import pytest
from helpers import eventually, process_gone, run_hoplited

from hoplite_client.daemon_process import EXIT_NO_PEER
from hoplite_client.net.endpoints import TOKEN_ENV
from hoplited.config import host_memory


@pytest.fixture(autouse=True)
def token_in_tmp(tmp_path, monkeypatch) -> None:
    """The daemons here start without --token-file: their default token goes to tmp_path."""
    monkeypatch.setenv(TOKEN_ENV, str(tmp_path / "token"))


async def test_a_capacity_beyond_the_hosts_memory_is_refused(tmp_path) -> None:
    code, err = await run_hoplited("--socket", str(tmp_path / "d.sock"), "--capacity",
                                   str(host_memory() + (1 << 30)))
    assert code == 2, err
    assert "capacity" in err and "memory" in err and "Traceback" not in err, err


async def test_exit_with_parent_stops_the_daemon_when_its_parent_dies(tmp_path) -> None:
    """A parent starts the daemon and is SIGKILLed: the daemon, handed to another parent,
    stops by itself within seconds and removes its socket."""
    sock = tmp_path / "d.sock"
    parent_code = textwrap.dedent(f"""
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-m", "hoplited", "--socket", {str(sock)!r},
                                  "--capacity", "64MiB", "--exit-with-parent"],
                                 stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        print(child.stdout.readline().decode().strip(), flush=True)
        time.sleep(600)
    """)
    parent = await asyncio.create_subprocess_exec(sys.executable, "-c", parent_code,
                                                  stdout=asyncio.subprocess.PIPE,
                                                  stdin=asyncio.subprocess.DEVNULL)
    pid = 0
    try:
        assert parent.stdout is not None
        pid = json.loads(await asyncio.wait_for(parent.stdout.readline(), 60))["pid"]
        assert not process_gone(pid) and sock.exists()
        parent.kill()
        await parent.wait()

        async def stopped() -> bool:
            return process_gone(pid)
        await eventually(stopped, timeout=30, what="the orphaned daemon's exit")
        assert not sock.exists()
    finally:
        if parent.returncode is None:
            parent.kill()
            await parent.wait()
        if pid and not process_gone(pid):
            os.kill(pid, signal.SIGKILL)


async def test_exit_when_unused_stops_the_daemon_once_no_user_holds_the_lock(tmp_path) -> None:
    """Two users hold the lock shared: the daemon serves while either does, and stops by
    itself once the last one is SIGKILLed (the kernel drops its lock)."""
    sock, lock = tmp_path / "d.sock", tmp_path / "users.lock"
    user_code = textwrap.dedent(f"""
        import fcntl, os, time
        fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        print("locked", flush=True)
        time.sleep(600)
    """)
    users = [await asyncio.create_subprocess_exec(sys.executable, "-c", user_code,
                                                  stdout=asyncio.subprocess.PIPE,
                                                  stdin=asyncio.subprocess.DEVNULL)
             for _ in range(2)]
    daemon = None
    try:
        for user in users:
            assert user.stdout is not None
            assert await asyncio.wait_for(user.stdout.readline(), 60) == b"locked\n"
        daemon = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hoplited", "--socket", str(sock), "--capacity", "64MiB",
            "--exit-when-unused", str(lock), stdout=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL)
        assert daemon.stdout is not None
        json.loads(await asyncio.wait_for(daemon.stdout.readline(), 60))
        users[0].kill()
        await users[0].wait()
        # an observation window (nothing to wait for: the daemon must not stop): four of
        # its looks at the lock while one user is left
        await asyncio.sleep(2.0)
        assert daemon.returncode is None and sock.exists()
        users[1].kill()
        await users[1].wait()
        assert await asyncio.wait_for(daemon.wait(), 30) == 0
        assert not sock.exists()
    finally:
        for process in [*users, daemon]:
            if process is not None and process.returncode is None:
                process.kill()
                await process.wait()


async def test_a_join_nobody_answers_exits_with_its_own_status(tmp_path) -> None:
    """A supervisor tells "no peer answered" (worth trying other peers) from a bad set-up."""
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there now
    code, err = await run_hoplited("--socket", str(tmp_path / "d.sock"), "--capacity", "64MiB",
                                   "--join", f"127.0.0.1:{port}")
    assert code == EXIT_NO_PEER, err
    assert "Traceback" not in err
