"""The eviction policy (hoplited/memory/eviction.py): tables of candidates and the choice."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from helpers import top_level_imports
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import hoplited.memory.eviction as eviction_module
from hoplite_client.wire.ids import ObjectID
from hoplited.memory.eviction import Candidate, choose, why_kept
from hoplited.metrics import registry_for

pytestmark = pytest.mark.unit

MiB = 1 << 20


def oid(n: int) -> ObjectID:
    return ObjectID(bytes([n]) * 20)


def c(n: int, last_use: int, size: int = MiB, **flags: bool) -> Candidate:
    return Candidate(oid=oid(n), size=size, last_use=last_use, **flags)


@dataclass(frozen=True)
class Case:
    id: str
    candidates: list[Candidate]
    needed: int
    chosen: list[int]  # the ``n`` of each chosen candidate, in the order to try


CASES = [
    Case("least recently used first, just enough bytes",
         [c(1, 30), c(2, 10), c(3, 20)], 2 * MiB, [2, 3]),
    Case("one byte short of two copies takes two",
         [c(1, 1), c(2, 2), c(3, 3)], MiB + 1, [1, 2]),
    Case("a big old copy covers the need alone",
         [c(1, 5, size=8 * MiB), c(2, 9)], 3 * MiB, [1]),
    Case("not enough evictable bytes: all of them, oldest first",
         [c(1, 3), c(2, 1)], 10 * MiB, [2, 1]),
    Case("nothing needed: nothing chosen", [c(1, 1)], 0, []),
    Case("nothing evictable: nothing chosen",
         [c(1, 1, pinned=True), c(2, 2, complete=False), c(3, 3, temporary=True),
          c(4, 4, producing=True), c(5, 5, evicting=True), c(6, 6, refused=True)],
         MiB, []),
    Case("kept copies are skipped, younger ones taken instead",
         [c(1, 1, pinned=True), c(2, 2, complete=False), c(3, 3), c(4, 4, refused=True),
          c(5, 5)], 2 * MiB, [3, 5]),
    Case("ties in last use are broken by id (a stable order)",
         [c(2, 7), c(1, 7)], MiB, [1]),
    Case("no candidates", [], MiB, []),
]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_choice(case: Case) -> None:
    assert choose(case.candidates, case.needed) == [oid(n) for n in case.chosen]


@pytest.mark.parametrize("flags, reason", [
    ({}, None),
    ({"pinned": True}, "pinned"),
    ({"complete": False}, "incomplete"),
    ({"temporary": True}, "a reduce's partial result"),
    ({"producing": True}, "being produced here"),
    ({"evicting": True}, "already being evicted"),
    ({"refused": True}, "refused by its shard"),
    ({"pinned": True, "complete": False}, "pinned"),  # the first reason wins
])
def test_why_a_copy_is_kept(flags: dict[str, bool], reason: str | None) -> None:
    assert why_kept(c(1, 1, **flags)) == reason


def test_pure_module_imports_no_io() -> None:
    assert not top_level_imports(eviction_module) & {"asyncio", "socket", "time", "logging", "random"}


def test_eviction_counters_are_metrics() -> None:
    """The store's eviction totals and its waiting allocations become samples."""
    record = {"node_id": "n1", "store": {"evictions": 3, "evicted_bytes": 3 * MiB,
                                         "waiting_for_space": 2}}
    text = generate_latest(registry_for(lambda: record)).decode()
    got = {s.name: s.value for fam in text_string_to_metric_families(text)
           for s in fam.samples if s.labels.get("node") == "n1"}
    assert got["hoplite_store_evictions_total"] == 3
    assert got["hoplite_store_evicted_bytes_total"] == 3 * MiB
    assert got["hoplite_store_waiting_for_space"] == 2
