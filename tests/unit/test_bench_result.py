"""BenchResult's JSON record: ratios to the optimum and to S/RATE (the targets' yardstick, docs/design.md §7), and
the runs' quartiles."""

from __future__ import annotations

import pytest

from hoplited.tools.cli.bench import BenchResult

pytestmark = pytest.mark.unit

MiB = 1 << 20


@pytest.mark.parametrize("op, median, to_optimum, to_link", [
    ("broadcast", 0.2684, 1.0, 1.0),
    ("allreduce", 0.4415, 0.822, 1.645),  # the optimum counts the object twice
    ("allreduce", 0.2822, 0.526, 1.051),  # staggered inputs: after the last arrival
])
def test_ratios(op: str, median: float, to_optimum: float, to_link: float) -> None:
    result = BenchResult(op, 8, 32 * MiB, "local", rate_bps=1_000_000_000,
                         arrival_interval=0.1, runs=[median])
    record = result.as_dict()
    assert record["ratio_to_optimum"] == pytest.approx(to_optimum, abs=1e-3)
    assert record["ratio_to_s_over_rate"] == pytest.approx(to_link, abs=1e-3)


def test_no_ratios_on_loopback() -> None:
    record = BenchResult("reduce", 4, MiB, "local", runs=[0.01]).as_dict()
    assert record["ratio_to_optimum"] is None and record["ratio_to_s_over_rate"] is None


@pytest.mark.parametrize("runs, q1, q3", [
    ([0.3], 0.3, 0.3),  # one run: its own spread
    ([0.4, 0.2], 0.25, 0.35),
    ([0.5, 0.1, 0.3, 0.2, 0.4], 0.2, 0.4),
    ([0.35, 0.36, 0.37, 0.38, 0.39, 0.4, 0.41, 0.42, 0.55], 0.37, 0.41),  # one slow run
])
def test_quartiles_of_the_runs(runs: list[float], q1: float, q3: float) -> None:
    result = BenchResult("allreduce", 8, 32 * MiB, "local", rate_bps=1_000_000_000, runs=runs)
    assert result.quartiles == pytest.approx((q1, q3))
    assert result.as_dict()["quartiles_s"] == pytest.approx([q1, q3])
