"""Which side of a disagreement runs again, and when the dead are probed: tables for the pure
core ``hoplited/cluster/partitions.py`` (docs/design.md §5, "Partitions heal")."""

from __future__ import annotations

import pytest
from helpers import top_level_imports

import hoplited.cluster.partitions as partitions_module
from hoplited.cluster.partitions import DeadProbes, parse_alive, plausible, refused_yields

ALL = ["a", "b", "c", "d", "e"]

SIDES = [
    # (case, the refuser's live set, the refused member's live set, the refused yields)
    ("a member frozen past the timeout still counts everyone: it yields",
     ["a", "b", "c", "d"], ALL, True),
    ("a lone member cut off, healed before the majority's verdict: the majority stays",
     ["e"], ALL, False),
    ("the same lone member, refused by the majority: it yields",
     ["a", "b", "c", "d"], ["e"], True),
    ("the majority, refused by the lone member after both verdicts: it stays",
     ["e"], ["a", "b", "c", "d"], False),
    ("two against three: the two yield", ["c", "d", "e"], ["a", "b"], True),
    ("three against two: the three stay", ["a", "b"], ["c", "d", "e"], False),
    ("two against two: the side with the smallest id stays (refuser has it)",
     ["a", "d"], ["b", "c"], True),
    ("two against two: the side with the smallest id stays (refused has it)",
     ["b", "c"], ["a", "d"], False),
    ("views that still overlap: only what the refuser does not count is our side",
     ["a", "b", "c"], ["b", "c", "d", "e"], True),
    ("a refused member whose view lacks itself: it yields (a malformed view)",
     ["a", "b"], ["a", "b"], True),
]


@pytest.mark.parametrize(("case", "refuser", "refused", "yields"), SIDES,
                         ids=[c[0] for c in SIDES])
def test_which_side_runs_again(case: str, refuser: list[str], refused: list[str],
                               yields: bool) -> None:
    assert refused_yields(refuser, refused) is yields


@pytest.mark.parametrize(("refuser", "refused"), [(["c", "d", "e"], ["a", "b"]),
                                                  (["a", "d"], ["b", "c"]),
                                                  (["e"], ["a", "b", "c", "d"])])
def test_after_a_partition_exactly_one_side_yields(refuser: list[str],
                                                   refused: list[str]) -> None:
    """Both sides declared each other dead: each decides as the refused one on the other's
    refusal, and exactly one of them yields."""
    assert refused_yields(refuser, refused) != refused_yields(refused, refuser)


@pytest.mark.parametrize(("refuser", "alive", "refused", "ok"), [
    ("a", ["a", "b"], "c", True),
    ("a", ["b", "c"], "d", False),  # it does not count itself
    ("a", ["a", "c"], "c", False),  # it counts alive the member it declared dead
    ("a", [], "c", False),  # an empty (or unparsable) live set
])
def test_only_a_plausible_refusal_decides(refuser: str, alive: list[str], refused: str,
                                          ok: bool) -> None:
    assert plausible(refuser, alive, refused) is ok


def test_parse_alive() -> None:
    assert parse_alive("a,b,c") == ["a", "b", "c"]
    assert parse_alive("") == []
    assert parse_alive(",a,,b,") == ["a", "b"]


# --- DeadProbes: (event, argument, time) steps and what is due after each ---
PROBES = [
    ("a member declared dead is probed `first` later, then at doubling intervals", [
        ("died", "x", 0.0, []),
        ("due", None, 1.0, []),
        ("due", None, 4.0, ["x"]),
        ("due", None, 5.0, []),  # under way: not due twice
        ("silent", "x", 6.0, []),
        ("due", None, 13.0, []),
        ("due", None, 14.0, ["x"]),  # 6 + 8
        ("answered", "x", 14.0, []),
        ("due", None, 30.0, ["x"]),  # 14 + 16
    ], 4.0, 60.0),
    ("the interval stops growing at `longest`", [
        ("died", "x", 0.0, []),
        ("due", None, 4.0, ["x"]),
        ("silent", "x", 4.0, []),  # next at 4 + 5 (8 capped to 5)
        ("due", None, 9.0, ["x"]),
        ("silent", "x", 9.0, []),
        ("due", None, 14.0, ["x"]),
    ], 4.0, 5.0),
    ("a gone member (refused, or another id at its address) is never probed again", [
        ("died", "x", 0.0, []),
        ("died", "y", 1.0, []),
        ("due", None, 5.0, ["x", "y"]),
        ("gone", "x", 5.0, []),
        ("silent", "y", 5.0, []),
        ("due", None, 100.0, ["y"]),
    ], 4.0, 60.0),
    ("a second verdict on the same member changes nothing; an unknown outcome is ignored", [
        ("died", "x", 0.0, []),
        ("died", "x", 3.0, []),
        ("gone", "zz", 3.0, []),
        ("due", None, 4.0, ["x"]),
    ], 4.0, 60.0),
]


@pytest.mark.parametrize(("case", "steps", "first", "longest"), PROBES,
                         ids=[c[0] for c in PROBES])
def test_dead_probes(case: str, steps: list[tuple[str, str | None, float, list[str]]],
                     first: float, longest: float) -> None:
    probes = DeadProbes(first, longest)
    for event, node, now, due in steps:
        if event == "died":
            assert node is not None
            probes.died(node, now)
        elif event == "due":
            assert probes.due(now) == due
            continue
        else:
            assert node is not None
            probes.outcome(node, event, now)  # type: ignore[arg-type]
        assert due == []


def test_dead_probes_forget_the_longest_dead_beyond_most_and_wake_at_the_earliest() -> None:
    probes = DeadProbes(4.0, 60.0, most=2)
    assert probes.wake() is None
    probes.died("x", 0.0)
    probes.died("y", 1.0)
    probes.died("z", 2.0)
    assert "x" not in probes and len(probes) == 2
    assert probes.wake() == 5.0
    assert probes.due(5.0) == ["y"]
    assert probes.wake() == 6.0  # y is under way
    probes.forget("z")
    assert probes.wake() is None


def test_pure_module_imports_no_io() -> None:
    assert top_level_imports(partitions_module) <= {"__future__", "collections", "dataclasses",
                                                    "typing"}
