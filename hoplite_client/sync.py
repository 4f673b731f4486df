"""A blocking wrapper around :class:`Client` for plain synchronous code.

It runs a private event loop in a daemon thread and forwards each call to it, so every method
of :class:`Client` is here with the same arguments, blocking until done. Its methods may be
called from any thread except the private loop's own (a callback on it would deadlock).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from numpy.typing import NDArray

from hoplite_client.client import GATHER_CONCURRENCY, PUT_TIMEOUT, ArrayLike, Client, connect
from hoplite_client.wire.ids import ObjectID

_T = TypeVar("_T")
# How long close waits for the private loop's thread to end.
CLOSE_JOIN_TIMEOUT = 5.0


class SyncClient:
    """``SyncClient(socket_path)`` connects at once; every method blocks until done."""

    def __init__(self, socket_path: str | None = None) -> None:
        """Connect to the daemon at ``socket_path`` (default ``$HOPLITE_SOCKET``)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="hoplite-client",
                                        daemon=True)
        self._thread.start()
        try:
            self._client: Client = self._call(connect(socket_path))
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the private loop and wait for its result (or its exception)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def node_id(self) -> str:
        """The id of the daemon this client is connected to."""
        return self._client.node_id

    def put(self, value: ArrayLike, object_id: ObjectID | None = None,
            timeout: float | None = PUT_TIMEOUT) -> ObjectID:
        """Store an array (dtype and shape kept) or bytes (as uint8); returns its id. Into a
        full store it waits up to ``timeout`` s for room, then raises CapacityError."""
        return self._call(self._client.put(value, object_id, timeout))

    def get(self, object_id: ObjectID, timeout: float | None = None,
            receivers: int = 0) -> NDArray[Any]:
        """A read-only array of the object, waiting up to ``timeout`` s for it to exist;
        ``receivers``: how many nodes get it together, if known (see ``Client.get``).

        Large objects are zero-copy views of shared memory, valid until :meth:`close`.
        """
        return self._call(self._client.get(object_id, timeout, receivers))

    def delete(self, object_id: ObjectID) -> None:
        """Delete every copy in the cluster (copies in use go when their users are done)."""
        self._call(self._client.delete(object_id))

    def status(self) -> dict[str, Any]:
        """This daemon's view of the cluster: members, objects, bytes in and out per node."""
        return self._call(self._client.status())

    def reduce(self, object_ids: Sequence[ObjectID], op: str = "sum",
               num_objects: int | None = None, object_id: ObjectID | None = None,
               timeout: float | None = None) -> ObjectID:
        """Start reducing the objects with ``op`` (sum, min, max, prod); returns the result's
        id at once (get it like any object). The first ``num_objects`` inputs to become ready
        are used (default: all); ``timeout`` bounds the wait for the inputs."""
        return self._call(self._client.reduce(object_ids, op, num_objects, object_id, timeout))

    def reduced_inputs(self, result_id: ObjectID,
                       timeout: float | None = None) -> list[ObjectID]:
        """Which inputs went into a reduce issued on this node, in the order they were ready."""
        return self._call(self._client.reduced_inputs(result_id, timeout))

    def gather(self, object_ids: Sequence[ObjectID], timeout: float | None = None,
               concurrency: int = GATHER_CONCURRENCY) -> list[NDArray[Any]]:
        """Get many objects at once (at most ``concurrency`` transfers in flight), in order."""
        return self._call(self._client.gather(object_ids, timeout, concurrency))

    def close(self) -> None:
        """Close the connection and stop the private loop. Arrays returned by :meth:`get`
        must not be used afterwards."""
        try:
            self._call(self._client.close())
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        """Stop the private loop, wait for its thread, and free the loop's descriptors."""
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=CLOSE_JOIN_TIMEOUT)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
