"""LinkModel: the least recent latency, the smoothed bandwidth, and the stall window derived
from them."""

from __future__ import annotations

import pytest

from hoplited.cluster.link_model import LATENCY_WINDOW, STALL_MIN, LinkModel

MiB = 1 << 20


@pytest.mark.parametrize("rate,cap,expected", [
    (125e6, 30.0, STALL_MIN),            # 1 Gbit/s: 8 slices take 0.54 s, below the floor
    (25e6, 30.0, 8 * 8 * MiB / 25e6),   # 200 Mbit/s: 2.7 s, several slices' worth
    (1e6, 30.0, 30.0),                   # a crawling link: the configured cap
    (5e9, 30.0, STALL_MIN),              # loopback: never below the floor
    (25e6, 0.5, 0.5),                    # a cap below the floor wins (the operator asked)
], ids=["1gbit", "200mbit", "slow-capped", "loopback-floor", "cap-below-floor"])
def test_stall_window(rate: float, cap: float, expected: float) -> None:
    model = LinkModel()
    model.observe_bandwidth(rate)
    assert model.stall_window(8 * MiB, cap) == pytest.approx(expected)


def test_bandwidth_smoothing_moves_a_fifth_of_the_way() -> None:
    model = LinkModel()
    model.observe_bandwidth(100.0)
    model.observe_bandwidth(200.0)
    assert model.bandwidth == pytest.approx(120.0)
    assert model.bandwidth_samples == 2


def test_latency_is_the_least_recent_half_round_trip() -> None:
    """Pings that waited behind data (or a busy loop) do not raise L; once the window has
    moved past the quick one, L follows the quickest of the rest."""
    model = LinkModel()
    model.observe_rtt(0.004)
    assert model.latency == pytest.approx(0.002)
    model.observe_rtt(0.0002)
    for _ in range(LATENCY_WINDOW - 1):  # busy: every ping waits
        model.observe_rtt(0.008)
    assert model.latency == pytest.approx(0.0001)
    model.observe_rtt(0.006)  # the quick ping leaves the window
    assert model.latency == pytest.approx(0.003)
    assert model.latency_samples == LATENCY_WINDOW + 2
