"""SyncClient: the blocking facade, driven from a plain thread against real daemons."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

import hoplite_client as hc
from hoplited.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.net

GET_TIMEOUT = 60.0
INLINE_MAX = 64 * 1024  # objects up to this size travel inline (hoplite_client.wire.frames)


def same(got: NDArray[Any], want: NDArray[Any]) -> bool:
    """Same dtype, same shape, same values."""
    return got.dtype == want.dtype and got.shape == want.shape and bool(
        np.array_equal(got, want))


def client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "hoplite-client"]


def scenario(sockets: list[str]) -> None:
    """put/get/reduce/reduced_inputs/gather/delete/status across two nodes, all blocking."""
    with hc.SyncClient(sockets[0]) as a, hc.SyncClient(sockets[1]) as b:
        assert a.node_id != b.node_id
        status = a.status()
        assert status["local"]["node_id"] == a.node_id
        assert sorted(n["node_id"] for n in status["nodes"]) == sorted([a.node_id, b.node_id])

        # put: an inline array under a chosen id, a shared-memory one, bytes.
        small_id = hc.ObjectID(bytes(range(20)))
        small = np.arange(12, dtype=np.int16).reshape(3, 4)
        assert a.put(small, small_id) == small_id
        big = np.arange(300_000, dtype=np.float32).reshape(1000, 300)
        assert big.nbytes > INLINE_MAX
        big_id = b.put(big)
        assert isinstance(big_id, hc.ObjectID) and big_id != small_id
        text_id = a.put(b"hello hoplite")

        # get: local and remote, inline and streamed.
        assert same(a.get(small_id), small)
        assert same(b.get(small_id, timeout=GET_TIMEOUT), small)
        assert same(a.get(big_id, timeout=GET_TIMEOUT), big)
        got_text = b.get(text_id, timeout=GET_TIMEOUT)
        assert got_text.dtype == np.uint8 and got_text.tobytes() == b"hello hoplite"
        assert not a.get(big_id).flags.writeable

        # reduce over one input per node, under a chosen result id.
        x0 = np.arange(50_000, dtype=np.int64) * 3
        x1 = np.arange(50_000, dtype=np.int64)[::-1].copy() - 7
        id0, id1 = a.put(x0), b.put(x1)
        result_id = hc.ObjectID(b"\xaa" * 20)
        assert a.reduce([id0, id1], op="sum", object_id=result_id) == result_id
        assert same(a.get(result_id, timeout=GET_TIMEOUT), x0 + x1)
        assert sorted(a.reduced_inputs(result_id, timeout=GET_TIMEOUT)) == sorted([id0, id1])

        # a subset reduce: the one input it used is named, and the result is that input.
        max_id = b.reduce([id0, id1], op="max", num_objects=1)
        got_max = b.get(max_id, timeout=GET_TIMEOUT)
        used = b.reduced_inputs(max_id, timeout=GET_TIMEOUT)
        assert len(used) == 1 and used[0] in (id0, id1)
        assert same(got_max, x0 if used[0] == id0 else x1)

        # gather: in the order asked, from both nodes, with a small concurrency bound.
        gathered = b.gather([small_id, big_id, result_id, id0], timeout=GET_TIMEOUT,
                            concurrency=2)
        assert len(gathered) == 4
        wants: list[NDArray[Any]] = [small, big, x0 + x1, x0]
        for got, want in zip(gathered, wants):
            assert same(got, want)
        del gathered

        # delete: gone everywhere; a second delete says so with the typed error.
        a.delete(big_id)
        for client in (a, b):
            with pytest.raises(hc.HopliteTimeoutError):
                client.get(big_id, timeout=0.3)
        with pytest.raises(hc.ObjectNotFoundError):
            b.delete(big_id)
        assert same(b.get(small_id), small)  # the others are untouched


async def test_sync_client_does_everything_the_async_one_does(
        make_cluster: Callable[..., Awaitable[LocalCluster]]) -> None:
    """Every SyncClient method, called from a worker thread, returns exact values."""
    cluster = await make_cluster(2)
    before = len(client_threads())
    await asyncio.to_thread(scenario, cluster.sockets)
    assert len(client_threads()) == before  # close stopped both private loops


async def test_sync_client_connect_failure_leaves_no_thread(tmp_path: Path) -> None:
    """A failed connect raises the typed error and stops the private loop's thread."""
    before = len(client_threads())
    with pytest.raises(hc.ConnectionLostError):
        await asyncio.to_thread(hc.SyncClient, str(tmp_path / "no-daemon.sock"))
    assert len(client_threads()) == before
