"""What moves the apps' arrays: Ray's object store or Hoplite, behind one small interface.

An app is written once against :class:`Transport`; ``--system`` picks the implementation
(:func:`make_transport`, called inside each actor). The two differ where the paper says they
do:

- a producer's output: Ray returns it from the actor call (Ray stores the return value in the
  producer node's object store, the ObjectRef is the handle); Hoplite puts it under an id the
  consumer chose up front (:meth:`Transport.slot`), so the consumer can name it before it exists;
- one array for many readers (:meth:`Transport.share`, :meth:`Transport.fetch`): ``ray.put``
  once and ``ray.get`` in every reader, or a Hoplite put and gets that pipeline the object
  from reader to reader;
- the sum of the first k of many outputs (:meth:`Transport.sum_first`): ``ray.wait`` for k,
  ``ray.get`` each into the caller and add them there, or one Hoplite
  ``reduce(ids, "sum", num_objects=k)`` whose tree of partial sums ends at the caller.

Failures surface as :class:`TransportError` (a timeout, or inputs whose producers died): the
app then drops the dead producers and retries with the survivors.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import numpy as np
import ray
from numpy.typing import NDArray

import hoplite_client.ray as hray
from hoplite_client import (
    HopliteTimeoutError,
    ObjectID,
    ObjectNotFoundError,
    PeerUnavailableError,
)
from hoplite_client.client import Client

SYSTEMS = ("ray", "hoplite")
# A handle to an array in flight: a Ray ObjectRef or a Hoplite ObjectID (both pickle).
Handle: TypeAlias = "ray.ObjectRef[Any] | ObjectID"
# What Ray raises when the actor or node that produced (or holds) an object is gone.
PRODUCER_GONE = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError,
                 ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError)
# How often a long wait checks whether its caller gave up on it.
POLL = 0.2
# How long closing waits for the calls still running (a given-up reduce's delete, say).
CLOSE_GRACE = 5.0
_T = TypeVar("_T")


class TransportError(RuntimeError):
    """An array did not arrive in time, or too many of the inputs' producers died."""


@dataclass(frozen=True)
class Reduced:
    """The sum of the first k inputs to be ready, and which inputs (indices) it holds."""

    total: NDArray[Any]
    used: list[int]


class Transport(ABC):
    """The object-moving layer of one process (an actor or the driver)."""

    system: str

    @abstractmethod
    def slot(self) -> ObjectID | None:
        """Where a producer's next output goes, chosen by its consumer (Ray: nowhere)."""

    @abstractmethod
    def output(self, array: NDArray[Any], slot: ObjectID | None) -> NDArray[Any] | None:
        """Producer side: publish ``array`` at ``slot``; the actor call returns the result."""

    @abstractmethod
    def handle(self, returned: ray.ObjectRef[Any], slot: ObjectID | None) -> Handle:
        """Consumer side: the handle of the output a call returning ``returned`` produces."""

    @abstractmethod
    def share(self, array: NDArray[Any]) -> Handle:
        """Store one copy of ``array`` for many readers."""

    @abstractmethod
    def fetch(self, handle: Handle, timeout: float, readers: int = 0) -> NDArray[Any]:
        """The array behind ``handle`` (read-only); ``readers``: how many fetch it at once."""

    @abstractmethod
    def sum_first(self, handles: Sequence[Handle], k: int, timeout: float,
                  give_up: Callable[[], bool] = lambda: False) -> Reduced:
        """The sum of the first ``k`` of ``handles`` to be ready (inputs whose producer died are
        skipped); :class:`TransportError` after ``timeout`` s or once ``give_up()`` holds."""

    @abstractmethod
    def free(self, handles: Sequence[Handle]) -> None:
        """Drop arrays nobody reads any more."""

    @abstractmethod
    def close(self) -> None:
        """Release what this transport holds (arrays fetched must not be used afterwards)."""


class RayTransport(Transport):
    """Plain Ray: objects in Ray's object store, moved by ``ray.get`` to whoever reads them."""

    system = "ray"

    def slot(self) -> ObjectID | None:
        return None

    def output(self, array: NDArray[Any], slot: ObjectID | None) -> NDArray[Any] | None:
        return array

    def handle(self, returned: ray.ObjectRef[Any], slot: ObjectID | None) -> Handle:
        return returned

    def share(self, array: NDArray[Any]) -> Handle:
        return ray.put(array)

    def fetch(self, handle: Handle, timeout: float, readers: int = 0) -> NDArray[Any]:
        try:
            value: NDArray[Any] = ray.get(_ref(handle), timeout=timeout)
        except (ray.exceptions.GetTimeoutError, *PRODUCER_GONE) as exc:
            raise TransportError(f"ray.get: {type(exc).__name__}: {exc}") from exc
        return value

    def sum_first(self, handles: Sequence[Handle], k: int, timeout: float,
                  give_up: Callable[[], bool] = lambda: False) -> Reduced:
        """``ray.wait`` for k ready outputs, ``ray.get`` each here and add them up."""
        deadline = time.monotonic() + timeout
        index = {ref: i for i, ref in enumerate(handles)}
        waiting = list(handles)
        total: NDArray[Any] | None = None
        used: list[int] = []
        while len(waiting) >= k - len(used):
            left = deadline - time.monotonic()
            ready, waiting = ray.wait(waiting, num_returns=k - len(used),
                                      timeout=max(min(left, POLL), 0))
            for ref in ready:
                try:
                    array = ray.get(ref, timeout=max(deadline - time.monotonic(), POLL))
                except PRODUCER_GONE:
                    continue
                except ray.exceptions.GetTimeoutError as exc:
                    raise TransportError(f"ray.get of an input: {exc}") from exc
                total = array.copy() if total is None else np.add(total, array, out=total)
                used.append(index[ref])
            if len(used) == k:
                assert total is not None
                return Reduced(total, used)
            if give_up() or time.monotonic() > deadline:
                raise TransportError(f"{len(used)} of {k} inputs in {timeout:.0f} s")
        raise TransportError(f"only {len(used) + len(waiting)} of {k} inputs left")

    def free(self, handles: Sequence[Handle]) -> None:
        """Nothing: Ray counts references, and frees an object once its handles are dropped."""

    def close(self) -> None:
        """Nothing: Ray's own connection outlives the app."""


