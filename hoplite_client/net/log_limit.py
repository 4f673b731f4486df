"""Warnings that a peer can provoke at will, logged at a bounded rate.

A :class:`LimitedLog` logs the first occurrence of one kind of warning, then at most one line
per interval, which says how many like it were left out and repeats the latest. Without it, a
peer sending bad frames or connecting and hanging up in a loop writes the daemon's log as fast
as it can send (20,000 bad frames of 17 bytes each wrote 2 MB of log). :func:`limited` hands
out one such log per logger and kind, shared by every connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

# One line per kind every this many seconds at most: a flood costs a few lines a minute, and
# an operator still learns within seconds that it goes on.
LOG_INTERVAL = 10.0


class LimitedLog:
    """One kind of warning on ``logger``: the first logged, then at most one line per
    ``interval`` s counting those left out (with the latest of them)."""

    def __init__(self, logger: logging.Logger, interval: float = LOG_INTERVAL,
                 level: int = logging.WARNING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._log = logger
        self._interval = interval
        self._level = level
        self._clock = clock
        self._quiet_until = -float("inf")  # lines before this time are counted, not logged
        self._left_out = 0
        self._latest: tuple[str, tuple[object, ...]] = ("", ())
        self._flush: asyncio.TimerHandle | None = None
        self._flush_loop: asyncio.AbstractEventLoop | None = None  # the loop it runs on

    @property
    def left_out(self) -> int:
        """Lines counted and not logged yet."""
        return self._left_out

    def __call__(self, msg: str, *args: object) -> None:
        """Log ``msg % args`` now, or count it towards the next line."""
        now = self._clock()
        if now >= self._quiet_until:
            self._emit(msg, args, now)
            return
        self._left_out += 1
        self._latest = (msg, args)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: the count goes out with the next line instead
            return
        if self._flush is None or self._flush_loop is not loop:  # none, or on a closed loop
            self._flush = loop.call_later(self._quiet_until - now, self.flush)
            self._flush_loop = loop

    def flush(self) -> None:
        """Log the count of lines left out, if any, with the latest of them."""
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self._left_out:
            msg, args = self._latest
            self._emit(msg, args, self._clock())

    def _emit(self, msg: str, args: tuple[object, ...], now: float) -> None:
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
        if self._left_out:
            msg = f"{msg} (and {self._left_out} more like it in the last {self._interval:g} s)"
            self._left_out = 0
        self._log.log(self._level, msg, *args)
        self._quiet_until = now + self._interval


_LOGS: dict[tuple[str, str], LimitedLog] = {}


def limited(logger: logging.Logger, kind: str) -> LimitedLog:
    """The rate-limited log of warnings of ``kind`` on ``logger`` (one per pair, shared)."""
    key = (logger.name, kind)
    log = _LOGS.get(key)
    if log is None:
        log = _LOGS[key] = LimitedLog(logger)
    return log
