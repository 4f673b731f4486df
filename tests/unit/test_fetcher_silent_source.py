"""A pull whose source falls silent ends at once, and never dials the silent source again.

``bench/chaos.py`` seed 21 trial 29: a reduce slot pulled a child on an idle data connection;
the child's node was SIGSTOPped, and its suspicion aborted the pull (``source_died``). The
connection had closed before any answer, which the fetcher reads as the end of a kept
connection, so it dialled the source again: the frozen node's kernel accepted the connection,
and the pull waited out the 10 s handshake before the reduce could repair. The fetcher here is
real, with a real store, pool and membership; the silent source is a real listening socket that
accepts and never speaks, as a frozen daemon's kernel does.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any, cast

import pytest

from hoplite_client.net.handshake import Identity
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.errors import PeerUnavailableError
from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import MemberInfo
from hoplited.cluster.link_model import LinkModel
from hoplited.cluster.membership import Membership
from hoplited.memory.arena import Arena
from hoplited.memory.space import Space
from hoplited.memory.store import VERSION_SIZE, ObjectStore, StoredObject
from hoplited.tasks import Tasks
from hoplited.transfer.data_connections import DataConnections
from hoplited.transfer.fetcher import Fetcher
from hoplited.transfer.traffic import Traffic

SIZE = 4096
# far below the handshake's 10 s, far above what the pull takes to fail once aborted
WITHIN = 5.0


def member(node: str, port: int) -> MemberInfo:
    return MemberInfo(node_id=node, host="127.0.0.1", port=port, socket="", host_id="h")


async def test_a_pull_aborted_by_its_source_falling_silent_does_not_dial_it_again() -> None:
    frozen = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel does), never speaks
    ours, theirs = socket.socketpair()
    tasks = Tasks()
    arena = Arena(1 << 20)
    try:
        membership = Membership(member("me", 1))
        membership.add(member("src", frozen.getsockname()[1]))
        identity = Identity("me", b"token")
        store = ObjectStore(arena)
        connections = DataConnections(identity, tasks, membership.is_alive)

        async def may_drop(obj: StoredObject) -> bool:
            return False

        fetcher = Fetcher(identity, store, arena, cast(Any, None), membership, LinkModel(),
                          Traffic(), tasks, stall_timeout=30.0, refused=lambda node: None,
                          space=Space(store, may_drop, tasks), connections=connections)
        loop = asyncio.get_running_loop()
        _, idle = await loop.create_connection(lambda: FrameProtocol(name="idle"), sock=ours)
        connections.give_back("src", idle)  # a kept connection from an earlier pull
        obj = store.create(ObjectID.random(), SIZE, "|u1", [SIZE], bytes(VERSION_SIZE))
        pull = asyncio.ensure_future(fetcher.pull_into(obj, "src", obj.oid, obj.version))
        # the Pull is out on the idle connection (its bytes wait at the other end), unanswered
        theirs.setblocking(False)
        async with asyncio.timeout(WITHIN):
            assert await loop.sock_recv(theirs, 1 << 16)
        assert not pull.done()
        membership.suspect("src", True)  # as the daemon does on a suspicion
        fetcher.source_died("src")
        async with asyncio.timeout(WITHIN):
            with pytest.raises(PeerUnavailableError):
                await pull
    finally:
        connections.close()
        await tasks.cancel_all()
        theirs.close()
        frozen.close()
        arena.close()