class HopliteTransport(Transport):
    """Ray + Hoplite: arrays go through this Ray node's ``hoplited`` (an async client on a
    private event loop, so that long waits can be abandoned)."""

    system = "hoplite"

    def __init__(self, connect: Callable[[], Coroutine[Any, Any, Client]] = hray.client) -> None:
        """``connect``: how to reach this node's daemon (Ray's, by default)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="hoplite-transport")
        self._thread.start()
        self._client: Client = self._run(connect())

    def _submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        try:
            return self._submit(coro).result()
        except (HopliteTimeoutError, PeerUnavailableError) as exc:
            raise TransportError(f"hoplite: {type(exc).__name__}: {exc}") from exc

    def slot(self) -> ObjectID | None:
        return ObjectID.random()

    def output(self, array: NDArray[Any], slot: ObjectID | None) -> NDArray[Any] | None:
        if slot is None:
            raise ValueError("a Hoplite output needs the slot its consumer chose")
        self._run(self._client.put(array, object_id=slot))
        return None

    def handle(self, returned: ray.ObjectRef[Any], slot: ObjectID | None) -> Handle:
        if slot is None:
            raise ValueError("a Hoplite output needs the slot its consumer chose")
        return slot

    def share(self, array: NDArray[Any]) -> Handle:
        return self._run(self._client.put(array))

    def fetch(self, handle: Handle, timeout: float, readers: int = 0) -> NDArray[Any]:
        return self._run(self._client.get(_oid(handle), timeout=timeout, receivers=readers))

    def sum_first(self, handles: Sequence[Handle], k: int, timeout: float,
                  give_up: Callable[[], bool] = lambda: False) -> Reduced:
        """One ``reduce(ids, "sum", num_objects=k)``, its result fetched here."""
        ids = [_oid(h) for h in handles]
        index = {oid: i for i, oid in enumerate(ids)}
        future = self._submit(self._reduce(ids, k, timeout))
        # Poll with wait(), not result(timeout=): the reduce's own HopliteTimeoutError is a
        # TimeoutError too, and taken for a poll's end it would be raised again at once, for
        # ever, its traceback growing by a frame each time (docs/benchmarks.md, "The async SGD
        # hang"; tests/net/test_app_transport.py::test_a_reduce_that_times_out_ends_the_wait)
        while not concurrent.futures.wait([future], timeout=POLL).done:
            if give_up():
                future.cancel()
                raise TransportError(f"reduce of {k} of {len(ids)} abandoned")
        try:
            total, inputs = future.result()
        except (HopliteTimeoutError, PeerUnavailableError) as exc:
            raise TransportError(f"reduce: {type(exc).__name__}: {exc}") from exc
        return Reduced(total, [index[oid] for oid in inputs])

    async def _reduce(self, ids: list[ObjectID], k: int,
                      timeout: float) -> tuple[NDArray[Any], list[ObjectID]]:
        result = await self._client.reduce(ids, "sum", num_objects=k, timeout=timeout)
        try:
            total = await self._client.get(result, timeout=timeout)
            return total, await self._client.reduced_inputs(result, timeout=timeout)
        finally:  # the view stays valid: the daemon frees the copy once it is dropped
            await self._client.delete(result)

    def free(self, handles: Sequence[Handle]) -> None:
        """Delete every copy of each (one whose copies all died with their node is gone
        already)."""
        async def delete(oid: ObjectID) -> None:
            with contextlib.suppress(ObjectNotFoundError):
                await self._client.delete(oid)

        async def delete_all() -> None:
            await asyncio.gather(*(delete(_oid(h)) for h in handles))
        self._run(delete_all())

    def close(self) -> None:
        """Let the calls still running end (a reduce given up on still deletes its result),
        then close the client and stop the loop."""
        async def shut() -> None:
            running = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*running, return_exceptions=True),
                                       CLOSE_GRACE)
            await self._client.close()

        try:
            self._submit(shut()).result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5.0)
            if not self._thread.is_alive():
                self._loop.close()


def _ref(handle: Handle) -> ray.ObjectRef[Any]:
    if not isinstance(handle, ray.ObjectRef):
        raise TypeError(f"a Ray handle is an ObjectRef, not {type(handle).__name__}")
    return handle


def _oid(handle: Handle) -> ObjectID:
    if not isinstance(handle, ObjectID):
        raise TypeError(f"a Hoplite handle is an ObjectID, not {type(handle).__name__}")
    return handle


def make_transport(system: str) -> Transport:
    """The transport of ``system`` (one of :data:`SYSTEMS`) for this process."""
    if system == "ray":
        return RayTransport()
    if system == "hoplite":
        return HopliteTransport()
    raise ValueError(f"system must be one of {SYSTEMS}, not {system!r}")
