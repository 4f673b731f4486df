"""A blocking wrapper around :class:`Client` for plain synchronous code.

It runs a private event loop in a daemon thread and forwards each call to it.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Optional

import numpy as np

from hoplite_client.client import ArrayLike, Client, connect
from hoplite_client.wire.ids import ObjectID


class SyncClient:
    """``SyncClient(socket_path)`` connects at once; every method blocks until done."""

    def __init__(self, socket_path: Optional[str] = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hoplite-client",
                                        daemon=True)
        self._thread.start()
        self._client: Client = self._call(connect(socket_path))

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def put(self, value: ArrayLike, object_id: Optional[ObjectID] = None) -> ObjectID:
        return self._call(self._client.put(value, object_id))

    def get(self, object_id: ObjectID, timeout: Optional[float] = None) -> np.ndarray:
        return self._call(self._client.get(object_id, timeout))

    def delete(self, object_id: ObjectID) -> None:
        self._call(self._client.delete(object_id))

    def status(self) -> dict[str, Any]:
        return self._call(self._client.status())

    def close(self) -> None:
        """Close the connection and stop the private loop."""
        self._call(self._client.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def __enter__(self) -> "SyncClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
