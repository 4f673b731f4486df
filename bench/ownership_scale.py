"""CPU time of object ownership as the cluster grows: an id's owner among M members, and what
one member's death costs a node that holds entries and copies.

Every node computes the owner shard of an id itself (rendezvous hashing,
``hoplited/cluster/membership.py``). The first time an id is asked about after the owner set
changed, that is a score per member. A change (a death, a join, a suspicion raised or cleared)
makes each node ask again for every entry its shard holds (``DirectoryState.membership_changed``)
and for every copy it holds, under the new and the previous owners (``DirectoryClient.moved``,
to re-announce what moved), all on the event loop that also answers heartbeats
(docs/design.md §2.3). No daemon: the membership and the shard get the calls a daemon makes.

Usage: python bench/ownership_scale.py --members 8,64,1000 --entries 1000
(setting up a shard of ``entries`` owned ids takes entries x members first asks: at 10,000
members, ``--entries 100``)
"""

from __future__ import annotations

import argparse
import logging
import time

from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import MemberInfo
from hoplited.cluster.membership import Membership, OwnerSet
from hoplited.directory.state import DirectoryState

ASKED = 2000  # ids asked about once each, for the cost of a first ask


def member(i: int) -> MemberInfo:
    return MemberInfo(node_id=f"{i:016x}", host=f"198.18.{i // 250}.{i % 250 + 1}", port=7000,
                      socket="/run/hoplite.sock", host_id=f"host-{i}")


def cluster(members: int) -> Membership:
    m = Membership(member(0))
    for i in range(1, members):
        m.add(member(i))
    return m


def first_ask_us(members: int) -> float:
    """Microseconds to find the owner of an id not asked about since the last change."""
    m = cluster(members)
    ids = [ObjectID.random() for _ in range(ASKED)]
    t0 = time.perf_counter()
    for oid in ids:
        m.owner(oid)
    return (time.perf_counter() - t0) / ASKED * 1e6


def owned_ids(m: Membership, count: int) -> list[ObjectID]:
    """``count`` ids this node owns now (drawn until enough are)."""
    out: list[ObjectID] = []
    while len(out) < count:
        oid = ObjectID.random()
        if m.owner(oid) == m.me.node_id:
            out.append(oid)
    return out


def death_ms(members: int, entries: int) -> tuple[float, int]:
    """Milliseconds a node spends on one member's death when its shard holds ``entries``
    entries and its store as many copies of ids owned elsewhere; and how many copies moved."""
    m = cluster(members)
    shard = DirectoryState(fanout=1, is_alive=m.is_alive, owner_of=m.owner, me=m.me.node_id)
    for oid in owned_ids(m, entries):
        shard.publish(oid, m.me.node_id, size=1 << 20, dtype="uint8", shape=[1 << 20],
                      version=b"v", inline=None)
    copies = [ObjectID.random() for _ in range(entries)]
    previous: list[OwnerSet] = []
    m.owner_listeners.append(previous.append)
    t0 = time.perf_counter()
    m.mark_dead(member(members // 2).node_id)
    shard.membership_changed()
    moved = sum(previous[0].owner(oid) != m.owner(oid) for oid in copies)
    return (time.perf_counter() - t0) * 1e3, moved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--members", default="8,64,1000",
                        help="comma-separated cluster sizes")
    parser.add_argument("--entries", type=int, default=1000,
                        help="entries in the node's shard, and copies in its store")
    args = parser.parse_args()
    logging.getLogger("hoplited").setLevel(logging.ERROR)  # every death would be logged
    print(f"| members | owner of an id, first ask | a death, {args.entries} entries and "
          f"{args.entries} copies | copies moved |")
    print("| --- | --- | --- | --- |")
    for members in (int(n) for n in args.members.split(",")):
        ms, moved = death_ms(members, args.entries)
        print(f"| {members} | {first_ask_us(members):.1f} us | {ms:.1f} ms | {moved} |",
              flush=True)


if __name__ == "__main__":
    main()
