"""Prometheus metrics of one daemon, read from its status record at each scrape.

``hoplited --metrics-port P`` serves ``GET /metrics`` on this node's peer address. Nothing is
counted twice: a scrape turns :meth:`hoplited.status.NodeStatus.local` (the record that
``hoplite status`` shows) into metric families, on the event loop, so it reads the daemon's
state between two of its steps, never in the middle of one. The HTTP side is a small asyncio
server (HTTP/1.0, one request per connection, bounded request head, a timeout), because
prometheus_client's own server runs in a thread that would read that state concurrently.
What each metric means: docs/operations.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 5.0  # a scraper that sends nothing is dropped after this long
MAX_REQUEST_HEAD = 8192  # bytes: a request line and headers, no body
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# store.stats() key -> (metric name, help)
STORE_GAUGES = {
    "objects": ("hoplite_store_objects", "Objects in this node's store, complete or not."),
    "complete_objects": ("hoplite_store_complete_objects", "Complete objects in the store."),
    "stored_bytes": ("hoplite_store_object_bytes", "Bytes of the objects in the store."),
    "arena_used": ("hoplite_store_used_bytes", "Bytes of the arena in use (allocations)."),
    "capacity": ("hoplite_store_capacity_bytes", "The store's capacity in bytes."),
    "buffer_bytes": ("hoplite_store_buffer_bytes",
                     "Bytes of reduce and allreduce buffers (partial sums, copies in rings)."),
    "pinned_deleted": ("hoplite_store_pinned_deleted_objects",
                       "Deleted or evicted objects kept because a view or a send holds them."),
    "pinned_deleted_bytes": ("hoplite_store_pinned_deleted_bytes",
                             "Bytes of the deleted or evicted objects still held."),
    "waiting_for_space": ("hoplite_store_waiting_for_space",
                          "Allocations waiting for memory to be freed here."),
}
# store.stats() key -> (counter name, help): totals since the daemon started
STORE_COUNTERS = {
    "evictions": ("hoplite_store_evictions", "Copies evicted to make room (LRU)."),
    "evicted_bytes": ("hoplite_store_evicted_bytes", "Bytes of the copies evicted."),
}


def families(info: Mapping[str, Any]) -> list[Metric]:
    """The metric families of one status record (``NodeStatus.local()``)."""
    out: list[Metric] = []
    node = str(info.get("node_id", ""))
    traffic = CounterMetricFamily("hoplite_transfer_bytes",
                                  "Object bytes this node received or sent to peers.",
                                  labels=["node", "direction"])
    traffic.add_metric([node, "in"], float(info.get("bytes_in", 0)))
    traffic.add_metric([node, "out"], float(info.get("bytes_out", 0)))
    out.append(traffic)
    per_peer = CounterMetricFamily("hoplite_peer_transfer_bytes",
                                   "Object bytes this node received from or sent to each peer.",
                                   labels=["node", "peer", "direction"])
    for peer, moved in sorted(info.get("peers", {}).items()):
        for direction in ("in", "out"):
            per_peer.add_metric([node, str(peer), direction], float(moved.get(direction, 0)))
    out.append(per_peer)
    store = info.get("store", {})
    for key, (name, doc) in STORE_GAUGES.items():
        if key in store:
            gauge = GaugeMetricFamily(name, doc, labels=["node"])
            gauge.add_metric([node], float(store[key]))
            out.append(gauge)
    for key, (name, doc) in STORE_COUNTERS.items():
        if key in store:
            counter = CounterMetricFamily(name, doc, labels=["node"])
            counter.add_metric([node], float(store[key]))
            out.append(counter)
    members = GaugeMetricFamily("hoplite_members", "Members as this node sees them.",
                                labels=["node", "state"])
    listed = info.get("members", [])
    alive = sum(1 for m in listed if m.get("alive"))
    members.add_metric([node, "alive"], float(alive))
    members.add_metric([node, "dead"], float(len(listed) - alive))
    out.append(members)
    directory = info.get("directory", {})
    for key, doc in (("entries", "Object entries this node's directory shard owns."),
                     ("waiting_gets", "Gets waiting at this shard for an object to exist.")):
        if key in directory:
            gauge = GaugeMetricFamily(f"hoplite_directory_{key}", doc, labels=["node"])
            gauge.add_metric([node], float(directory[key]))
            out.append(gauge)
    families: tuple[tuple[str, type[GaugeMetricFamily | CounterMetricFamily], str], ...] = (
        ("clients", GaugeMetricFamily, "Clients connected to this daemon."),
        ("reduce_tasks", GaugeMetricFamily, "Reduce tasks (partial sums) running on this node."),
        ("watching", GaugeMetricFamily, "Members this daemon pings every heartbeat interval "
         "(docs/design.md §5, \"Watchers\")."),
        ("idle_data_connections", GaugeMetricFamily, "Data connections to other daemons kept "
         "idle for the next pull (docs/design.md §3)."),
        ("reduce_folds", CounterMetricFamily, "Lost reduce inputs folded into a slot on this "
         "node (docs/design.md §5)."),
        ("reduce_merges", CounterMetricFamily, "Reduce inputs that a reduce coordinated on "
         "this node added in the slot of another input on the same node (docs/design.md §4, "
         "\"Several inputs on one node\")."),
        ("late_inputs_held", CounterMetricFamily, "Late inputs that a trio's combiner on "
         "this node held until its own input was put (docs/design.md §4, \"Who pulls a late "
         "input first\")."),
        ("late_leaves_ahead", CounterMetricFamily, "Last inputs whose leaves a combiner on "
         "this node placed ahead on the node guessed to put them (docs/design.md §4, \"The "
         "last input's leaf placed ahead\")."),
        ("reduce_pulls_paused", CounterMetricFamily, "Reduce pulls on this node that waited "
         "behind another stripe's, whose combiner had put first (docs/design.md §4, \"The "
         "first combiner's chain goes first\")."),
        ("reduces_in_halves", CounterMetricFamily, "Reduces coordinated on this node as two "
         "trees of halves (docs/design.md §4)."),
        ("gets_in_halves", CounterMetricFamily, "Objects this node received as two halves, "
         "each from its parent in a tree of halves (docs/design.md §3)."),
        ("allreduces_as_ring", CounterMetricFamily, "Allreduces coordinated on this node "
         "that ran as a ring (docs/design.md §4, \"Ring allreduce\")."),
        ("rings_given_up", CounterMetricFamily, "Rings coordinated on this node that failed "
         "before any member held the result, so the allreduce ran again in stripes."),
        ("allreduces_as_pair", CounterMetricFamily, "Allreduces coordinated on this node "
         "whose last two inputs' nodes each reduced a half (docs/design.md §4, \"A pair for "
         "the last two inputs\")."),
        ("allreduces_as_trio", CounterMetricFamily, "Allreduces coordinated on this node "
         "whose last three inputs' nodes each reduced a third (docs/design.md §4, \"Three "
         "combiners\")."))
    for key, family, doc in families:
        if key in info:
            metric = family(f"hoplite_{key}", doc, labels=["node"])
            metric.add_metric([node], float(info[key]))
            out.append(metric)
    if "transfers" in info:
        gauge = GaugeMetricFamily("hoplite_transfers_in_flight",
                                  "Fetches of objects under way on this node.", labels=["node"])
        gauge.add_metric([node], float(len(info["transfers"])))
        out.append(gauge)
    errors = CounterMetricFamily("hoplite_errors", "Typed errors replied to clients and peers.",
                                 labels=["node", "type"])
    for kind, count in sorted(info.get("errors", {}).items()):
        errors.add_metric([node, str(kind)], float(count))
    out.append(errors)
    return out


class StatusCollector:
    """A prometheus_client collector over a status function (read at each scrape)."""

    def __init__(self, status: Callable[[], Mapping[str, Any]]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        yield from families(self._status())


def registry_for(status: Callable[[], Mapping[str, Any]]) -> CollectorRegistry:
    """A registry holding only this daemon's metrics (no process or GC collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(status))
    return registry


