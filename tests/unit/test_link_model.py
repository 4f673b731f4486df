"""LinkModel: the least recent latency, the largest recent bandwidth, and the stall window
derived from them; PullRate: what one pull says about its link."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hoplited.cluster.link_model import (
    BANDWIDTH_WINDOW,
    LATENCY_WINDOW,
    MIN_CHUNKS,
    STALL_MIN,
    LinkModel,
    PullRate,
)

MiB = 1 << 20
KiB = 1 << 10
LINK = 125e6  # 1 Gbit/s
SEGMENT = 64 * KiB


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


def test_bandwidth_is_the_largest_recent_sample() -> None:
    """A pull sharing its links measures its share; B stays the link's until the samples
    that saw the link have left the window."""
    model = LinkModel()
    model.observe_bandwidth(100.0)
    model.observe_bandwidth(50.0)
    assert model.bandwidth == 100.0
    for _ in range(BANDWIDTH_WINDOW - 1):
        model.observe_bandwidth(40.0)
    assert model.bandwidth == 50.0  # the 100 has left the window
    model.observe_bandwidth(40.0)
    assert model.bandwidth == 40.0
    assert model.bandwidth_samples == BANDWIDTH_WINDOW + 2


def _steady(meter: PullRate, t: float, received: int, size: int, rate: float,
            chunk: int = SEGMENT) -> tuple[float, int]:
    """``size`` bytes coming in ``chunk``-byte reads at ``rate``; the time and total after."""
    for _ in range(size // chunk):
        t, received = t + chunk / rate, received + chunk
        meter.chunk(t, received)
    return t, received


def _flowing(meter: PullRate) -> None:
    _steady(meter, 0.0, 0, 8 * MiB, LINK)


def _first_byte_late(meter: PullRate) -> None:
    """A get of a result that exists only half a second after the Pull."""
    _steady(meter, 0.5, 0, 8 * MiB, LINK)


def _producer_pauses(meter: PullRate) -> None:
    """A partial sum made block by block as inputs come: each block at the link's rate,
    then 80 ms of nothing (the whole pull's bytes over its time: 1/4 of the link)."""
    t, got = 0.0, 0
    for _ in range(8):
        t, got = _steady(meter, t + 0.08, got, MiB, LINK)


def _loop_was_busy(meter: PullRate) -> None:
    """The event loop was busy for 30 ms: one read then takes what came meanwhile."""
    t, got = _steady(meter, 0.0, 0, 4 * MiB, LINK)
    t, got = t + 0.03, got + int(0.03 * LINK)
    meter.chunk(t, got)
    _steady(meter, t, got, 4 * MiB, LINK)


def _reads_at_one_instant(meter: PullRate) -> None:
    """Two reads the clock cannot tell apart: one chunk of no measurable gap."""
    t, got = _steady(meter, 0.0, 0, 4 * MiB, LINK)
    meter.chunk(t, got + SEGMENT)
    _steady(meter, t, got + SEGMENT, 4 * MiB, LINK)


def _shared(meter: PullRate) -> None:
    """Two pulls share the downlink: each gets half."""
    _steady(meter, 0.0, 0, 8 * MiB, LINK / 2)


@pytest.mark.parametrize("feed,expected", [
    (_flowing, LINK),
    (_first_byte_late, LINK),
    (_producer_pauses, LINK),
    (_loop_was_busy, LINK),
    (_reads_at_one_instant, LINK),
    (_shared, LINK / 2),
], ids=["flowing", "first-byte-late", "producer-pauses", "loop-was-busy",
        "reads-at-one-instant", "shared"])
def test_a_pull_measures_its_rate_while_bytes_flow(feed: Callable[[PullRate], None],
                                                   expected: float) -> None:
    meter = PullRate(0.0)
    feed(meter)
    assert meter.rate(MiB) == pytest.approx(expected, rel=0.05)


@pytest.mark.parametrize("chunks,chunk,least", [
    (MIN_CHUNKS - 1, MiB, MiB),   # big reads, too few to trust
    (MIN_CHUNKS * 2, SEGMENT, 2 * MiB),  # too few bytes
], ids=["few-chunks", "few-bytes"])
def test_a_pull_too_short_says_nothing(chunks: int, chunk: int, least: int) -> None:
    meter = PullRate(0.0)
    _steady(meter, 0.0, 0, chunks * chunk, LINK, chunk)
    assert meter.rate(least) is None


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
