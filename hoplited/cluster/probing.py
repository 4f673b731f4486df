"""Probing the members declared dead, so that a partition heals, and acting on a member that
declared us dead (docs/design.md §5, "Partitions heal").

Two groups cut off from each other for longer than the heartbeat timeout declare each other
dead, and fencing then refuses whatever one sends the other: without a probe they would never
speak again. :class:`Prober` carries out :class:`~hoplited.cluster.partitions.DeadProbes`: at
each due time it dials a dead member's address and sends ``Probe`` with our live set. A refused
dial, or another node id at the address, means its process is gone (no more probes); no answer
means it is still cut off (probed again later). An answer settles which side runs again as new
members, by :func:`~hoplited.cluster.partitions.refused_yields` on the two live sets: a
refusal (it declared us dead too) goes to :meth:`Prober.fenced` as any refusal does (on our
links, or as a ``Probe`` we receive); an ``Alive`` reply (it had not declared us dead) is
decided here, with the live set we sent, as the prober is then the refuser.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from hoplite_client.net.channel import Channel
from hoplite_client.net.handshake import Identity, dial, refused
from hoplite_client.wire.errors import ConnectionLostError, DeclaredDeadError, HopliteError
from hoplite_client.wire.messages import Probe
from hoplited.cluster.links import Links, refusers_alive
from hoplited.cluster.membership import Membership
from hoplited.cluster.partitions import (
    DeadProbes,
    ProbeOutcome,
    plausible,
    refused_yields,
)
from hoplited.tasks import Tasks

log = logging.getLogger("hoplited.probing")


class Prober:
    """Asks the members declared dead, now and then, whether they run (see the module)."""

    def __init__(self, identity: Identity, membership: Membership, links: Links, tasks: Tasks,
                 first: float, run_again: Callable[[str, str], None]) -> None:
        self._identity = identity
        self._membership = membership
        self._links = links
        self._tasks = tasks
        self._timeout = first  # a probe's dial and answer, each: the heartbeat timeout
        self._run_again = run_again  # stop, to join again through that member, and why
        self._core = DeadProbes(first)
        self._poked = asyncio.Event()

    def fenced(self, by: str, alive: list[str]) -> None:
        """Member ``by``, whose live set is ``alive``, declared us dead (a refusal, or its
        Probe): the side rule says whether we run again as a new member or it does, and then
        it is dead to us too (docs/design.md §5, "Declared dead, then running again",
        "Partitions heal")."""
        me = self._identity.node_id
        if not plausible(by, alive, me):
            log.info("member %s refuses us with a live set that does not count itself alive "
                     "and us dead: it decides nothing", by)
            return
        mine = self._membership.alive_ids()
        if refused_yields(alive, mine):
            self._run_again(by, f"member {by} declared us dead, and its side ({len(alive)} "
                                f"members) outweighs ours")
            return
        link = self._links.get(by)
        if link is not None and not link.liveness.dead:
            log.warning("member %s declared us dead, but our side (%d members) outweighs its "
                        "(%d): it runs again as a new member, not us", by,
                        len(set(mine) - set(alive)), len(alive))
            link.condemn("it declared us dead, and its side is the smaller")

    def start(self) -> None:
        self._tasks.spawn(self._run(), name="probe-dead")

    def died(self, node: str) -> None:
        """``node`` was declared dead: probe it from a while on."""
        self._core.died(node, asyncio.get_running_loop().time())
        self._poked.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            for node in self._core.due(loop.time()):
                self._tasks.spawn(self._probe(node), name=f"probe-{node}")
            wake = self._core.wake()
            self._poked.clear()
            timeout = None if wake is None else max(0.0, wake - loop.time())
            try:
                async with asyncio.timeout(timeout):
                    await self._poked.wait()
            except TimeoutError:
                pass

    async def _probe(self, node: str) -> None:
        outcome: ProbeOutcome = "silent"
        try:
            outcome = await self._ask(node)
        finally:
            self._core.outcome(node, outcome, asyncio.get_running_loop().time())
            self._poked.set()

    async def _ask(self, node: str) -> ProbeOutcome:
        """One probe of ``node``: how it went, after acting on any answer."""
        member = self._membership.members[node]
        try:
            protocol, peer_id = await dial(member.host, member.port, "peer", self._identity,
                                           timeout=self._timeout)
        except ConnectionLostError as exc:
            return "gone" if refused(exc) else "silent"
        except HopliteError:
            return "silent"
        try:
            if peer_id != node:  # another daemon took its port: its process is gone
                return "gone"
            sent = list(self._membership.alive_ids())
            try:
                frame = await Channel(protocol).request(Probe(alive=sent), timeout=self._timeout)
            except DeclaredDeadError as exc:  # it declared us dead too: a partition healed
                log.info("member %s, declared dead, runs and declared us dead too", node)
                self.fenced(node, refusers_alive(exc))
                return "answered"
            except HopliteError:
                return "silent"
            theirs = frame.msg.alive
            if node not in theirs:  # a live set without its own member decides nothing
                return "answered"
            if not refused_yields(sent, theirs):  # we are the refuser, and our side lost
                self._run_again(node, f"member {node}, declared dead, runs, and our side "
                                      f"({len(sent)} members) is the smaller")
            return "answered"
        finally:
            protocol.close()
