"""Process bookkeeping shared by the baselines: find what a run started and stop it by PID.

A process is named by (pid, start time), so a PID reused by an unrelated process is never
signalled; nothing is ever stopped by name.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Sequence


def tail(path: str, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ("" if unreadable)."""
    with contextlib.suppress(OSError), open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])
    return ""


def proc_stat(pid: int) -> tuple[int, int, str] | None:
    """(parent PID, start time, state) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19]), fields[0]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _netns_pids(netns: str) -> set[int]:
    try:
        out = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True,
                             timeout=30, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {int(p) for p in out.split() if p.isdigit()}


def process_tree(roots: Sequence[int], namespaces: Sequence[str] = (),
                 marker: str = "") -> dict[int, int]:
    """{pid: start time} of ``roots``, all their descendants and, if ``marker`` is given, every
    process inside ``namespaces`` whose command line names it (a run's private temp dir finds
    processes that were reparented away from the tree)."""
    stats = {int(p): st for p in os.listdir("/proc")
             if p.isdigit() and (st := proc_stat(int(p))) is not None}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = [p for p in roots if p in stats]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    if marker:
        for ns in namespaces:
            found |= {p for p in _netns_pids(ns) if p in stats and marker in _cmdline(p)}
    found.discard(os.getpid())
    return {pid: stats[pid][1] for pid in found}


def alive(procs: dict[int, int]) -> dict[int, int]:
    """Those of (pid, start time) still running as the same process (zombies are gone)."""
    out = {}
    for pid, started in procs.items():
        st = proc_stat(pid)
        if st is not None and st[1] == started and st[2] != "Z":
            out[pid] = started
    return out


def signal_procs(procs: dict[int, int], sig: int) -> None:
    """Send ``sig`` to each (pid, start time) that is still that same, live process."""
    for pid in alive(procs):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