class MetricsServer:
    """``GET /metrics`` over HTTP/1.0 on ``host:port``: the registry's text exposition."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._registry = registry
        self._host, self._port = host, port
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        """The port bound (useful when asked for port 0)."""
        assert self._server is not None and self._server.sockets
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port,
                                                  limit=MAX_REQUEST_HEAD)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT):
                status, body = await self._answer(reader)
            writer.write(f"HTTP/1.0 {status}\r\nContent-Type: "
                         f"{CONTENT_TYPE if status.startswith('200') else 'text/plain'}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                         + body)
            async with asyncio.timeout(REQUEST_TIMEOUT):
                await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.LimitOverrunError,
                asyncio.IncompleteReadError, ValueError) as exc:
            log.debug("metrics request dropped: %s", type(exc).__name__)
        except Exception as exc:  # this task's owner: nothing may escape to asyncio
            log.warning("metrics request failed: %s: %s", type(exc).__name__, exc)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, TimeoutError):
                async with asyncio.timeout(REQUEST_TIMEOUT):
                    await writer.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[str, bytes]:
        """The status line and body for the request on ``reader`` (its head read whole)."""
        head = await reader.readuntil(b"\r\n\r\n")
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return "400 Bad Request", b"bad request\n"
        method, path = parts[0], parts[1].split(b"?", 1)[0]
        if method != b"GET":
            return "405 Method Not Allowed", b"only GET\n"
        if path != b"/metrics":
            return "404 Not Found", b"see /metrics\n"
        return "200 OK", generate_latest(self._registry)
