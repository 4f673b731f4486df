"""The daemon's worker threads are all running before it serves, so that no submit on the
loop ever waits for a thread to start (hoplited/threads.py)."""

from __future__ import annotations

import threading

from hoplited.threads import started_executor


def test_every_worker_is_running_when_the_executor_is_returned() -> None:
    before = threading.active_count()
    executor = started_executor(3)
    try:
        assert threading.active_count() == before + 3
    finally:
        executor.shutdown(wait=True)
    assert threading.active_count() == before


def test_submits_reuse_the_started_threads() -> None:
    executor = started_executor(2)
    try:
        running = threading.active_count()
        seen = {executor.submit(threading.get_ident).result() for _ in range(20)}
        assert threading.active_count() == running
        assert len(seen) <= 2
    finally:
        executor.shutdown(wait=True)
