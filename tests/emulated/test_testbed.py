"""The emulated test bed: namespaces, shaped links, daemons inside, cleanup in every case.

Tests that build namespaces need root and iproute2; they are skipped (with the reason) without.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import hoplite_client
from bench.baselines.star import run_star
from hoplited.tools.testbed import (
    STATE_DIR,
    Testbed,
    TestbedError,
    TestbedPermissionError,
    cleanup_leftovers,
    emulated_cluster,
    netns_list,
    parse_rate,
    tbf_params,
)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None,
    reason="the emulated test bed needs root and iproute2 (ip, tc)")

MBIT = 1_000_000
SUBPROCESS_TIMEOUT = 60.0


def ours(prefix: str) -> set[str]:
    return {ns for ns in netns_list() if ns.startswith(prefix)}


def sh(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30).stdout


def assert_gone(prefix: str) -> None:
    assert not ours(prefix), f"namespaces left: {ours(prefix)}"
    assert not os.path.exists(os.path.join(STATE_DIR, f"{prefix}.json"))


# A peer in every host: listen on its own address, then connect to every other host and
# exchange one byte each way; prints "ok" when every peer was reached and reached it.
MESH = """
import socket, sys, threading, time
me, others = sys.argv[1], sys.argv[2:]
srv = socket.create_server((me, 5555))
def serve():
    for _ in others:
        c, _ = srv.accept(); c.sendall(c.recv(1)); c.close()
t = threading.Thread(target=serve); t.start()
for peer in others:
    for attempt in range(200):
        try:
            c = socket.create_connection((peer, 5555), timeout=5); break
        except ConnectionRefusedError:
            time.sleep(0.05)
    c.sendall(b"x"); assert c.recv(1) == b"x"; c.close()
