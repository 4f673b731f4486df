"""bench/link_trace.py's pure parts: reading a daemon's counters and summing up a run."""

from __future__ import annotations

import pytest

from bench.link_trace import Sample, _counters, _resent, summarise
from hoplited.tools.testbed import DEFAULT_MTU

S = 1_000_000
RATE = 80_000_000  # bit/s: S crosses a link in 0.1 s

NET_DEV = b"""Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
hpl-0563d3-v1: 253230381    5930    0    0    0     0          0         0 252047676    5873    0    0    0     0       0          0
"""


def test_counters_read_the_test_beds_interface_not_loopback() -> None:
    assert _counters(NET_DEV) == (253230381, 252047676)
    with pytest.raises(RuntimeError):
        _counters(NET_DEV.replace(b"hpl-", b"eth0"))


SNMP = b"""Ip: Forwarding DefaultTTL
Ip: 1 64
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors
Tcp: 1 200 120000 -1 31403 29116 2101 2758 0 4150636 4138519 6233 0 4427 0
Udp: InDatagrams NoPorts
Udp: 5 0
"""


def test_resent_reads_the_tcp_line() -> None:
    assert _resent(SNMP) == 6233


def samples() -> list[Sample]:
    """Node 0 sends S/2 before the last put (t = 1.0) and S after it; node 1 receives it all."""
    out = []
    for k in range(0, 300):
        t = 0.5 + k * 0.005
        sent = 0 if t < 0.9 else min(int((t - 0.9) * 5 * S), S // 2) if t < 1.0 else (
            S // 2 + min(int((t - 1.0) * 8 * S), S))
        out.append(Sample(t, (0, sent), (sent, 0), (int(t > 1.05), 0)))
    return out


def test_a_run_is_summed_up_around_its_last_put() -> None:
    trace = summarise(samples(), [0.8, 1.0], 0.125, S, RATE)
    assert trace.puts == (0.0, pytest.approx(0.2))
    assert trace.tx_at_last == (pytest.approx(0.5, abs=0.03), 0.0)
    assert trace.rx_at_last == (0.0, pytest.approx(0.5, abs=0.03))
    assert trace.tx_total == (pytest.approx(1.5, abs=0.01), 0.0)
    assert trace.rx_total == (0.0, pytest.approx(1.5, abs=0.01))
    # S in 0.125 s on a link that carries S in 0.1 s: 80% of its rate
    assert trace.uplink_use == (pytest.approx(0.8, abs=0.03), 0.0)
    # one segment of the default MTU's sent again by node 0
    assert trace.resent_total == (pytest.approx((DEFAULT_MTU - 40) / S), 0.0)
