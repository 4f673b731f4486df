"""The daemons' TCP connections to each other use the congestion control they are given:
cubic by default, whatever the system's, or ``--tcp-congestion NAME`` (docs/design.md §3,
"Congestion control"). Read from the kernel with ``ss``, on both ends of every connection."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Awaitable, Callable

import pytest
from helpers import allowed_congestion, eventually

from hoplited.tools.local_cluster import LocalCluster

pytestmark = pytest.mark.skipif(
    shutil.which("ss") is None or not {"cubic", "reno"} <= set(allowed_congestion()),
    reason="needs ss and Linux with cubic and reno allowed")
NAMES = ("cubic", "reno", "bbr", "dctcp", "vegas", "westwood", "htcp", "bic")


def congestion_of(ports: list[str]) -> list[str]:
    """The congestion control of every established TCP socket with one of ``ports`` at
    either end."""
    match = " or ".join(f"sport = :{p} or dport = :{p}" for p in ports)
    out = subprocess.run(["ss", "-Htin", "state", "established", f"( {match} )"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    found = []
    for line in out.splitlines():
        if line.startswith(("\t", " ")):  # the info line of the socket above
            words = set(re.findall(r"[a-z_]+", line))
            found.append(next((n for n in NAMES if n in words), "?"))
    return found


def system_default() -> str:
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        return f.read().strip()


@pytest.mark.parametrize("args, expected", [
    ([], "cubic"), (["--tcp-congestion", "reno"], "reno"),
    (["--tcp-congestion", ""], system_default())])
async def test_every_connection_between_daemons_uses_the_given_one(
        make_cluster: Callable[..., Awaitable[LocalCluster]], args: list[str],
        expected: str) -> None:
    cluster = await make_cluster(3, daemon_args=args)
    ports = [n.listen.rsplit(":", 1)[1] for n in cluster.nodes]

    async def connected() -> bool:  # control links and standing data connections, each way
        return len(congestion_of(ports)) >= 2 * 2 * 3

    await eventually(connected, what="the daemons' connections")
    assert set(congestion_of(ports)) == {expected}
