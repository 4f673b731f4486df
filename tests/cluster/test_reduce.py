"""Reduce, allreduce and gather through real daemons and real clients, checked against numpy."""

from __future__ import annotations

import asyncio
import functools
import mmap
import random
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from helpers import eventually

import hoplite_client as hc
from hoplited.cluster.membership import rendezvous_owner
from hoplited.collectives.input_wait import LONG_POLL
from hoplited.collectives.tree import tree_depth

OPS = {"sum": np.add, "min": np.minimum, "max": np.maximum, "prod": np.multiply}
DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint64]
# (rtol, atol) for sum/prod of floats: the tree adds in another order than numpy does.
FLOAT_TOL = {np.dtype(np.float16): (1e-2, 5e-2), np.dtype(np.float32): (1e-5, 1e-5),
             np.dtype(np.float64): (1e-12, 1e-12)}
INLINE_MAX = 64 * 1024
GET_TIMEOUT = 120
KiB, MiB = 1024, 1024 * 1024
# How long a result must stay absent while an input is missing: an observation window for a
# check that something does not happen, not a synchronisation.
ABSENT_FOR = 0.3
# Inputs that come late on purpose: the second of a mismatched pair comes this long after
# the first (placed by then, a large result announced); one-by-one puts this far apart.
SECOND_LATER = 0.5
ONE_BY_ONE = 0.1
# A second input this late: longer than the ~12 s of fruitless pulls after which a get once
# gave up on the result's silent (trusted) node; the point of that test.
SLOW_INPUT = 15.0


# ------------------------------------------------------------------------------- helpers ---
def make_inputs(rng: np.random.Generator, dtype: type, op: str, count: int,
                shape: Sequence[int]) -> list[np.ndarray]:
    """``count`` arrays; prod gets small values, integer sums use the full range (wrapping)."""
    dt = np.dtype(dtype)
    out = []
    for _ in range(count):
        if dt.kind == "f":
            lo, hi = (0.5, 1.5) if op == "prod" else (-1.0, 1.0)
            out.append((lo + (hi - lo) * rng.random(shape)).astype(dt))
        elif op == "prod":
            lo = 1 if dt.kind == "u" else -2
            out.append(rng.integers(lo, 3, size=shape, dtype=dt))
        else:
            info = np.iinfo(dt)
            out.append(rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True))
    return out


