"""The ``hoplited`` process under a supervisor: a store larger than the host is refused at
start, and ``--exit-with-parent`` stops the daemon once the process that started it is gone
(as when Ray kills the actor of hoplite_client.ray with its node)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap

from helpers import eventually, process_gone, run_hoplited

from hoplited.config import host_memory


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
