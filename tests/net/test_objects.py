"""Put, get, delete and broadcast through real daemons and real clients."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from helpers import eventually

import hoplite_client as hc
from hoplited.cluster.membership import OwnerSet

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
          np.uint8, np.uint64, np.bool_, np.complex64]


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.nbytes == b.nbytes and bool(np.array_equal(a.reshape(-1).view(np.uint8),
                                                        b.reshape(-1).view(np.uint8)))


async def test_put_get_one_node_keeps_dtype_and_shape(make_cluster, connect) -> None:
    """Arrays of every numeric dtype come back with their dtype, shape and bytes, read-only."""
    cluster = await make_cluster(1)
    client = await connect(cluster.sockets[0])
    rng = np.random.default_rng(1)
    for dtype in DTYPES:
        for shape in [(0,), (7,), (3, 5), (2, 3, 40000)]:
            x = (rng.random(shape) * 100).astype(dtype)
            got = await client.get(await client.put(x))
            assert got.dtype == x.dtype and got.shape == x.shape and same_bytes(got, x)
            assert not got.flags.writeable
            with pytest.raises(ValueError):
                got.flags.writeable = True


async def test_bytes_and_non_contiguous_inputs(make_cluster, connect) -> None:
    """bytes-like objects come back as uint8; strided arrays are stored in C order."""
    cluster = await make_cluster(1)
    client = await connect(cluster.sockets[0])
    got = await client.get(await client.put(b"hello hoplite"))
    assert got.dtype == np.uint8 and got.tobytes() == b"hello hoplite"
    big = np.arange(400_000, dtype=np.int32).reshape(800, 500)[:, ::2]
    got = await client.get(await client.put(big))
    assert np.array_equal(got, big)
    with pytest.raises(hc.InvalidArgumentError):
        await client.put(np.array([object()]))
    with pytest.raises(hc.InvalidArgumentError):
        await client.put([1, 2, 3])  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [1, 1000, 64 * 1024, 64 * 1024 + 1, 8 * 1024 * 1024 + 3])
async def test_remote_get_across_nodes(make_cluster, connect, size: int) -> None:
    """A get on another node returns the same bytes, inline (≤ 64 KiB) or streamed."""
    cluster = await make_cluster(2)
    a, b = [await connect(s) for s in cluster.sockets]
    x = np.frombuffer(np.random.default_rng(size).bytes(size), dtype=np.uint8)
    oid = await a.put(x)
    assert same_bytes(await b.get(oid, timeout=60), x)
    assert same_bytes(await b.get(oid, timeout=60), x)  # now local on b


async def test_a_broadcast_to_seven_receivers_gives_each_one_copy(make_cluster, connect) -> None:
    """Seven simultaneous gets of one 16 MiB object (many chunks: the path 64 MiB took, in a
    quarter of the time) all receive it bit-exact, forwarded between receivers."""
    cluster = await make_cluster(8, capacity="256MiB")
    clients = [await connect(s) for s in cluster.sockets]
    x = np.random.default_rng(7).random(4 * 1024 * 1024, dtype=np.float32)
    oid = await clients[0].put(x)
    results = await asyncio.gather(*(c.get(oid, timeout=120) for c in clients[1:]))
    for r in results:
        assert same_bytes(r, x)
    status = await clients[0].status()
    total_out = sum(n["bytes_out"] for n in status["nodes"])
    assert total_out == 7 * x.nbytes  # every receiver got exactly one copy
    senders = [n for n in status["nodes"] if n["bytes_out"] > 0]
    assert len(senders) > 1, "receivers forwarded to each other (a chain/tree, not a star)"


async def test_get_before_put_waits_for_the_put(make_cluster, connect) -> None:
    """A get of an id nobody has put yet completes when the object is put elsewhere."""
    cluster = await make_cluster(3)
    a, b, c = [await connect(s) for s in cluster.sockets]
    oid = hc.ObjectID.random()
    x = np.arange(1_000_000, dtype=np.float64)
    waiting = [asyncio.create_task(cl.get(oid, timeout=120)) for cl in (b, c)]

    async def both_waiting() -> bool:  # at the id's shard, before anyone put it
        return sum(n["directory"]["waiting_gets"] for n in (await a.status())["nodes"]) == 2

    await eventually(both_waiting, what="both gets waiting at the shard")
    assert not any(t.done() for t in waiting)
    await a.put(x, object_id=oid)
    for got in await asyncio.gather(*waiting):
        assert np.array_equal(got, x)


async def test_get_times_out_with_a_typed_error(make_cluster, connect) -> None:
    """A get of an id that is never put fails with HopliteTimeoutError after its timeout."""
    cluster = await make_cluster(2)
    b = await connect(cluster.sockets[1])
    with pytest.raises(hc.HopliteTimeoutError):
        await b.get(hc.ObjectID.random(), timeout=0.5)
    with pytest.raises(TimeoutError):  # it is also the builtin TimeoutError
        await b.get(hc.ObjectID.random(), timeout=0.2)


async def test_delete_removes_every_copy(make_cluster, connect) -> None:
    """After delete, no node has the object and its memory is freed once views are gone."""
    cluster = await make_cluster(3)
    clients = [await connect(s) for s in cluster.sockets]
    x = np.ones(4 * 1024 * 1024, dtype=np.float32)
    oid = await clients[0].put(x)
    views = await asyncio.gather(*(c.get(oid, timeout=60) for c in clients[1:]))
    await clients[1].delete(oid)
    assert all(np.array_equal(v, x) for v in views)  # views still readable
    for c in clients:
        with pytest.raises(hc.HopliteTimeoutError):
            await c.get(oid, timeout=0.3)
    del views
    for _ in range(100):
        status = await clients[0].status()
        if all(n["store"]["objects"] == 0 and n["store"]["arena_used"] == 0
               for n in status["nodes"]):
            break
        await asyncio.sleep(0.1)
    else:
        pytest.fail(f"memory not freed: {[n['store'] for n in status['nodes']]}")
    with pytest.raises(hc.ObjectNotFoundError):
        await clients[0].delete(oid)


async def test_a_small_put_without_an_id_is_owned_by_its_own_node(make_cluster, connect
                                                                  ) -> None:
    """docs/design.md §2.4: a small put that names no id is named by its daemon, with an id
    that daemon's own shard owns (four members: a few draws find one), so publishing it asks
    no other node. Gets elsewhere find it; an id the client names is kept; a second put
    under a daemon's id is refused like any other."""
    cluster = await make_cluster(4)
    clients = [await connect(s) for s in cluster.sockets]
    owners = OwnerSet([node.node_id for node in cluster.nodes])

    async def every_view_whole() -> bool:  # a member missing or suspected moves owners
        for client in clients:
            members = (await client.status())["local"]["members"]
            if len(members) != 4 or not all(m["alive"] and not m["suspected"]
                                             for m in members):
                return False
        return True

    await eventually(every_view_whole, what="every node trusting all four")
    for i, client in enumerate(clients):
        x = np.arange(100, dtype=np.int32) + i
        oids = [await client.put(x) for _ in range(5)]
        assert [owners.owner(oid) for oid in oids] == [cluster.nodes[i].node_id] * 5
        got = await clients[(i + 1) % len(clients)].get(oids[0], timeout=30)
        assert got.dtype == x.dtype and np.array_equal(got, x)
    named = hc.ObjectID.random()
    assert await clients[0].put(b"named", object_id=named) == named
    with pytest.raises(hc.ObjectExistsError):
        await clients[1].put(b"again", object_id=oids[0])


