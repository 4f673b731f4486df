"""A failed reduce's result, through real daemons and clients: its gets fail at once with the
cause, also after its record's shard died or another member took the id over, and a later
reduce that names it as an input takes it for a failed input (uses another, or fails typed)
without the coordinator's daemon spinning on the shard's stored error."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from helpers import FAST_HEARTBEAT, eventually, wait_member_dead

import hoplite_client as hc
from hoplite_client.daemon_process import cpu_seconds
from hoplite_client.wire.ids import ObjectID
from hoplited.cluster.membership import rendezvous_owner

GET_TIMEOUT = 120.0  # a get that waits this long instead of failing at once fails the test
PROMPT = 30.0  # "at once" on a loaded 2-core machine: far below GET_TIMEOUT
IDLE = 2.0  # seconds of idle during which a daemon's CPU time is measured
IDLE_CPU = 0.7  # CPU seconds a daemon may use in IDLE: a spinning one uses about IDLE
KiB = 1024


def owned_by(members: list[str], owner: str) -> ObjectID:
    """A fresh id whose directory shard is ``owner``."""
    oid = ObjectID.random()
    while rendezvous_owner(oid, members) != owner:
        oid = ObjectID.random()
    return oid


async def failed_reduce(client: hc.Client, result: ObjectID) -> ObjectID:
    """Reduce a never-put input into ``result`` with a short timeout; return that input."""
    missing = ObjectID.random()
    await client.reduce([missing], object_id=result, timeout=0.3)
    return missing


@pytest.mark.parametrize("owner", ["coordinator", "other"])
async def test_gets_of_a_failed_reduce_fail_at_once_with_its_cause(make_cluster, connect,
                                                                   owner: str) -> None:
    """Gets issued before and after the reduce fails, on every node, raise the reduce's own
    timeout (naming the input that never came) at once, not their own 120 s one. With the
    result owned by the coordinator's node too (its producer is its shard)."""
    cluster = await make_cluster(3)
    clients = [await connect(s) for s in cluster.sockets]
    members = [n.node_id for n in cluster.nodes]
    result = owned_by(members, members[0] if owner == "coordinator" else members[1])
    start = time.monotonic()
    missing = await failed_reduce(clients[0], result)
    early = [asyncio.ensure_future(c.get(result, timeout=GET_TIMEOUT)) for c in clients]
    for get in early:
        with pytest.raises(hc.HopliteTimeoutError) as info:
            await get
        assert missing.hex() in str(info.value), info.value  # the reduce's cause
    for c in clients:  # the failure is recorded: a late get fails at once too
        with pytest.raises(hc.HopliteTimeoutError) as info:
            await c.get(result, timeout=GET_TIMEOUT)
        assert missing.hex() in str(info.value), info.value
    with pytest.raises(hc.HopliteTimeoutError):
        await clients[0].reduced_inputs(result, timeout=GET_TIMEOUT)
    assert time.monotonic() - start < PROMPT


# x's shard on the coordinator's node or another, an inline or a tree-sized input: each of
# the four cases is in one of these two (the spin was in the coordinator's handling of the
# stored failure, the same for either size).
@pytest.mark.parametrize(("owner", "elements"), [("coordinator", 16), ("other", 64 * KiB)],
                         ids=["coordinator-inline", "other-tree"])
async def test_a_failed_reduces_result_as_input_is_a_failed_input_not_a_spin(
        make_cluster, connect, owner: str, elements: int) -> None:
    """``reduce([x, other], num_objects=1)`` with no timeout, where x is the result of a reduce
    that timed out: the shard answers x's wait at once with that stored timeout. It is x's
    failure, so the reduce waits for ``other`` (put seconds later) and uses it; meanwhile no
    daemon burns CPU (none polls the shard again at once, forever)."""
    cluster = await make_cluster(2)
    a, b = [await connect(s) for s in cluster.sockets]
    members = [n.node_id for n in cluster.nodes]
    x = owned_by(members, members[0] if owner == "coordinator" else members[1])
    await failed_reduce(a, x)
    with pytest.raises(hc.HopliteTimeoutError):
        await a.get(x, timeout=GET_TIMEOUT)  # the failure is recorded at x's shard now
    other = ObjectID.random()
    result = await a.reduce([x, other], num_objects=1)

    async def waiting_for_other_only() -> bool:  # x's stored failure came back
        nodes = (await a.status())["nodes"]
        return sum(n["directory"]["waiting_gets"] for n in nodes) == 1

    await eventually(waiting_for_other_only, what="the reduce waiting for `other` alone")
    before = [cpu_seconds(n.pid) for n in cluster.nodes]
    await asyncio.sleep(IDLE)
    used = [round(cpu_seconds(n.pid) - t, 2) for n, t in zip(cluster.nodes, before)]
    assert all(u < IDLE_CPU for u in used), f"CPU seconds per daemon over {IDLE} s idle: {used}"
    value = np.arange(elements, dtype=np.float32)
    await b.put(value, object_id=other)
    assert np.array_equal(await a.get(result, timeout=GET_TIMEOUT), value)
    assert await a.reduced_inputs(result, timeout=GET_TIMEOUT) == [other]


