"""``hoplite simulate``: a sweep of node counts as a table or JSON records."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from hoplited.sim.errors import SimulationError
from hoplited.sim.scenarios import simulate
from hoplited.tools.cli.main import main

pytestmark = pytest.mark.unit


def test_a_sweep_prints_one_json_record_per_node_count() -> None:
    out = CliRunner().invoke(main, ["simulate", "allreduce", "--nodes", "2,8", "--size",
                                    "8MiB", "--rate", "500Mbit", "--json"])
    assert out.exit_code == 0, out.output
    records = [json.loads(line) for line in out.output.splitlines()]
    assert [r["nodes"] for r in records] == [2, 8]
    for r in records:
        assert r["s_over_rate"] == pytest.approx(8 * 2**20 * 8 / 500e6)
        assert r["ratio"] == pytest.approx(r["seconds"] / r["s_over_rate"])
        assert r["optimum"] == pytest.approx(2 * r["s_over_rate"])  # tools/scenarios.optimum
        assert r["ratio_to_optimum"] == pytest.approx(r["ratio"] / 2)
        # a ring, as hoplited's allreduce takes at these sizes: no reduce tree
        assert (r["error"], r["depth"], r["ring"], r["fanout"], r["segment"]) == (
            None, None, True, 1, 65536)


def test_the_table_names_the_settings_and_each_run() -> None:
    out = CliRunner().invoke(main, ["simulate", "broadcast", "--nodes", "4", "--size", "1MiB",
                                    "--latency", "0.001"])
    assert out.exit_code == 0, out.output
    header, columns, row = out.output.splitlines()
    assert header.startswith("broadcast of 1048576 bytes") and "1 ms per hop" in header
    assert columns.split()[:3] == ["N", "simulated", "S/RATE"]
    assert row.split()[0] == "4"


def test_the_sharing_of_the_links_is_an_option_and_in_the_record() -> None:
    """A chain carries one pull per link: both ways of sharing give the same broadcast."""
    def record(sharing: str) -> dict[str, Any]:
        out = CliRunner().invoke(main, ["simulate", "broadcast", "--nodes", "8", "--size",
                                        "8MiB", "--sharing", sharing, "--json"])
        assert out.exit_code == 0, out.output
        return dict(json.loads(out.output))
    fair, max_min = record("fair"), record("maxmin")
    assert (fair["sharing"], max_min["sharing"]) == ("fair", "maxmin")
    assert max_min["seconds"] == pytest.approx(fair["seconds"])


def test_max_min_sharing_is_refused_for_more_nodes_than_it_can_recompute() -> None:
    out = CliRunner().invoke(main, ["simulate", "broadcast", "--nodes", "8,257", "--size",
                                    "1MiB", "--sharing", "maxmin"])
    assert out.exit_code == 2 and "at most 256 nodes" in out.output
    with pytest.raises(SimulationError, match="at most 256 nodes, not 257"):
        simulate("broadcast", 257, 1 << 20, 1e9, sharing="maxmin")


@pytest.mark.parametrize("args, message", [
    (["--sharing", "fifo"], "'fifo' is not one of"),
    (["--nodes", "8,x"], "not a node count"),
    (["--nodes", "1"], "at least 2"),
    (["--rate", "1MB"], "not a link rate"),
    (["--size", "lots"], "not a size"),
])
def test_bad_options_are_usage_errors(args: list[str], message: str) -> None:
    out = CliRunner().invoke(main, ["simulate", "broadcast", *args])
    assert out.exit_code == 2 and message in out.output


def test_two_trees_follow_the_daemons_rule_or_the_option() -> None:
    """The reduce takes two trees of halves where hoplited would (auto: not at N = 64 and
    32 MiB), always or never, and the table says which; ``always`` is refused for the
    collectives that have no such shape."""
    def ratio(*args: str) -> dict[str, Any]:
        out = CliRunner().invoke(main, ["simulate", "reduce", "--nodes", "64", "--size",
                                        "32MiB", *args, "--json"])
        assert out.exit_code == 0, out.output
        record: dict[str, Any] = json.loads(out.output)
        return record
    assert not ratio()["two_trees"] and not ratio("--two-trees", "never")["two_trees"]
    halves = ratio("--two-trees", "always")
    assert halves["two_trees"] and halves["ratio"] == pytest.approx(1.027, abs=1e-3)
    table = CliRunner().invoke(main, ["simulate", "reduce", "--nodes", "8", "--two-trees",
                                      "always"])
    assert table.exit_code == 0 and "two trees of halves: always" in table.output
    assert table.output.splitlines()[-1].split()[-4] == "halves"
    refused = CliRunner().invoke(main, ["simulate", "allreduce", "--two-trees", "always"])
    assert refused.exit_code == 2 and "a shape of the reduce and the broadcast" in refused.output


def test_staggered_inputs_are_named_in_the_header() -> None:
    out = CliRunner().invoke(main, ["simulate", "allreduce", "--nodes", "4", "--size", "8MiB",
                                    "--arrival-interval", "0.05"])
    assert out.exit_code == 0, out.output
    assert "inputs 0.05 s apart (latency from the last put)" in out.output.splitlines()[0]


@pytest.mark.parametrize("args", [["broadcast", "--arrival-interval", "0.1"],
                                  ["reduce", "--arrival-interval", "nan"],
                                  ["reduce", "--arrival-interval", "-1"]])
def test_a_bad_arrival_interval_is_a_usage_error(args: list[str]) -> None:
    out = CliRunner().invoke(main, ["simulate", *args])
    assert out.exit_code == 2 and "--arrival-interval" in out.output


def test_a_pair_is_the_allreduce_s_and_named_in_the_table() -> None:
    out = CliRunner().invoke(main, ["simulate", "allreduce", "--nodes", "8", "--size", "32MiB",
                                    "--rate", "1Gbit", "--arrival-interval", "0.2", "--pair"])
    assert out.exit_code == 0, out.output
    assert "pair" in out.output.splitlines()[-1].split()
    plain = CliRunner().invoke(main, ["simulate", "allreduce", "--nodes", "8", "--size",
                                      "32MiB", "--rate", "1Gbit", "--arrival-interval", "0.2",
                                      "--no-pair"])
    assert plain.exit_code == 0 and "pair" not in plain.output.splitlines()[-1].split()
