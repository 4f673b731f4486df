"""decide, the Dask plugin's pure core: which registered host seeds the cluster, whom a later
host joins, and which registrations no longer count."""

from __future__ import annotations

import pytest
from helpers import top_level_imports

import hoplite_client.dask.rendezvous as rendezvous_module
from hoplite_client.dask.rendezvous import (
    STARTING,
    STOPPED,
    Decision,
    Join,
    Seed,
    Wait,
    decide,
    entry_key,
    host_of,
)

pytestmark = pytest.mark.unit

A1, A2 = entry_key("10.0.0.1", "x1"), entry_key("10.0.0.1", "x2")
B1, B2 = entry_key("10.0.0.2", "y1"), entry_key("10.0.0.2", "y2")
C1 = entry_key("10.0.0.3", "z1")
ALL = {"10.0.0.1", "10.0.0.2", "10.0.0.3"}


@pytest.mark.parametrize("entries,mine,live,expected", [
    # the first to register seeds, whatever registered after it
    ([(A1, STARTING)], A1, ALL, Seed()),
    ([(A1, STARTING), (B1, STARTING)], A1, ALL, Seed()),
    # a later host waits for the earlier one's address, then joins it
    ([(A1, STARTING), (B1, STARTING)], B1, ALL, Wait()),
    ([(A1, "10.0.0.1:7000"), (B1, STARTING)], B1, ALL, Join(("10.0.0.1:7000",))),
    # it joins every earlier host listening, the earliest first, even if one still starts
    ([(A1, "10.0.0.1:7000"), (B1, STARTING), (C1, STARTING)], C1, ALL,
     Join(("10.0.0.1:7000",))),
    ([(A1, "10.0.0.1:7000"), (B1, "10.0.0.2:7000"), (C1, STARTING)], C1, ALL,
     Join(("10.0.0.1:7000", "10.0.0.2:7000"))),
    # a stopped daemon's entry, or one of a host with no live worker, does not count
    ([(A1, STOPPED), (B1, STARTING)], B1, ALL, Seed()),
    ([(A1, "10.0.0.1:7000"), (B1, STARTING)], B1, {"10.0.0.2"}, Seed()),
    ([(A1, "10.0.0.1:7000"), (B1, "10.0.0.2:7000"), (C1, STARTING)], C1,
     {"10.0.0.2", "10.0.0.3"}, Join(("10.0.0.2:7000",))),
    # a host that registers again supersedes its old entry: others no longer join that one
    ([(A1, "10.0.0.1:7000"), (B1, "10.0.0.2:7000"), (A2, STARTING)], A2, ALL,
     Join(("10.0.0.2:7000",))),
    ([(A1, "10.0.0.1:7000"), (B1, STARTING), (A2, STARTING)], B1, ALL, Seed()),
    ([(B1, "10.0.0.2:7000"), (A1, "10.0.0.1:7000"), (B2, STARTING)], B2, ALL,
     Join(("10.0.0.1:7000",))),
    # a whole cluster restarted: every old entry superseded, the first new one seeds
    ([(A1, "10.0.0.1:7000"), (B1, "10.0.0.2:7000"), (B2, STARTING), (A2, STARTING)], B2, ALL,
     Seed()),
    ([(A1, "10.0.0.1:7000"), (B1, "10.0.0.2:7000"), (B2, STARTING), (A2, STARTING)], A2, ALL,
     Wait()),
    # our own host's earlier entry is never a peer
    ([(A1, "10.0.0.1:7000"), (A2, STARTING)], A2, ALL, Seed()),
])
def test_decide(entries: list[tuple[str, str | None]], mine: str, live: set[str],
                expected: Decision) -> None:
    assert decide(entries, mine, live) == expected


def test_an_unregistered_key_is_a_fault() -> None:
    with pytest.raises(ValueError, match="not registered"):
        decide([(A1, STARTING)], B1, ALL)


def test_keys_name_their_host() -> None:
    assert host_of(entry_key("fe80::1", "n")) == "fe80::1" and host_of(A2) == "10.0.0.1"


def test_the_core_does_no_io() -> None:
    assert top_level_imports(rendezvous_module) <= {"__future__", "collections", "dataclasses"}