t.join(); print("ok")
"""


def test_parse_rate() -> None:
    assert parse_rate("1Gbit") == 10**9
    assert parse_rate("500Mbit") == 500 * MBIT
    assert parse_rate("2gbit") == 2 * 10**9
    assert parse_rate("1.5G") == 1_500_000_000
    assert parse_rate("100000") == 100_000
    for bad in ("1GBps", "fast", "0mbit", "1MB", ""):
        with pytest.raises(ValueError):
            parse_rate(bad)


def test_tbf_sizing_fits_the_link() -> None:
    burst, limit = tbf_params(10**9, 65000)
    assert burst >= 2 * 65000 and limit > burst
    assert burst == 250_000  # 2 ms of 1 Gbit/s
    burst, _ = tbf_params(10 * MBIT, 1500)
    assert burst >= 64 * 1024  # at least one GSO packet


async def test_without_root_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(TestbedPermissionError, match="root"):
        async with Testbed(2, 100 * MBIT):
            pass
    assert issubclass(TestbedPermissionError, TestbedError)


@needs_root
async def test_three_hosts_reach_each_other_at_the_rate() -> None:
    rate = 200 * MBIT
    async with Testbed(3, rate) as tb:
        prefix = tb.prefix
        assert ours(prefix) == {f"{prefix}h0", f"{prefix}h1", f"{prefix}h2", f"{prefix}br"}
        assert [h.ip for h in tb.hosts] == ["198.18.0.1", "198.18.0.2", "198.18.0.3"]
        for h in tb.hosts:  # one connected route, no way out; shaped both ways
            assert sh("ip", "-n", h.netns, "route", "show", "default") == ""
            assert sh("ip", "-n", h.netns, "-4", "route").split()[0] == "198.18.0.0/15"
            assert "tbf" in sh("tc", "-n", h.netns, "qdisc", "show", "dev", h.ifname)
            assert "tbf" in sh("tc", "-n", tb.bridge_netns, "qdisc", "show", "dev", h.bridge_port)
            assert "mtu 65000" in sh("ip", "-n", h.netns, "link", "show", h.ifname)
        bridge_addrs = json.loads(sh("ip", "-n", tb.bridge_netns, "-j", "addr"))
        assert [a for link in bridge_addrs for a in link["addr_info"]
                if a.get("scope") != "host"] == []  # the bridge is no host, no router
        peers = [await asyncio.create_subprocess_exec(
            *tb.exec_prefix(h.index), sys.executable, "-c", MESH, h.ip,
            *(o.ip for o in tb.hosts if o is not h), stdout=asyncio.subprocess.PIPE)
            for h in tb.hosts]
        outs = [await asyncio.wait_for(p.communicate(), SUBPROCESS_TIMEOUT) for p in peers]
        assert [o[0].strip() for o in outs] == [b"ok"] * 3
        results = await tb.check_links(seconds=1.5)
        assert sorted((r.src, r.dst) for r in results) == [(0, 1), (1, 2), (2, 0)]
        for r in results:
            assert 0.5 * rate <= r.bps <= 1.3 * rate, r
    assert_gone(prefix)


class BrokenTestbed(Testbed):
    def _host_batch(self, host: object) -> str:
        return "link set no-such-device up\n"


@needs_root
async def test_a_failed_build_removes_what_it_made() -> None:
    tb = BrokenTestbed(2, 100 * MBIT)
    with pytest.raises(TestbedError, match="no-such-device"):
        async with tb:
            pass
    assert tb.prefix and not ours(tb.prefix)
    assert_gone(tb.prefix)


@needs_root
def test_leftovers_of_a_dead_run_are_removed() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()  # its PID names no process now (and the start time would not match anyway)
    prefix = "hpl-dead00-"
    names = [f"{prefix}h0", f"{prefix}br"]
    foreign = "hplx-not-ours"  # recorded by mistake, but not named like ours: untouched
    os.makedirs(STATE_DIR, exist_ok=True)
    sleeper = None
    try:
        for ns in names + [foreign]:
            sh("ip", "netns", "add", ns)
        sleeper = subprocess.Popen(["ip", "netns", "exec", names[0], "sleep", "60"])
        with open(os.path.join(STATE_DIR, f"{prefix}.json"), "w") as f:
            json.dump({"prefix": prefix, "pid": dead.pid, "pid_start_time": 1,
                       "namespaces": names + [foreign]}, f)
        live = os.path.join(STATE_DIR, "hpl-live00-.json")  # a run still going: kept
        with open(live, "w") as f:
            json.dump({"prefix": "hpl-live00-", "pid": os.getpid(),
                       "pid_start_time": _start_time(os.getpid()),
                       "namespaces": ["hpl-live00-h0"]}, f)
        for _ in range(100):  # the sleeper must be inside before the cleanup looks
            if sh("ip", "netns", "pids", names[0]).strip():
                break
            time.sleep(0.02)
        removed = cleanup_leftovers()
        assert prefix in removed and "hpl-live00-" not in removed
        assert_gone(prefix)
        assert foreign in netns_list() and os.path.exists(live)
        assert sleeper.wait(timeout=10) != 0  # the process left inside was stopped
    finally:
        if sleeper is not None and sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
        for ns in names + [foreign]:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        for name in (f"{prefix}.json", "hpl-live00-.json"):
            if os.path.exists(os.path.join(STATE_DIR, name)):
                os.unlink(os.path.join(STATE_DIR, name))


def _start_time(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


HOLD = """
import asyncio, sys
from hoplited.tools.testbed import Testbed
async def main():
    async with Testbed(2, 100_000_000) as tb:
        print(tb.prefix, flush=True)
        await asyncio.sleep(60)
