"""A real daemon's Prometheus endpoint and JSON logs (docs/operations.md)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

import hoplite_client as hc
from hoplited.tools.local_cluster import LocalCluster


@pytest.fixture
async def cluster() -> AsyncIterator[LocalCluster]:
    async with LocalCluster(2, capacity="256MiB",
                            daemon_args=["--metrics-port", "0", "--log-format", "json"]) as c:
        yield c


async def http(address: str, request: bytes, timeout: float = 30.0) -> bytes:
    """Send ``request`` raw to ``address`` and read the whole answer (the server closes)."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


async def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    answer = await http(address, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.0 200")
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "node"))): s.value
            for fam in text_string_to_metric_families(body.decode()) for s in fam.samples}


async def test_metrics_follow_what_the_daemon_does(cluster: LocalCluster) -> None:
    a, b = cluster.nodes
    assert a.metrics and b.metrics
    before = await scrape(b.metrics)
    async with await hc.connect(a.socket) as ca, await hc.connect(b.socket) as cb:
        data = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: a real transfer, not inline
        oid = await ca.put(data)
        assert np.array_equal(await cb.get(oid, timeout=60), data)
        with pytest.raises(hc.HopliteTimeoutError):
            await cb.get(hc.ObjectID.random(), timeout=0.2)
        after = await scrape(b.metrics)
        assert after[("hoplite_clients", ())] == 1
    received = after[("hoplite_transfer_bytes_total", (("direction", "in"),))]
    assert received - before[("hoplite_transfer_bytes_total", (("direction", "in"),))] \
        >= data.nbytes
    from_a = (("direction", "in"), ("peer", a.node_id))
    assert after[("hoplite_peer_transfer_bytes_total", from_a)] \
        - before.get(("hoplite_peer_transfer_bytes_total", from_a), 0) >= data.nbytes
    assert after[("hoplite_store_complete_objects", ())] == 1
    assert after[("hoplite_members", (("state", "alive"),))] == 2
    assert after[("hoplite_errors_total", (("type", "HopliteTimeoutError"),))] >= 1


@pytest.mark.parametrize("request_bytes, status", [
    (b"POST /metrics HTTP/1.0\r\n\r\n", b"405"),
    (b"GET /other HTTP/1.0\r\n\r\n", b"404"),
    (b"nonsense\r\n\r\n", b"400"),
])
async def test_bad_requests_get_an_http_error(cluster: LocalCluster, request_bytes: bytes,
                                              status: bytes) -> None:
    answer = await http(cluster.nodes[0].metrics, request_bytes)
    assert answer.split(b"\r\n", 1)[0].split()[1] == status


async def test_hostile_scrapers_are_dropped_and_the_daemon_serves_on(
        cluster: LocalCluster) -> None:
    """A head past the size limit and a connection that sends nothing are closed without an
    answer; the endpoint and the daemon go on serving."""
    address = cluster.nodes[0].metrics
    assert await http(address, b"GET /" + b"x" * 20000) == b""
    assert await http(address, b"", timeout=60) == b""  # closed after the request timeout
    assert ("hoplite_clients", ()) in await scrape(address)
    async with await hc.connect(cluster.nodes[0].socket) as client:
        oid = await client.put(np.ones(10))
        assert np.array_equal(await client.get(oid), np.ones(10))


async def test_json_logs_are_one_object_per_line(cluster: LocalCluster) -> None:
    async with await hc.connect(cluster.nodes[0].socket) as client:
        await client.put(np.ones(10))
    with open(cluster.nodes[0].log_path) as f:
        lines = [line for line in f if line.strip()]
    assert lines
    for line in lines:
        entry = json.loads(line)
        assert {"time", "level", "logger", "message", "pid"} <= set(entry)