def expected(op: str, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """numpy's answer: integers in their own dtype (wrapping, exact), floats in float64."""
    ufunc = OPS[op]
    if arrays[0].dtype.kind == "f":
        return functools.reduce(ufunc, [a.astype(np.float64) for a in arrays])
    with np.errstate(all="ignore"):
        return functools.reduce(ufunc, arrays)


def check_result(got: np.ndarray, op: str, arrays: Sequence[np.ndarray], what: str = "") -> None:
    x = arrays[0]
    assert got.dtype == x.dtype and got.shape == x.shape, (
        f"{what}: result is {got.dtype}{got.shape}, inputs {x.dtype}{x.shape}")
    want = expected(op, arrays)
    if x.dtype.kind == "f" and op in ("sum", "prod"):
        rtol, atol = FLOAT_TOL[x.dtype]
        g = got.astype(np.float64)
        assert np.allclose(g, want, rtol=rtol, atol=atol), (
            f"{what}: max abs error {np.max(np.abs(g - want))}")
    elif x.dtype.kind == "f":  # min and max are exact whatever the order
        assert np.array_equal(got.astype(np.float64), want), f"{what}: {op} differs"
    else:
        assert np.array_equal(got, want), (
            f"{what}: {int(np.count_nonzero(got != want))} of {got.size} elements differ")


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.nbytes == b.nbytes and bool(np.array_equal(a.reshape(-1).view(np.uint8),
                                                        b.reshape(-1).view(np.uint8)))


def page(n: int) -> int:
    return (max(n, 1) + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE


async def put_spaced(clients: Sequence[hc.Client], arrays: Sequence[np.ndarray],
                     nodes: Sequence[int], ids: Sequence[hc.ObjectID], order: Sequence[int],
                     delays: Sequence[float]) -> None:
    """Put input i (for i in ``order``) on ``clients[nodes[i]]``, ``delays`` apart: inputs
    that come late and in a chosen order, on purpose."""
    for i, pause in zip(order, delays):
        await asyncio.sleep(pause)
        await clients[nodes[i]].put(arrays[i], object_id=ids[i])


async def waits_left(client: hc.Client, waiting: int) -> None:
    """Wait until the gets and reduce waits pending at the shards number ``waiting``."""

    async def left() -> bool:
        nodes = (await client.status())["nodes"]
        return sum(n["directory"]["waiting_gets"] for n in nodes) == waiting

    await eventually(left, what=f"{waiting} waits left at the shards")


async def node_stats(client: hc.Client, cluster) -> dict[int, dict]:
    """status() of every node, by cluster index."""
    index = {n.node_id: i for i, n in enumerate(cluster.nodes)}
    status = await client.status()
    return {index[n["node_id"]]: n for n in status["nodes"]}


async def wait_settled(client: hc.Client, cluster, objects: dict[int, int],
                       sizes: dict[int, list[int]] | None = None) -> None:
    """Poll until every node holds exactly ``objects[i]`` objects (of ``sizes[i]`` bytes), runs
    no reduce task and keeps no deleted-but-pinned memory."""
    last = None
    for _ in range(300):
        stats = await node_stats(client, cluster)
        last = {i: (s.get("store"), s.get("reduce_tasks")) for i, s in stats.items()}
        ok = len(stats) == len(cluster.nodes)
        for i, s in stats.items():
            store = s.get("store")
            if store is None:
                ok = False
                continue
            ok = ok and s["reduce_tasks"] == 0 and store["objects"] == objects.get(i, 0)
            ok = ok and store["pinned_deleted"] == 0
            if sizes is not None:
                want = sizes.get(i, [])
                ok = ok and store["stored_bytes"] == sum(want)
                ok = ok and store["arena_used"] == sum(page(n) for n in want)
        if ok:
            return
        await asyncio.sleep(0.1)
    pytest.fail(f"stores did not settle to {objects} objects ({sizes} bytes): {last}")


# --------------------------------------------------------------------------------- tests ---
async def test_every_op_and_dtype_inline_and_pipelined(make_cluster, connect) -> None:
    """sum/min/max/prod over 8 dtypes, N in {2,3,5}, 1 KB (inline) and ~1 MiB match numpy."""
    cluster = await make_cluster(5)
    clients = [await connect(s) for s in cluster.sockets]
    rng = np.random.default_rng(11)
    counts = [2, 3, 5]

    async def one(op: str, oi: int, dtype: type, di: int, big: bool) -> None:
        dt = np.dtype(dtype)
        n = counts[(oi + di + big) % 3]
        coord = (oi * 8 + di + 2 * big) % 5
        nodes = [(coord + 1 + j) % 5 for j in range(n)]  # n == 5: one input on the caller
        if big:
            shape: tuple[int, ...] = (MiB // dt.itemsize + 3,)  # not a round size
        else:
            elems = 1000 // dt.itemsize
            shape = (elems,) if di % 2 else (5, elems // 5)
        arrays = make_inputs(rng, dtype, op, n, shape)
        ids = [await clients[nd].put(a) for nd, a in zip(nodes, arrays)]
        result = await clients[coord].reduce(ids, op=op)
        got = await clients[coord].get(result, timeout=GET_TIMEOUT)
        check_result(got, op, arrays, f"{op} {dt} n={n} shape={shape}")
        assert set(await clients[coord].reduced_inputs(result, timeout=GET_TIMEOUT)) == set(ids)

    checked = 0
    for big in (False, True):
        for oi, op in enumerate(OPS):
            await asyncio.gather(*(one(op, oi, dtype, di, big)
                                   for di, dtype in enumerate(DTYPES)))
            checked += len(DTYPES)
    assert checked == 2 * len(OPS) * len(DTYPES)


async def test_reduce_before_inputs_exist_random_order_and_delays(make_cluster, connect) -> None:
    """Reduces issued before their inputs exist, inputs then put in random order with delays on
    various nodes (N = 8, 5, 3; inline, tree-shaped, chain-shaped, > 4 MiB) match numpy."""
    cluster = await make_cluster(8, capacity="1GiB")
    clients = [await connect(s) for s in cluster.sockets]
    rng = np.random.default_rng(22)
    prng = random.Random(22)
    cases = [  # (n, dtype, op, elements, coordinator, input nodes)
        (8, np.float32, "sum", (65 * KiB) // 4 + 5, 0, list(range(8))),
        (8, np.int64, "max", MiB // 8 + 1, 3, list(range(8))),
        (5, np.float64, "sum", (9 * MiB) // 8 + 7, 0, [3, 4, 5, 6, 7]),
        (3, np.uint8, "min", 3000, 7, [0, 1, 2]),
        (5, np.int32, "prod", (100 * KiB) // 4, 2, [7, 6, 2, 0, 1]),
        (8, np.float16, "max", 40 * KiB, 5, list(range(8))),
    ]
    for n, dtype, op, elems, coord, nodes in cases:
        what = f"{op} {np.dtype(dtype)} n={n} elems={elems}"
        arrays = make_inputs(rng, dtype, op, n, (elems,))
        ids = [hc.ObjectID.random() for _ in range(n)]
        result = await clients[coord].reduce(ids, op=op)
        getter = asyncio.create_task(clients[coord].get(result, timeout=GET_TIMEOUT))
        await asyncio.sleep(ABSENT_FOR)
        assert not getter.done(), f"{what}: result exists before any input"
        order = prng.sample(range(n), n)
        delays = [prng.uniform(0.0, 0.15) for _ in range(n)]
        await put_spaced(clients, arrays, nodes, ids, order, delays)
        check_result(await getter, op, arrays, what)
        used = await clients[coord].reduced_inputs(result, timeout=GET_TIMEOUT)
        assert sorted(used) == sorted(ids), what
        nbytes = elems * np.dtype(dtype).itemsize
        if n == 8 and INLINE_MAX < nbytes < 80 * KiB:
            # Make sure this case really went through a tree (depth > 0), not one chain.
            links = (await node_stats(clients[coord], cluster))[coord]["links"]
            depth = tree_depth(n, nbytes, links["bandwidth_Bps"], links["latency_s"])
            assert depth > 0, f"{what}: the link model {links} gives a single chain"
    await wait_settled(clients[0], cluster, {
        i: sum(i in c[5] for c in cases) + sum(c[4] == i for c in cases) for i in range(8)})


async def test_subset_reduce_uses_the_first_k_ready(make_cluster, connect) -> None:
    """num_objects=k uses exactly the first k inputs to be put, and reduced_inputs names them
    in readiness order (inline, pipelined, and k = 1 from a remote node or the caller)."""
    cluster = await make_cluster(4)
    clients = [await connect(s) for s in cluster.sockets]
    rng = np.random.default_rng(33)
    prng = random.Random(33)
    cases = [  # (dtype, op, elements, k, coordinator, input nodes)
        (np.int32, "sum", 250, 3, 0, [1, 2, 3, 1, 2, 0]),
        (np.float64, "sum", (2 * MiB) // 8 + 1, 3, 0, [1, 2, 3, 1, 2, 0]),
        (np.uint64, "max", (300 * KiB) // 8, 4, 1, [0, 2, 3, 0, 2, 3, 1]),
        (np.float32, "prod", MiB // 4, 1, 2, [3, 0, 1]),  # k=1: the root is a remote leaf
        (np.int8, "min", MiB, 1, 3, [3, 3, 3]),  # k=1 on the caller's node
    ]
    for dtype, op, elems, k, coord, nodes in cases:
        n = len(nodes)
        what = f"{op} {np.dtype(dtype)} k={k}/{n}"
        arrays = make_inputs(rng, dtype, op, n, (elems,))
        ids = [hc.ObjectID.random() for _ in range(n)]
        result = await clients[coord].reduce(ids, op=op, num_objects=k)
        order = prng.sample(range(n), n)
        # Sequential puts: each once the coordinator's wait for it at its shard has ended
        # (after the k-th, every other wait is cancelled): the first k to be ready are
        # order[:k], in that order.
        for put, i in enumerate(order[:k], start=1):
            await clients[nodes[i]].put(arrays[i], object_id=ids[i])
            await waits_left(clients[coord], n - put if put < k else 0)
        used = await clients[coord].reduced_inputs(result, timeout=GET_TIMEOUT)
        assert used == [ids[i] for i in order[:k]], what
        await put_spaced(clients, arrays, nodes, ids, order[k:], [0.0] * (n - k))
        got = await clients[coord].get(result, timeout=GET_TIMEOUT)
        chosen = [arrays[i] for i in order[:k]]
        check_result(got, op, chosen, what)
        if k == 1:
            assert same_bytes(got, chosen[0]), what
        assert await clients[coord].reduced_inputs(result) == used  # stable afterwards


async def test_the_waits_for_backup_inputs_end_at_their_shards(make_cluster, connect) -> None:
    """Once a reduce has its first k inputs, its waits for the others end: the coordinator
    cancels its long polls at their shards (``Cancel``, docs/protocol.md §5) instead of
    leaving each there for the rest of its 30 s."""
    cluster = await make_cluster(3)
    clients = [await connect(s) for s in cluster.sockets]
    members = [n.node_id for n in cluster.nodes]
    ids = []
    for owner in (1, 1, 2, 2):  # the backups' shards are on other nodes than the caller's
        oid = hc.ObjectID.random()
        while rendezvous_owner(oid, members) != members[owner]:
            oid = hc.ObjectID.random()
        ids.append(oid)
    result = await clients[0].reduce(ids, num_objects=2)

    async def waiting() -> int:
        return sum(n["directory"]["waiting_gets"] for n in (await clients[0].status())["nodes"])

    await eventually(waiting, what="the reduce's waits at the inputs' shards")
    for i in (1, 2):
        await clients[i].put(np.full(1000, i, dtype=np.int64), object_id=ids[i])
    np.testing.assert_array_equal(await clients[0].get(result, timeout=GET_TIMEOUT),
                                  np.full(1000, 3, dtype=np.int64))

    async def none_waiting() -> bool:
        return await waiting() == 0

    # well within the 30 s a long poll would otherwise stay
    await eventually(none_waiting, timeout=LONG_POLL / 2, what="no wait left at any shard")


async def test_several_inputs_owned_by_the_same_node(make_cluster, connect) -> None:
    """Inputs put several to a node (some on the caller) reduce correctly, inline and large."""
    cluster = await make_cluster(3)
    clients = [await connect(s) for s in cluster.sockets]
    rng = np.random.default_rng(44)
    cases = [  # (dtype, op, shape, coordinator, input nodes)
        (np.int64, "sum", (100,), 0, [1, 1, 1, 2, 2, 0, 0]),
        (np.float32, "sum", (512, 1024 + 1), 0, [1, 1, 1, 2, 2, 0, 0]),
        (np.int32, "min", ((80 * KiB) // 4,), 2, [1, 1, 1, 1, 1, 1]),
        (np.uint8, "max", (5 * MiB + 3,), 1, [2, 1, 2, 1, 2, 1, 2, 1]),
    ]
    for dtype, op, shape, coord, nodes in cases:
        what = f"{op} {np.dtype(dtype)} {shape} on {nodes}"
        arrays = make_inputs(rng, dtype, op, len(nodes), shape)
        ids = [await clients[nd].put(a) for nd, a in zip(nodes, arrays)]
        result = await clients[coord].reduce(ids, op=op)
        check_result(await clients[coord].get(result, timeout=GET_TIMEOUT), op, arrays, what)
        assert sorted(await clients[coord].reduced_inputs(result)) == sorted(ids), what


async def test_mismatched_inputs_fail_with_invalid_argument(make_cluster, connect) -> None:
    """dtype/shape mismatches (inline and large) and non-numeric inputs make get (on every
    node) and reduced_inputs raise InvalidArgumentError promptly; the result never appears."""
    cluster = await make_cluster(3)
    clients = [await connect(s) for s in cluster.sockets]
    cases = [
        ("dtype inline", np.ones(250, np.float32), np.ones(250, np.int32)),
        ("shape inline", np.ones(250, np.int32), np.ones((10, 25), np.int32)),
        ("size inline/large", np.ones(10, np.float32), np.ones(1 << 18, np.float32)),
        ("bytes dtype", np.array([b"ab", b"cd"] * 100), np.array([b"ef", b"gh"] * 100)),
        ("dtype large", np.ones(1 << 17, np.float64), np.ones(1 << 17, np.int64)),
        ("shape large", np.ones(1 << 18, np.float32), np.ones((512, 512), np.float32)),
        ("size large/inline", np.ones(1 << 18, np.float32), np.ones(10, np.float32)),
    ]
    # A right answer takes well under a second; these only bound the wait when it is wrong.
    wait, wait_after = 20, 10

    async def outcome(coro) -> str:
        try:
            got = await coro
        except hc.InvalidArgumentError:
            return "InvalidArgumentError"
        except hc.HopliteError as exc:
            return type(exc).__name__
        return f"a result {getattr(got, 'dtype', '')}{getattr(got, 'shape', got)}"

    async def one(first: np.ndarray, second: np.ndarray) -> list[str]:
        ids = [hc.ObjectID.random(), hc.ObjectID.random()]
        result = await clients[0].reduce(ids)
        # Gets issued before any input exists, on the caller and on the other nodes.
        early = [asyncio.create_task(outcome(c.get(result, timeout=wait))) for c in clients]
        chooser = asyncio.create_task(outcome(clients[0].reduced_inputs(result, timeout=wait)))
        await clients[1].put(first, object_id=ids[0])
        await asyncio.sleep(SECOND_LATER)
        await clients[2].put(second, object_id=ids[1])
        got = [await t for t in [*early, chooser]]
        # After the failure: still an error everywhere, never data.
        got += await asyncio.gather(*(outcome(c.get(result, timeout=wait_after))
                                      for c in clients))
        got.append(await outcome(clients[0].reduced_inputs(result, timeout=wait_after)))
        return got

    outcomes = await asyncio.gather(*(one(f, s) for _, f, s in cases))
    wrong = {what: o for (what, _, _), o in zip(cases, outcomes)
             if any(x != "InvalidArgumentError" for x in o)}
    assert not wrong, ("get on nodes 0,1,2 before the inputs, reduced_inputs, get on nodes "
                       f"0,1,2 after, reduced_inputs after: {wrong}")
    await wait_settled(clients[0], cluster, {1: len(cases), 2: len(cases)})


async def test_bad_arguments_fail_at_once_and_inputs_that_never_appear_time_out(
        make_cluster, connect) -> None:
    """Unknown ops and num_objects out of range raise InvalidArgumentError at once; inputs that
    do not all appear within the reduce's timeout make get/reduced_inputs raise
    HopliteTimeoutError promptly (also for gets waiting on other nodes)."""
    cluster = await make_cluster(2)
    a, b = [await connect(s) for s in cluster.sockets]
    ids = [await b.put(np.ones(100, np.float32)), await a.put(np.ones(100, np.float32))]
    for kwargs in [{"op": "mean"}, {"op": "SUM"}, {"op": ""}, {"num_objects": 0},
                   {"num_objects": 3}, {"num_objects": -1}]:
        with pytest.raises(hc.InvalidArgumentError):
            await asyncio.wait_for(a.reduce(ids, **kwargs), 10)  # type: ignore[arg-type]
    with pytest.raises(hc.InvalidArgumentError):
        await asyncio.wait_for(a.reduce([]), 10)
    with pytest.raises(hc.ObjectExistsError):  # the result id is taken on this node
        await asyncio.wait_for(a.reduce(ids, object_id=ids[1]), 10)
    with pytest.raises(hc.ObjectNotFoundError):  # reduced_inputs only where it was issued
        await b.reduced_inputs(await a.reduce(ids))

    # Nothing ever appears: the reduce's own timeout (1 s), not the get's (120 s), fires.
    missing = [hc.ObjectID.random() for _ in range(3)]
    result = await a.reduce(missing, timeout=1.0)
    start = time.monotonic()
    with pytest.raises(hc.HopliteTimeoutError):
        await a.get(result, timeout=GET_TIMEOUT)
    with pytest.raises(hc.HopliteTimeoutError):
        await b.get(result, timeout=GET_TIMEOUT)
    with pytest.raises(hc.HopliteTimeoutError):
        await a.reduced_inputs(result, timeout=GET_TIMEOUT)
    assert time.monotonic() - start < 60

    # reduced_inputs with its own short timeout before the inputs exist; the reduce goes on.
    late = [hc.ObjectID.random() for _ in range(2)]
    result = await a.reduce(late)
    with pytest.raises(hc.HopliteTimeoutError):
        await a.reduced_inputs(result, timeout=0.3)
    x, y = np.arange(1000, dtype=np.int64), np.arange(1000, dtype=np.int64)[::-1].copy()
    await b.put(x, object_id=late[0])
    await a.put(y, object_id=late[1])
    assert np.array_equal(await b.get(result, timeout=GET_TIMEOUT), x + y)
    # a: ids[1], y, two inline results; b: ids[0], x, a copy of one result.
    await wait_settled(a, cluster, {0: 4, 1: 3})

    # Only one of the 2 needed inputs appears in time: a timeout for every get, for good,
    # within a few seconds (the gets' own 30 s must not be what ends them).
    slow = {}
    for size in (400, 1 << 18):
        partial = [hc.ObjectID.random() for _ in range(3)]
        result = await a.reduce(partial, num_objects=2, timeout=1.0)
        start = time.monotonic()
        waiting = [asyncio.create_task(c.get(result, timeout=30)) for c in (b, a)]
        await b.put(np.ones(size // 4, np.float32), object_id=partial[0])
        for name, task in zip("ba", waiting):
            with pytest.raises(hc.HopliteTimeoutError):
                await task
            if time.monotonic() - start > 20:
                slow[f"{size} B inputs, get on {name}"] = round(time.monotonic() - start, 1)
        await b.put(np.ones(size // 4, np.float32), object_id=partial[1])
        with pytest.raises(hc.HopliteTimeoutError):
            await b.get(result, timeout=5)
    assert not slow, f"the reduce's 1 s timeout did not end these gets: {slow}"


@pytest.mark.parametrize("elems", [100, 1 << 18])
async def test_reduce_into_an_id_that_exists_elsewhere_leaves_it_intact(
        make_cluster, connect, elems: int) -> None:
    """A reduce whose object_id names an object already put on another node fails without
    damaging that object: every node still gets the original bytes."""
    cluster = await make_cluster(3)
    clients = [await connect(s) for s in cluster.sockets]
    original = np.arange(elems, dtype=np.float32)
    taken = await clients[1].put(original)
    ids = [await clients[2].put(np.ones(elems, np.float32)),
           await clients[1].put(np.ones(elems, np.float32))]
    try:
        result = await clients[0].reduce(ids, object_id=taken)
        assert result == taken
    except hc.ObjectExistsError:
        pass  # refusing at once is fine too
    else:  # the reduce ends (and fails): its inputs are never reported
        with pytest.raises(hc.HopliteError):
            await clients[0].reduced_inputs(taken, timeout=30)
    for i, c in enumerate(clients):
        got = await c.get(taken, timeout=30)
        assert same_bytes(got, original), f"node {i} sees a different object"


async def test_a_reduce_on_8_nodes_gives_every_getter_the_same_sum(make_cluster,
                                                                   connect) -> None:
    """Reduce on node 0 with gets issued on all 8 nodes before it completes: every node gets
    identical bytes equal to numpy's sum of 16 MiB float32 inputs (pipelined in many
    chunks; 64 MiB took the same path four times as long); no temporaries remain."""
    cluster = await make_cluster(8, capacity="1GiB")
    clients = [await connect(s) for s in cluster.sockets]
    rng = np.random.default_rng(55)
    arrays = [rng.random(4 * MiB, dtype=np.float32) for _ in range(8)]
    ids = [await c.put(x) for c, x in zip(clients[:7], arrays[:7])]
    ids.append(hc.ObjectID.random())
    result = await clients[0].reduce(ids)
    gets = [asyncio.create_task(c.get(result, timeout=GET_TIMEOUT)) for c in clients]
    await asyncio.sleep(ABSENT_FOR)
    assert not any(g.done() for g in gets), "the result exists before its last input"
    await clients[7].put(arrays[7], object_id=ids[7])
    await every_node_got_the_sum(cluster, clients, gets, arrays)


async def every_node_got_the_sum(cluster: Any, clients: list[hc.Client],
                                 gets: list[asyncio.Task[Any]], arrays: list[Any]) -> None:
    """Every get returns the same bytes, numpy's sum of ``arrays``; afterwards each node holds
    its input and the result only (no temporaries)."""
    outs = await asyncio.gather(*gets)
    for i, out in enumerate(outs):
        assert same_bytes(out, outs[0]), f"node {i} got different bytes"
    check_result(outs[0], "sum", arrays, "allreduce")
    del outs
    gets.clear()
    size = arrays[0].nbytes
    await wait_settled(clients[0], cluster, {i: 2 for i in range(len(clients))},
                       {i: [size, size] for i in range(len(clients))})


async def test_allreduce_with_inputs_put_one_by_one(make_cluster, connect) -> None:
    """An allreduce issued on node 0, whose input comes first, the others put 0.1 s apart,
    each node asking for the result once it has put its input (the last input then hangs on
    the root, docs/design.md §4): every node gets numpy's sum; no temporaries remain."""
    n = 6
    cluster = await make_cluster(n, capacity="512MiB")
    clients = [await connect(s) for s in cluster.sockets]
    rng = np.random.default_rng(56)
    arrays = [rng.random(2 * MiB, dtype=np.float32) for _ in range(n)]
    ids = [hc.ObjectID.random() for _ in range(n)]
    result = await clients[0].allreduce(ids)
    gets = []
    for c, oid, x in zip(clients, ids, arrays, strict=True):
        await c.put(x, object_id=oid)
        gets.append(asyncio.create_task(c.get(result, timeout=GET_TIMEOUT)))
        await asyncio.sleep(ONE_BY_ONE)
    await every_node_got_the_sum(cluster, clients, gets, arrays)


async def test_allreduce_whose_gets_form_a_tree(make_cluster, connect) -> None:
    """An allreduce of 256 KiB inputs on 8 nodes: its result announces 7 receivers, and for
    objects under five 64 KiB units a binary tree beats a chain whatever the links measure
    (docs/design.md §3), so the gets, issued before the last input exists, hang two on each
    holder. Every node gets numpy's sum; no temporaries remain."""
    n = 8
    cluster = await make_cluster(n)
    clients = [await connect(s) for s in cluster.sockets]
    rng = np.random.default_rng(58)
    arrays = [rng.random(64 * 1024, dtype=np.float32) for _ in range(n)]
    ids = [await c.put(x) for c, x in zip(clients[:-1], arrays[:-1], strict=True)]
    ids.append(hc.ObjectID.random())
    result = await clients[0].allreduce(ids)
    gets = [asyncio.create_task(c.get(result, timeout=GET_TIMEOUT)) for c in clients]
    await asyncio.sleep(ABSENT_FOR)
    assert not any(g.done() for g in gets), "the result exists before its last input"
    await clients[-1].put(arrays[-1], object_id=ids[-1])
    await every_node_got_the_sum(cluster, clients, gets, arrays)


async def test_a_get_of_a_result_waits_while_its_inputs_are_slow_to_come(make_cluster,
                                                                          connect) -> None:
    """The result exists (its first input is here) but the second input comes 15 s later:
    the get on another node keeps waiting on the result's trusted, silent node and then gets
    the sum. Leaving a silent source after a second had it give up after about 12 s of
    fruitless pulls (docs/design.md §5, "Stalls behind a result")."""
    cluster = await make_cluster(3)
    clients = [await connect(s) for s in cluster.sockets]
    rng = np.random.default_rng(57)
    arrays = [rng.random(MiB // 4, dtype=np.float32) for _ in range(2)]
    ids = [await clients[0].put(arrays[0]), hc.ObjectID.random()]
    result = await clients[0].reduce(ids)
    get = asyncio.create_task(clients[2].get(result, timeout=GET_TIMEOUT))
    await asyncio.sleep(SLOW_INPUT)
    assert not get.done(), "the result exists before its second input"
    await clients[1].put(arrays[1], object_id=ids[1])
    check_result(await get, "sum", arrays, "slow inputs")


async def test_no_temporaries_remain_after_reduces(make_cluster, connect) -> None:
    """After tree, chain, inline and subset reduces, each store holds only the inputs put
    there and the results on the callers (exact byte counts) and runs no reduce task."""
    cluster = await make_cluster(5)
    clients = [await connect(s) for s in cluster.sockets]
    rng = np.random.default_rng(66)
    sizes: dict[int, list[int]] = {i: [] for i in range(5)}
    objects = {i: 0 for i in range(5)}
    cases = [  # (dtype, elements, coordinator, input nodes, k)
        (np.float64, (70 * KiB) // 8, 0, [0, 1, 2, 3, 4], 5),
        (np.int16, 3 * MiB + 1, 1, [2, 3, 4, 0], 4),
        (np.int32, 100, 2, [3, 4], 2),
        (np.float32, (200 * KiB) // 4, 3, [4, 0, 1, 2, 3], 3),
    ]
    for dtype, elems, coord, nodes, k in cases:
        arrays = [(rng.random(elems) * 100).astype(dtype) for _ in nodes]
        ids = [await clients[nd].put(x) for nd, x in zip(nodes, arrays)]
        for nd, x in zip(nodes, arrays):
            sizes[nd].append(x.nbytes)
            objects[nd] += 1
        result = await clients[coord].reduce(ids, num_objects=k)
        used = await clients[coord].reduced_inputs(result, timeout=GET_TIMEOUT)
        got = await clients[coord].get(result, timeout=GET_TIMEOUT)
        check_result(got, "sum", [arrays[ids.index(u)] for u in used], f"{dtype} k={k}")
        sizes[coord].append(got.nbytes)
        objects[coord] += 1
    await wait_settled(clients[0], cluster, objects, sizes)


async def test_gather_8_objects_from_8_nodes(make_cluster, connect) -> None:
    """gather of objects put on 8 different nodes returns them in order, bit-exact."""
    cluster = await make_cluster(8, capacity="512MiB")
    clients = [await connect(s) for s in cluster.sockets]
    rng = np.random.default_rng(77)
    shapes = [(10,), (1000, 3), (16 * KiB,), (16 * KiB + 1,), (3 * MiB,), (7, 11, 13), (1,),
              (8 * MiB + 5,)]
    dtypes = [np.float16, np.float64, np.int32, np.int32, np.uint8, np.int64, np.float32,
              np.float32]
    arrays = [(rng.random(s) * 1000).astype(d) for s, d in zip(shapes, dtypes)]
    ids = [await c.put(x) for c, x in zip(clients, arrays)]
    for reader in (0, 5):
        got = await clients[reader].gather(ids, timeout=GET_TIMEOUT)
        assert len(got) == len(arrays)
        for g, x in zip(got, arrays):
            assert g.dtype == x.dtype and g.shape == x.shape and same_bytes(g, x)
    # Reversed order, with one id put only after the gather started.
    late = hc.ObjectID.random()
    gathering = asyncio.create_task(
        clients[3].gather([late, *reversed(ids)], timeout=GET_TIMEOUT, concurrency=3))

    async def waiting_for_late() -> bool:  # the gather started: its get of ``late`` waits
        return sum(n["directory"]["waiting_gets"] for n in (await clients[0].status())["nodes"]) > 0

    await eventually(waiting_for_late, what="the gather's get waiting for the late id")
    extra = np.arange(5000, dtype=np.int16)
    await clients[6].put(extra, object_id=late)
    got = await gathering
    for g, x in zip(got, [extra, *reversed(arrays)]):
        assert g.dtype == x.dtype and g.shape == x.shape and same_bytes(g, x)


async def test_empty_arrays_can_be_put_reduced_and_gathered_anywhere(make_cluster,
                                                                     connect) -> None:
    """Zero-size arrays put on any node reduce to an empty result and gather bit-exact."""
    cluster = await make_cluster(3)
    clients = [await connect(s) for s in cluster.sockets]
    arrays = [np.zeros((0, 4), np.float32) for _ in range(9)]
    ids, errors = [], []
    for i, x in enumerate(arrays):  # most of these ids are owned by another node's shard
        try:
            ids.append(await clients[i % 3].put(x))
        except hc.HopliteError as exc:
            errors.append(f"put on node {i % 3}: {type(exc).__name__}: {exc}")
    assert not errors, errors
    result = await clients[0].reduce(ids, op="max")
    got = await clients[0].get(result, timeout=GET_TIMEOUT)
    assert got.dtype == np.float32 and got.shape == (0, 4)
    for g in await clients[2].gather(ids, timeout=GET_TIMEOUT):
        assert g.dtype == np.float32 and g.shape == (0, 4)