asyncio.run(main())
"""


@needs_root
async def test_sigterm_removes_the_test_bed() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLD, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert proc.stdout is not None
        prefix = (await asyncio.wait_for(proc.stdout.readline(), SUBPROCESS_TIMEOUT)).decode()
        prefix = prefix.strip()
        assert prefix.startswith("hpl-") and len(ours(prefix)) == 3
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), SUBPROCESS_TIMEOUT)
        assert proc.returncode == 143, err.decode()
        assert_gone(prefix)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@needs_root
async def test_emulated_cluster_broadcasts_bit_exact() -> None:
    async with emulated_cluster(3, 500 * MBIT, capacity="256MiB", log_level="warning") as c:
        prefix = c.testbed.prefix
        pids = [n.pid for n in c.nodes]
        assert [n.listen.split(":")[0] for n in c.nodes] == [h.ip for h in c.testbed.hosts]
        for n in c.nodes:  # the PID we hold is the daemon itself, inside its namespace
            assert str(n.pid) in sh("ip", "netns", "pids", c.testbed.hosts[n.index].netns).split()
        data = np.random.default_rng(1).random(1 << 20, dtype=np.float32)  # 4 MiB
        clients = [await hoplite_client.connect(s) for s in c.sockets]
        try:
            oid = await clients[0].put(data)
            got = await asyncio.gather(*(cl.get(oid, timeout=60) for cl in clients[1:]))
            for arr in got:
                assert arr.dtype == data.dtype and arr.shape == data.shape
                assert arr.tobytes() == data.tobytes()
            del got, arr
        finally:
            for cl in clients:
                await cl.close()
    assert_gone(prefix)
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]


@needs_root
async def test_star_baseline_runs_in_the_test_bed() -> None:
    rate, size = 500 * MBIT, 4 << 20
    async with Testbed(3, rate) as tb:
        latencies = await run_star(tb, size, repeat=2, warmup=1)
    assert len(latencies) == 2
    two_copies = 2 * size * 8 / rate  # the root's uplink carries one copy per receiver
    for t in latencies:
        assert 0.7 * two_copies < t < 20 * two_copies, latencies
    assert_gone(tb.prefix)


@needs_root
async def test_cli_up_persists_and_down_removes() -> None:
    cli = [sys.executable, "-m", "hoplited.tools.cli.main", "testbed"]
    up = await asyncio.create_subprocess_exec(*cli, "up", "2", "100Mbit", "--mtu", "9000",
                                              stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(up.communicate(), SUBPROCESS_TIMEOUT)
    text = out.decode()
    assert up.returncode == 0, text
    prefix = text.split("test bed ", 1)[1].split(":", 1)[0]
    try:
        assert len(ours(prefix)) == 3 and "198.18.0.2" in text and "ip netns exec" in text
        assert "mtu 9000" in sh("ip", "-n", f"{prefix}h1", "link", "show", f"{prefix}v1")
        assert prefix not in cleanup_leftovers()  # its creator exited, but on purpose
    finally:
        down = await asyncio.create_subprocess_exec(*cli, "down", prefix,
                                                    stdout=asyncio.subprocess.PIPE)
        out, _ = await asyncio.wait_for(down.communicate(), SUBPROCESS_TIMEOUT)
    assert down.returncode == 0 and f"removed {prefix}" in out.decode()
    assert_gone(prefix)


@needs_root
def test_make_demo_compares_hoplite_with_the_star() -> None:
    """``make demo``'s script, small: both systems run in one test bed and it says which is
    faster (it broke once when bench.compare's cases grew an arrival interval)."""
    done = subprocess.run([sys.executable, "-m", "bench.demo", "--nodes", "3", "--size", "4MiB",
                           "--rate", "500Mbit", "--repeat", "1"], capture_output=True, text=True,
                          timeout=180, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "naive star" in done.stdout and "than the star" in done.stdout


@needs_root
def test_link_trace_reads_every_daemons_counters(tmp_path: Path) -> None:
    """bench/link_trace.py, small: its sampler reads each daemon's own namespace, so what the
    nodes sent adds up to what they received, less what TCP sent again (a link's queue may
    drop a few segments), and every node received the result."""
    out = tmp_path / "trace.json"
    done = subprocess.run([sys.executable, "-m", "bench.link_trace", "allreduce", "--nodes", "3",
                           "--size", "4MiB", "--rate", "500Mbit", "--arrival-interval", "0.05",
                           "--repeat", "2", "--json", str(out)], capture_output=True, text=True,
                          timeout=180, cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.abspath(__file__)))))
    assert done.returncode == 0, done.stdout + done.stderr
    traces = json.loads(out.read_text())
    assert len(traces) == 2 and "sent at the last put" in done.stdout
    for t in traces:
        sent, received = sum(t["tx_total"]), sum(t["rx_total"])
        assert received * 0.95 <= sent <= received * 1.05 + sum(t["resent_total"]), t
        assert all(rx >= 0.95 for rx in t["rx_total"])  # the result, at least, came in