async def test_a_reduce_whose_only_inputs_failed_fails_typed(make_cluster, connect) -> None:
    """With every input the result of a failed reduce, the reduce cannot make up its inputs:
    its gets raise the stored timeout at once, whatever their own timeout."""
    cluster = await make_cluster(2)
    a, b = [await connect(s) for s in cluster.sockets]
    failed = [ObjectID.random(), ObjectID.random()]
    for oid in failed:
        await failed_reduce(a, oid)
        with pytest.raises(hc.HopliteTimeoutError):
            await b.get(oid, timeout=GET_TIMEOUT)
    start = time.monotonic()
    result = await b.reduce(failed, num_objects=1)
    for c in (a, b):
        with pytest.raises(hc.HopliteTimeoutError):
            await c.get(result, timeout=GET_TIMEOUT)
    with pytest.raises(hc.HopliteTimeoutError):
        await b.reduced_inputs(result, timeout=GET_TIMEOUT)
    assert time.monotonic() - start < PROMPT


async def test_a_failed_reduces_record_survives_the_death_of_its_shard(make_cluster,
                                                                     connect) -> None:
    """The result's owner shard (node 2) dies after the reduce failed: the coordinator records
    the failure again at the new owner, so gets of the result still fail at once with it."""
    cluster = await make_cluster(3, daemon_args=FAST_HEARTBEAT)
    clients = [await connect(s) for s in cluster.sockets]
    members = [n.node_id for n in cluster.nodes]
    result = owned_by(members, members[2])
    missing = await failed_reduce(clients[0], result)
    with pytest.raises(hc.HopliteTimeoutError):
        await clients[1].get(result, timeout=GET_TIMEOUT)  # recorded at node 2
    cluster.kill(2)
    for client in clients[:2]:
        await wait_member_dead(client, members[2])
    start = time.monotonic()
    for client in clients[:2]:
        with pytest.raises(hc.HopliteTimeoutError) as info:
            await client.get(result, timeout=GET_TIMEOUT)
        assert missing.hex() in str(info.value), info.value
    assert time.monotonic() - start < PROMPT


async def test_a_failed_reduces_record_follows_its_id_to_a_member_that_joins(
        make_cluster, connect) -> None:
    """Failed reduces whose results node 0 both produced and owned (the producer is the shard);
    then a member joins and takes some of the ids over. Their gets, asked at the new owner,
    still fail at once with each reduce's cause."""
    cluster = await make_cluster(3)
    clients = [await connect(s) for s in cluster.sockets]
    members = [n.node_id for n in cluster.nodes]
    results = [owned_by(members, members[0]) for _ in range(24)]
    missing = dict(zip(results, await asyncio.gather(*(failed_reduce(clients[0], r)
                                                      for r in results))))
    for result in results:
        with pytest.raises(hc.HopliteTimeoutError):
            await clients[1].get(result, timeout=GET_TIMEOUT)  # recorded at node 0
    joiner = await cluster.spawn(3, join=cluster.seed)
    cluster.nodes.append(joiner)
    members.append(joiner.node_id)

    async def everyone_sees_four() -> bool:
        for client in clients:
            alive = [m for m in (await client.status())["local"]["members"] if m["alive"]]
            if len(alive) != 4:
                return False
        return True

    await eventually(everyone_sees_four, what="every member sees the joiner")
    moved = [r for r in results if rendezvous_owner(r, members) == joiner.node_id]
    assert moved, "none of 24 ids moved to the joiner (chance: 0.1%)"
    start = time.monotonic()
    for result in moved:
        with pytest.raises(hc.HopliteTimeoutError) as info:
            await clients[1].get(result, timeout=GET_TIMEOUT)
        assert missing[result].hex() in str(info.value), info.value
    assert time.monotonic() - start < PROMPT
