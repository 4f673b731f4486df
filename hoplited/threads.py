"""The daemon's worker threads, every one started before it serves.

Arena pages are backed and reduces combined in threads (``run_in_executor``). asyncio's
default executor starts a thread at a submit that finds none idle, and ``Thread.start`` holds
the loop until the new thread runs: 1–6 ms on a loaded 2-core machine, paid in the first
transfers of every daemon (docs/benchmarks.md, "The first broadcasts").
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

# As many as asyncio's default executor would start at most.
WORKERS = min(32, (os.cpu_count() or 1) + 4)
START_TIMEOUT = 30.0  # seconds for every thread to be running; a loaded machine is slow


def started_executor(workers: int = WORKERS) -> ThreadPoolExecutor:
    """An executor whose ``workers`` threads are all running and idle: each submit here
    waits at a barrier, so the next finds no idle thread and starts one."""
    executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hoplited-worker")
    barrier = threading.Barrier(workers)
    for started in [executor.submit(barrier.wait, START_TIMEOUT) for _ in range(workers)]:
        started.result()
    return executor
