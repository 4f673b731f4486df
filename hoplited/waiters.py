"""Coroutines waiting, by key, for something to happen to that key: an object to be created,
an entry to change. Each wait is bounded; a waiter that times out leaves nothing behind."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class KeyedWaiters(Generic[K]):
    """Futures by key, woken together by :meth:`wake`."""

    def __init__(self) -> None:
        self._waiters: dict[K, list[asyncio.Future[None]]] = {}

    def __len__(self) -> int:
        """How many coroutines wait, over every key."""
        return sum(len(w) for w in self._waiters.values())

    def waited(self) -> Iterable[K]:
        """The keys waited on now (a copy: waking them while iterating is safe)."""
        return list(self._waiters)

    async def wait(self, key: K, timeout: float | None) -> None:
        """Return once ``key`` is woken, or after ``timeout`` s (None: no limit)."""
        await self.wait_any((key,), timeout)

    async def wait_any(self, keys: Sequence[K], timeout: float | None) -> None:
        """Return once any of ``keys`` is woken, or after ``timeout`` s (None: no limit)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for key in keys:
            self._waiters.setdefault(key, []).append(fut)
        try:
            async with asyncio.timeout(timeout):  # not wait_for: docs/architecture.md §3
                await fut
        except TimeoutError:
            pass
        finally:
            for key in keys:
                waiters = self._waiters.get(key)
                if waiters is not None and fut in waiters:
                    waiters.remove(fut)
                    if not waiters:
                        del self._waiters[key]

    def wake(self, key: K) -> None:
        """Wake every coroutine waiting on ``key``."""
        for fut in self._waiters.pop(key, ()):
            if not fut.done():
                fut.set_result(None)