async def test_put_of_an_existing_id_is_refused(make_cluster, connect) -> None:
    """Objects are immutable: a second put with the same id fails on any node."""
    cluster = await make_cluster(2)
    a, b = [await connect(s) for s in cluster.sockets]
    oid = await a.put(np.zeros(100_000))
    for client in (a, b):
        with pytest.raises(hc.ObjectExistsError):
            await client.put(np.ones(100_000), object_id=oid)
    assert np.array_equal(await b.get(oid, timeout=30), np.zeros(100_000))


async def test_capacity_is_enforced_with_a_clear_error(make_cluster, connect) -> None:
    """An object larger than the free store space fails with CapacityError; others still work."""
    cluster = await make_cluster(2, capacity="64MiB")
    a, b = [await connect(s) for s in cluster.sockets]
    with pytest.raises(hc.CapacityError):
        await a.put(np.zeros(80 * 1024 * 1024, dtype=np.uint8))
    oid = await a.put(np.zeros(40 * 1024 * 1024, dtype=np.uint8))
    with pytest.raises(hc.CapacityError):  # after a second's wait for room (not the default 10)
        await a.put(np.zeros(40 * 1024 * 1024, dtype=np.uint8), timeout=1.0)
    assert (await b.get(oid, timeout=60)).nbytes == 40 * 1024 * 1024


SCRIPT = textwrap.dedent("""
    import sys, numpy as np, hoplite_client as hc
    client = hc.SyncClient(sys.argv[1])
    oid = hc.ObjectID.from_hex(sys.argv[3])
    if sys.argv[2] == "put":
        client.put(np.arange(3_000_000, dtype=np.int64), object_id=oid)
    else:
        got = client.get(oid, timeout=120)
        assert np.array_equal(got, np.arange(3_000_000, dtype=np.int64))
        print("ok", got.sum())
    client.close()
""")


async def test_two_client_processes_share_one_daemon(make_cluster) -> None:
    """One process puts and another gets through the same daemon (sync client API)."""
    cluster = await make_cluster(1)
    oid = hc.ObjectID.random().hex()
    sock = cluster.sockets[0]
    getter = await asyncio.create_subprocess_exec(sys.executable, "-c", SCRIPT, sock, "get", oid,
                                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    putter = await asyncio.create_subprocess_exec(sys.executable, "-c", SCRIPT, sock, "put", oid,
                                                  stderr=subprocess.PIPE)
    _, put_err = await asyncio.wait_for(putter.communicate(), 120)
    assert putter.returncode == 0, put_err.decode(errors="replace")
    out, err = await asyncio.wait_for(getter.communicate(), 120)
    assert getter.returncode == 0 and out.startswith(b"ok"), err.decode(errors="replace")


async def test_status_lists_members_and_traffic(make_cluster, connect) -> None:
    """status() names every member with its address and counts bytes moved."""
    cluster = await make_cluster(3)
    a, b = [await connect(s) for s in cluster.sockets[:2]]
    oid = await a.put(np.zeros(1 << 20, dtype=np.uint8))
    await b.get(oid, timeout=60)
    status = await a.status()
    ids = {m["node_id"] for m in status["local"]["members"]}
    assert ids == {n.node_id for n in cluster.nodes}
    assert all(m["alive"] for m in status["local"]["members"])
    by_id = {n["node_id"]: n for n in status["nodes"]}
    assert by_id[cluster.nodes[1].node_id]["bytes_in"] == 1 << 20
