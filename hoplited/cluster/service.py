"""Joining the cluster and learning of members: Join, MemberUp, Ping, Alarm and Probe.

``--join`` names any member; it answers with the live membership and tells the others
(MemberUp), so every member knows every other one. A link per member runs the heartbeat
(:mod:`.links`) for the members this node watches (:mod:`.watching`); a member found dead is
marked so in :class:`~.membership.Membership`, whose listeners move directory ownership. A
watcher that finds a member silent tells the members that do not watch it (Alarm), and each
of them asks the member itself (docs/design.md §5, "Watchers"). A member that declared us
dead and probes us (Probe, :mod:`.probing`) gets our live set, and the side rule decides
which of us runs again as a new member (docs/design.md §5, "Partitions heal"). A member that
cannot reach another asks us to ping it (PingFor) before it declares it dead (docs/design.md
§5, "A link broken between two members"). Now and then each member compares its live set with
another's (Roster) and learns of the members it missed: a MemberUp lost with a broken link or
refused by a member that had declared its sender dead (docs/design.md §5, "Membership
converges").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from hoplite_client.net.channel import Channel
from hoplite_client.net.handshake import HANDSHAKE_TIMEOUT, Identity, dial
from hoplite_client.wire.errors import (
    ConnectionLostError,
    HopliteError,
    HopliteTimeoutError,
    InvalidArgumentError,
    UnreachableError,
)
from hoplite_client.wire.messages import (
    Alarm,
    Alive,
    Join,
    MemberInfo,
    Members,
    MemberUp,
    Ok,
    Ping,
    PingFor,
    Probe,
    Reached,
    Roster,
    WireMessage,
)
from hoplited.cluster.links import Links
from hoplited.cluster.membership import Membership, roster_digest
from hoplited.cluster.partitions import plausible
from hoplited.cluster.watching import roster_partner, to_alarm
from hoplited.dispatch import Handler

log = logging.getLogger("hoplited.cluster")


class ClusterService:
    """This node's membership: joining, adding members, answering their pings."""

    def __init__(self, identity: Identity, membership: Membership, links: Links,
                 fenced: Callable[[str, list[str]], None]) -> None:
        self._identity = identity
        self._membership = membership
        self._links = links
        self._fenced = fenced  # a member with this live set declared us dead

    def handlers(self) -> dict[type[WireMessage], Handler]:
        return {Join: self.on_join, MemberUp: self.on_member_up, Ping: self.on_ping,
                Alarm: self.on_alarm, Probe: self.on_probe, PingFor: self.on_ping_for,
                Roster: self.on_roster}

    async def join(self, seeds: list[tuple[str, int]]) -> None:
        """Join through the first seed that answers; learn the whole membership from it."""
        errors: list[str] = []
        unreachable = True  # every seed refused the connection or timed out on it
        for host, port in seeds:
            try:
                protocol, _ = await dial(host, port, "peer", self._identity)
                try:
                    frame = await Channel(protocol).request(Join(member=self._membership.me),
                                                            timeout=HANDSHAKE_TIMEOUT)
                finally:
                    protocol.close()
            except HopliteError as exc:
                errors.append(f"{host}:{port}: {exc}")
                unreachable &= isinstance(exc, UnreachableError | HopliteTimeoutError)
                continue
            for member in frame.msg.members:
                self.add_member(member, announce=False)
            return
        error = UnreachableError if unreachable else ConnectionLostError
        raise error("could not join the cluster: " + "; ".join(errors))

    def add_member(self, member: MemberInfo, announce: bool) -> None:
        """Learn of a member; ``announce`` tells the others (when it joined through us)."""
        if member.node_id == self._identity.node_id:
            return
        if self._membership.declared_dead(member.node_id):  # it comes back under a new id
            log.info("member %s was declared dead: not added again", member.node_id)
            return
        if announce:
            for link in self._links.others():
                link.notify(MemberUp(member=member))
        self._links.open(member)
        self._membership.add(member)

    def on_join(self, peer: str, msg: Join, payload: memoryview | None) -> Members:
        self.add_member(msg.member, announce=True)
        alive = [self._membership.members[n] for n in self._membership.alive_ids()]
        return Members(members=alive)

    def on_member_up(self, peer: str, msg: MemberUp, payload: memoryview | None) -> None:
        self.add_member(msg.member, announce=False)

    def on_ping(self, peer: str, msg: Ping, payload: memoryview | None) -> Ok:
        return Ok()

    def on_probe(self, peer: str, msg: Probe, payload: memoryview | None) -> Alive:
        """``peer`` declared us dead and asks whether we run (had we declared it dead, the
        dispatcher would have refused it): answer with our live set, then let the side rule
        decide, on the same two sets, whether we run again as a new member or it does
        (docs/design.md §5, "Partitions heal")."""
        me = self._identity.node_id
        if peer not in self._membership.members or not plausible(peer, msg.alive, me):
            raise InvalidArgumentError(f"a Probe from {peer}, which is not a member or does "
                                       f"not count itself alive and us dead, decides nothing")
        alive = Alive(alive=list(self._membership.alive_ids()))
        self._fenced(peer, list(msg.alive))
        return alive

    async def on_ping_for(self, peer: str, msg: PingFor, payload: memoryview | None) -> Reached:
        """``peer`` cannot reach ``msg.node``: ping it over our own link and say whether it
        answered, within the timeout asked (checked by the dispatcher, cut to our heartbeat
        timeout). A member we hold dead, or do not know, is not reached; we are, trivially."""
        limit = self._links.timeout
        timeout = limit if msg.timeout is None else min(msg.timeout, limit)
        if msg.node == self._identity.node_id:
            return Reached(reached=True)
        link = self._links.get(msg.node)
        if link is None or link.liveness.dead:
            return Reached(reached=False)
        return Reached(reached=await link.reach(timeout))

    def on_roster(self, peer: str, msg: Roster, payload: memoryview | None) -> Members:
        """``peer`` compares live sets: our live members if they differ from its, else none."""
        alive = self._membership.alive_ids()
        if roster_digest(alive) == msg.digest:
            return Members(members=[])
        return Members(members=[self._membership.members[n] for n in alive])

    async def exchange_rosters(self, period: float) -> None:
        """Every ``period`` seconds, compare our live set with the next trusted member's on the
        ring and add the members it lists that we never heard of (a member we declared dead
        stays dead: ``add_member``)."""
        turn = 0
        while True:
            await asyncio.sleep(period)
            partner = roster_partner(self._identity.node_id, self._links.trusted(), turn)
            turn += 1
            link = None if partner is None else self._links.get(partner)
            if link is None:
                continue
            digest = roster_digest(self._membership.alive_ids())
            try:
                frame = await link.request(Roster(digest=digest), timeout=period)
            except HopliteError as exc:
                log.info("could not compare live sets with %s: %s", partner, exc)
                continue
            for member in frame.msg.members:
                if member.node_id not in self._membership.members:
                    log.info("member %s at %s:%d, alive for %s, was unknown here: added",
                             member.node_id, member.host, member.port, partner)
                    self.add_member(member, announce=False)

    def warn(self, node: str, dead: bool) -> None:
        """We watch ``node`` and found it silent: tell the members that do not watch it."""
        alive = self._membership.alive_ids()
        told = to_alarm(self._identity.node_id, node, alive, self._links.watchers)
        if told:
            log.info("telling %d members that %s is %s", len(told), node,
                     "dead" if dead else "suspected")
        for other in told:
            link = self._links.get(other)
            if link is not None:
                link.notify(Alarm(node=node, dead=dead))

    def on_alarm(self, peer: str, msg: Alarm, payload: memoryview | None) -> None:
        """A watcher of ``msg.node`` found it silent: a claim our own Ping must confirm."""
        if msg.node != self._identity.node_id and self._membership.is_alive(msg.node):
            self._links.alarm(msg.node, msg.dead)
