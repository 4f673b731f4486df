"""Starting and stopping a ``hoplited`` process for a framework that runs it on a host it does
not otherwise control (the Ray and Dask integrations).

:func:`start` runs the daemon, waits for its ready line and returns its facts, or raises
:class:`DaemonStartError` with the cause (the exit status and the log's last lines), so the
caller can name the host in one typed error. :func:`stop` ends a daemon we started;
:func:`stop_pid` one that another process of the same host started.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

# A daemon start on a loaded machine can take seconds (as in LocalCluster).
READY_TIMEOUT = 60.0
STOP_GRACE = 10.0
# hoplited's exit status when none of its --join peers could be reached: the cluster to join
# may be starting or gone, so a caller can try again with other peers. (A peer that refuses
# us, for a wrong token or certificate, is a bad set-up: status 2.)
EXIT_NO_PEER = 3


class DaemonStartError(Exception):
    """The daemon did not become ready; ``exit_code`` is its status if it exited."""

    def __init__(self, cause: str, exit_code: int | None = None) -> None:
        super().__init__(cause)
        self.exit_code = exit_code


def start(args: Sequence[str], log_path: str, detach: bool = False,
          timeout: float = READY_TIMEOUT) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Run ``args`` (a hoplited command line) with stderr appended to ``log_path``; the process
    and its ready line's facts once it is ready. ``detach``: in a session of its own, so that
    signals to the starter's process group do not reach it."""
    with open(log_path, "ab") as log:
        process = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=log,
                                   stdin=subprocess.DEVNULL, start_new_session=detach)
    assert process.stdout is not None
    try:
        line = _ready_line(process.stdout, timeout)
    finally:
        process.stdout.close()  # the ready line is all the daemon prints there
    if line is None:
        cause = _failure(process, log_path, timeout)
        code = process.poll()
        stop(process)
        raise DaemonStartError(cause, code)
    ready: dict[str, Any] = json.loads(line)
    return process, ready


def _ready_line(stdout: Any, timeout: float) -> bytes | None:
    """The daemon's ready line, or None if it exited or stayed silent too long."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([stdout], [], [], left)
        if readable:
            line: bytes = stdout.readline()
            return line or None
    return None


def _failure(process: subprocess.Popen[bytes], log_path: str, timeout: float) -> str:
    """Why the start failed: the exit status and the log's last lines."""
    code = process.poll()
    if code is None:  # silent: give it a moment to finish exiting, for the status
        try:
            code = process.wait(0.5)
        except subprocess.TimeoutExpired:
            code = None
    try:
        with open(log_path, errors="replace") as f:
            tail = "".join(f.readlines()[-5:]).strip()
    except OSError:
        tail = ""
    status = f"exited with {code}" if code is not None else f"not ready within {timeout:.0f}s"
    return f"hoplited {status}: {tail or 'no log'}"


def stop(process: subprocess.Popen[bytes], grace: float = STOP_GRACE) -> bool:
    """End a daemon we started (SIGTERM, then SIGKILL after ``grace``) and reap it. Whether
    it was still running."""
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGCONT)  # a stopped daemon cannot act on TERM
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    return True


def stop_pid(pid: int, grace: float = STOP_GRACE) -> bool:
    """End the daemon ``pid``, which another process may have started (SIGTERM, then SIGKILL
    after ``grace``); return once it is gone. Whether it was still running."""
    if gone(pid):
        return False
    for sig in (signal.SIGCONT, signal.SIGTERM):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
    deadline = time.monotonic() + grace
    while not gone(pid):
        if time.monotonic() > deadline:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                return True
            deadline = float("inf")
        time.sleep(0.05)
    return True


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a child of ours is reaped on the way; a zombie whose
    parent is another process counts as ended)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return True
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds process ``pid`` has used so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
