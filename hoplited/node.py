"""The daemon's assembly: builds its parts, connects them, starts and stops them.

Nothing here decides anything. Each service receives only the collaborators it uses; the
handlers they expose are gathered into one table per inbound role (``dispatch``), which checks
that every message kind a role may send has a handler. docs/architecture.md draws the result.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import secrets
import socket
from collections import Counter
from typing import TYPE_CHECKING

from hoplite_client.net import congestion
from hoplite_client.net.endpoints import host_id
from hoplite_client.net.handshake import Identity
from hoplite_client.net.protocol import FrameProtocol
from hoplite_client.wire.messages import PEER, TOOL, MemberInfo
from hoplited.clients.listener import ClientListener
from hoplited.clients.session import SessionDeps
from hoplited.cluster.link_model import LinkModel
from hoplited.cluster.links import Links
from hoplited.cluster.membership import Membership, OwnerSet, owned_id, rejoin_seeds
from hoplited.cluster.probing import Prober
from hoplited.cluster.service import ClusterService
from hoplited.collectives import choose as c
from hoplited.collectives.allreduce import AllreduceDeps, Allreduces
from hoplited.collectives.coordinator import CoordinatorDeps
from hoplited.collectives.reductions import Reductions
from hoplited.collectives.ring_member import RingDeps
from hoplited.collectives.tree import tree_fanout
from hoplited.collectives.worker import ReduceWorker
from hoplited.config import DaemonConfig
from hoplited.directory.client import DirectoryClient
from hoplited.directory.service import DirectoryService
from hoplited.directory.shard import DirectoryShard
from hoplited.dispatch import Dispatcher
from hoplited.memory.arena import Arena
from hoplited.memory.space import Space
from hoplited.memory.store import ObjectStore
from hoplited.rpc import Rpc
from hoplited.status import NodeStatus
from hoplited.tasks import Tasks
from hoplited.transfer.data_connections import DataConnections
from hoplited.transfer.fetcher import Fetcher
from hoplited.transfer.sender import Sender
from hoplited.transfer.traffic import Traffic

if TYPE_CHECKING:
    from hoplited.metrics import MetricsServer

log = logging.getLogger("hoplited")

LISTEN_BACKLOG = 512  # simultaneous connects of a large cluster's members and receivers


class Daemon:
    """One host's object store and directory shard."""

    def __init__(self, config: DaemonConfig) -> None:
        config.check()
        self.config = config
        self.node_id = secrets.token_hex(6)
        self.identity = Identity(self.node_id, config.token, config.tls_contexts())
        self.arena = Arena(config.capacity, name=f"hoplite-{self.node_id}")
        self.store = ObjectStore(self.arena)
        self.tasks = Tasks()
        self._listener: ClientListener | None = None
        self._links: Links | None = None
        self._rpc: Rpc | None = None
        self._connections: DataConnections | None = None
        self._metrics: MetricsServer | None = None
        self._stopped = asyncio.Event()
        self.membership: Membership
        # set when a member declared us dead: where to join again as a new member
        self.rejoin: list[tuple[str, int]] | None = None

    async def start(self) -> None:
        """Bind, build every service around the bound address, then serve and join."""
        cfg = self.config
        sock = socket.create_server((cfg.host, cfg.port), backlog=LISTEN_BACKLOG)
        try:  # the connections it accepts inherit it; those we dial take it from identity
            congestion.use(sock, cfg.congestion)
            self.identity = dataclasses.replace(self.identity, congestion=cfg.congestion)
        except OSError as exc:
            log.warning("TCP congestion control %r is not available (%s): using the "
                        "system's", cfg.congestion, exc)
        me = MemberInfo(node_id=self.node_id, host=cfg.advertise_host or cfg.host,
                        port=sock.getsockname()[1], socket=os.path.abspath(cfg.socket_path),
                        host_id=host_id())
        self.membership = membership = Membership(me)
        link_model = LinkModel()
        traffic = Traffic()
        errors: Counter[str] = Counter()
        tasks, store, arena = self.tasks, self.store, self.arena
        self._links = links = Links(self.identity, cfg.heartbeat_interval, cfg.heartbeat_timeout,
                                    membership.mark_dead, link_model.observe_rtt,
                                    membership.suspect, cfg.suspect_after, cfg.watchers,
                                    on_warn=lambda node, dead: cluster.warn(node, dead),
                                    on_fenced=lambda node, alive: prober.fenced(node, alive))
        verdict_within = cfg.heartbeat_timeout + 2 * cfg.heartbeat_interval  # a death's news
        self._rpc = rpc = Rpc(self.identity, membership, links, tasks,
                              retry_window=verdict_within)
        # a holder only suspected is no source, and a copy put again replaces its copy: the
        # shard counts trusted members only (docs/design.md §5, "Suspicion")
        shard = DirectoryShard(cfg.fanout, membership.is_trusted, membership.owner, self.node_id,
                               fanout_for=lambda n, size: tree_fanout(
                                   n, size, link_model.bandwidth, link_model.latency),
                               halves_for=lambda n, size, dtype: c.bounds(c.broadcast_shape(
                                   c.Known(n, size, dtype,
                                           link=(link_model.bandwidth, link_model.latency),
                                           settings=c.Settings(two_trees=cfg.two_trees)))))
        directory = DirectoryClient(rpc, store, membership, tasks)
        space = Space(store, directory.may_drop, tasks)  # evicts what the shards agree to
        self._connections = connections = DataConnections(self.identity, tasks,
                                                           membership.is_alive)
        fetcher = Fetcher(self.identity, store, arena, directory, membership, link_model,
                          traffic, tasks, cfg.stall_timeout, links.refused,
                          patience=verdict_within, space=space, connections=connections)
        worker = ReduceWorker(store, arena, space, fetcher, rpc.tell, tasks, membership.is_alive,
                              membership.is_trusted)
        reductions = Reductions(CoordinatorDeps(me=self.node_id, store=store, arena=arena,
                                                space=space, directory=directory, rpc=rpc,
                                                fetcher=fetcher, link_model=link_model,
                                                is_alive=membership.is_alive, tasks=tasks,
                                                patience=verdict_within),
                                cfg.two_trees, cfg.merge)
        async def connect(node: str) -> FrameProtocol:
            """An idle data connection to ``node``, or a new one."""
            member = membership.members[node]
            return (connections.take(node, member.host, member.port)
                    or await connections.dial(member.host, member.port))

        ring = RingDeps(me=self.node_id, store=store, directory=directory, tell=rpc.tell,
                        connect=connect, give_back=connections.give_back,
                        probe=lambda node: connections.probe(
                            node, membership.members[node].host,
                            membership.members[node].port, links.refused),
                        observe_rate=link_model.observe_bandwidth, traffic=traffic,
                        tasks=tasks, stall_timeout=cfg.stall_timeout)
        allreduces = Allreduces(AllreduceDeps(
            me=self.node_id, store=store, space=space, directory=directory, rpc=rpc,
            fetcher=fetcher, reductions=reductions, is_alive=membership.is_alive, tasks=tasks,
            members=membership.alive_ids, ring=ring, ring_wait=cfg.ring_wait,
            link=lambda: (link_model.bandwidth, link_model.latency), pair=cfg.pair,
            pair_min_transfer=cfg.pair_min_transfer))
        sender = Sender(store, traffic, fetcher.fetching, allreduces.serve_ring)
        prober = Prober(self.identity, membership, links, tasks, first=cfg.heartbeat_timeout,
                        run_again=self.run_again)
        cluster = ClusterService(self.identity, membership, links, prober.fenced)
        status = NodeStatus(membership, store, shard, link_model, traffic, rpc, gauges={
            "clients": lambda: len(listener), "reduce_tasks": lambda: len(worker.slots),
            "reduce_folds": lambda: worker.folds, "reduce_merges": lambda: reductions.merges,
            "late_inputs_held": lambda: reductions.holds,
            "late_leaves_ahead": lambda: reductions.aheads,
            "reduce_pulls_paused": lambda: worker.paused,
            "reduces_in_halves": lambda: reductions.halved, "allreduces": lambda: len(allreduces),
            "gets_in_halves": lambda: fetcher.halved,
            "allreduces_as_ring": lambda: allreduces.counts.run,
            "rings_given_up": lambda: allreduces.counts.given_up,
            "allreduces_as_pair": lambda: allreduces.counts.pairs,
            "allreduces_as_trio": lambda: allreduces.counts.trios,
            "idle_data_connections": lambda: len(connections),
            "watching": links.watching, "control_links": links.connected,
            "transfers": fetcher.in_flight, "reduce_slots": worker.in_flight},
            errors=errors)
        listener = self._listener = ClientListener(cfg.socket_path, self.node_id, arena,
                                                   SessionDeps(
            store=store, arena=arena, fetcher=fetcher, directory=directory, reductions=reductions,
            allreduces=allreduces, cluster_status=status.cluster, tasks=tasks, errors=errors,
            space=space, put_id=lambda: owned_id(membership.owner_set, self.node_id)))
        handlers = {**cluster.handlers(), **status.handlers(), **directory.handlers(),
                    **DirectoryService(shard, self.node_id, membership.owner,
                                       membership.is_alive, rpc, tasks).handlers(),
                    **worker.handlers(), **reductions.handlers(), **allreduces.handlers()}
        rpc.serve(peer=Dispatcher(PEER, handlers, tasks, errors, membership.refusal),
                  tool=Dispatcher(TOOL, handlers, tasks, errors),
                  data=sender.serve)

        def membership_changed(previous: list[str]) -> None:
            links.rewatch(membership.alive_ids())
            for node in set(membership.alive_ids()) - set(previous) - {self.node_id}:
                member = membership.members[node]
                connections.warm(node, member.host, member.port)
            for node in set(previous) - set(membership.alive_ids()):
                prober.died(node)
                shard.forget_node(node)
                reductions.node_died(node)
                allreduces.node_died(node)
                worker.node_died(node)
                fetcher.source_died(node)
                sender.peer_died(node)
            rpc.views_changed()  # a suspected member dead: no object moves, yet waits end

        def owners_changed(previous: OwnerSet) -> None:
            """Objects moved between shards (a death, a join, a suspicion raised or
            cleared): hand over and re-announce (docs/design.md §5, "Ownership")."""
            moved = shard.membership_changed()
            if moved:
                log.info("%d directory entries moved to other shards", moved)
            rpc.owners_changed()
            directory.reannounce(previous, fetcher.pulling_from, sender.sending)
            reductions.reannounce(previous)

        def suspicion_changed(node: str, suspected: bool) -> None:
            if suspected:
                fetcher.source_died(node)  # pulls from it resume elsewhere now
                reductions.node_suspected(node)
                allreduces.node_suspected(node)
            else:
                reductions.node_trusted(node)
                allreduces.node_trusted(node)
                member = membership.members[node]
                connections.warm(node, member.host, member.port)  # dropped at the suspicion

        membership.listeners.append(membership_changed)
        membership.suspicion_listeners.append(suspicion_changed)
        membership.owner_listeners.append(owners_changed)
        rpc.listen(sock)
        prober.start()
        # anti-entropy: a member missed by a lost MemberUp is learned within a few timeouts
        tasks.spawn(cluster.exchange_rosters(cfg.heartbeat_timeout), name="rosters")
        listener.start()
        tasks.spawn(arena.keep_warm(), name="warm")
        if cfg.metrics_port is not None:
            # imported only here: prometheus_client costs a daemon without metrics a
            # twentieth of a second at start
            from hoplited.metrics import MetricsServer, registry_for
            self._metrics = MetricsServer(registry_for(status.local), cfg.host, cfg.metrics_port)
            await self._metrics.start()
        if cfg.join:
            await cluster.join(cfg.join)
        log.info("node %s serving on %s:%d and %s (capacity %d bytes); %s", self.node_id,
                 cfg.host, me.port, cfg.socket_path, self.arena.capacity, self._how_to_join())

    def ready_line(self) -> str:
        """The JSON line a launcher reads on stdout once the daemon serves."""
        me = self.membership.me
        ready = {"event": "ready", "node_id": self.node_id, "pid": os.getpid(),
                 "listen": f"{me.host}:{me.port}", "socket": me.socket}
        if self._metrics is not None:
            ready["metrics"] = f"{self.config.host}:{self._metrics.port}"
        if self.config.token_file is not None:
            ready["token_file"] = self.config.token_file
        ready["to_join"] = self._how_to_join()
        return json.dumps(ready)

    def _how_to_join(self) -> str:
        """How another daemon joins us: with a copy of our token file, or (insecure) none."""
        me, cfg = self.membership.me, self.config
        seed = f"[{me.host}]:{me.port}" if ":" in me.host else f"{me.host}:{me.port}"
        if cfg.token_file is None:
            return f"no token (--insecure): hoplited --insecure --join {seed}"
        return (f"copy {cfg.token_file} to the other host, then run hoplited --token-file "
                f"COPY --join {seed}")

    async def serve_forever(self) -> None:
        await self._stopped.wait()

    def request_stop(self) -> None:
        self._stopped.set()

    def run_again(self, winner: str, why: str) -> None:
        """Stop, to run again as a new member joining through ``winner`` first."""
        if self.rejoin is not None:
            return
        self.rejoin = rejoin_seeds(self.membership, winner)
        log.warning("%s: node %s stops, to join again as a new member through %s", why,
                    self.node_id, winner)
        self.request_stop()

    async def stop(self) -> None:
        """Close every server, link and connection; cancel what still runs."""
        if self._rpc is not None:
            self._rpc.stop_listening()
        if self._metrics is not None:
            await self._metrics.stop()
        if self._listener is not None:
            self._listener.stop()
        if self._links is not None:
            self._links.close_all()
        if self._rpc is not None:
            self._rpc.close_inbound()
        if self._connections is not None:
            self._connections.close()
        await self.tasks.cancel_all()
        log.info("node %s stopped", self.node_id)

