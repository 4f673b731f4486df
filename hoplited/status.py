"""What a daemon reports about itself and, asked by a client, about the whole cluster."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

from hoplite_client.wire.errors import HopliteError
from hoplite_client.wire.messages import Stats, StatusReply, WireMessage
from hoplited.cluster.link_model import LinkModel
from hoplited.cluster.membership import Membership
from hoplited.directory.shard import DirectoryShard
from hoplited.dispatch import Handler
from hoplited.memory.store import ObjectStore
from hoplited.rpc import Rpc
from hoplited.transfer.traffic import Traffic

# Per member, when a client asks for the cluster's status: a dead member must not hold it up.
STATUS_TIMEOUT = 2.0
# Entries kept of each list in a record sent that grows with load (the transfers and reduce
# slots under way), next to the count of all: enough examples to see what is going on, about
# 5 KB. Whole, the lists of 2,000 waiting gets take 350 KB, over the frame's MAX_HEADER.
STATUS_SAMPLE = 32
# Entries of each such list over the whole cluster's record, shared out between its nodes
# (STATUS_SAMPLE each up to 8 nodes, fewer past that): 256 transfers and 256 reduce slots take
# about 80 KB of the reply's MAX_HEADER, however many nodes are busy.
CLUSTER_SAMPLE = 256


class NodeStatus:
    """Builds the status record of this node; gathers every member's for ``hoplite status``."""

    def __init__(self, membership: Membership, store: ObjectStore, shard: DirectoryShard,
                 link_model: LinkModel, traffic: Traffic, rpc: Rpc,
                 gauges: dict[str, Callable[[], Any]], errors: Counter[str]) -> None:
        self._membership = membership
        self._store = store
        self._shard = shard
        self._link_model = link_model
        self._traffic = traffic
        self._rpc = rpc
        self._gauges = gauges  # e.g. clients, transfers under way: read when asked
        self._errors = errors  # error replies by type

    def handlers(self) -> dict[type[WireMessage], Handler]:
        return {Stats: self.on_stats}

    def on_stats(self, peer: str, msg: Stats, payload: memoryview | None) -> StatusReply:
        return StatusReply(info=self.local(sample=STATUS_SAMPLE))

    def local(self, sample: int | None = None) -> dict[str, Any]:
        """This node: address, members as it sees them, store, shard, traffic, links, and
        each gauge; a gauge's list (what is under way) also as its ``<name>_count``, and cut
        to its first ``sample`` entries (the record sent in a frame; None: whole, for the
        metrics)."""
        gauges: dict[str, Any] = {}
        for name, gauge in self._gauges.items():
            value = gauge()
            if isinstance(value, list):
                gauges[f"{name}_count"] = len(value)
                value = value[:sample]
            gauges[name] = value
        me = self._membership.me
        return {
            "node_id": me.node_id,
            "address": f"{me.host}:{me.port}",
            "socket": me.socket,
            "host_id": me.host_id,
            "pid": os.getpid(),
            "members": [{"node_id": m.node_id, "address": f"{m.host}:{m.port}",
                         "socket": m.socket, "host_id": m.host_id,
                         "alive": self._membership.is_alive(m.node_id),
                         "suspected": m.node_id in self._membership.suspected}
                        for m in self._membership.members.values()],
            "store": self._store.stats(),
            "directory": self._shard.stats(),
            **self._traffic.as_dict(),
            "links": self._link_model.as_dict(),
            "errors": dict(self._errors),
            **gauges,
        }

    async def cluster(self) -> dict[str, Any]:
        """This node's record and every other live member's (or the error asking it)."""
        local = self.local(sample=STATUS_SAMPLE)
        others = [n for n in self._membership.alive_ids() if n != self._membership.me.node_id]

        async def ask(node: str) -> dict[str, Any]:
            try:
                frame = await self._rpc.call_node(node, Stats(), timeout=STATUS_TIMEOUT)
                return frame.msg.info
            except HopliteError as exc:
                return {"node_id": node, "error": str(exc)}

        infos = await asyncio.gather(*(ask(n) for n in others))
        share = CLUSTER_SAMPLE // (1 + len(infos))
        return {"local": local, "nodes": [_cut(info, share) for info in (local, *infos)]}


def _cut(info: dict[str, Any], sample: int) -> dict[str, Any]:
    """``info`` with each list that has a ``<name>_count`` cut to its first ``sample``."""
    return {key: value[:sample] if isinstance(value, list) and f"{key}_count" in info
            else value for key, value in info.items()}
