"""Membership and rendezvous ownership: tables of joins and deaths, and ownership movement."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from hoplite_client.wire.ids import ObjectID
from hoplite_client.wire.messages import MemberInfo
from hoplited.cluster.membership import (
    OWNED_ID_BATCHES,
    OWNED_ID_OWNERS,
    OWNER_CACHE,
    VECTOR_MIN,
    Membership,
    OwnerSet,
    owned_id,
    rejoin_seeds,
    rendezvous_owner,
    roster_digest,
)

pytestmark = pytest.mark.unit

ME = "b"
MASK64 = (1 << 64) - 1


def member(node_id: str, port: int = 7000) -> MemberInfo:
    return MemberInfo(node_id=node_id, host="10.0.0.1", port=port, socket=f"/tmp/{node_id}",
                      host_id=f"host-{node_id}")


Op = Callable[[Membership], bool]


def add(node_id: str, port: int = 7000) -> Op:
    return lambda m: m.add(member(node_id, port))


def mark_dead(node_id: str) -> Op:
    return lambda m: m.mark_dead(node_id)


@dataclass
class Step:
    """One operation, what it returns, the live list after it, and the listener's argument
    (the previous live list) if the live set changed."""

    op: Op
    returns: bool
    alive: list[str]
    notified: list[str] | None = None


@dataclass
class Case:
    id: str
    steps: list[Step]
    dead: set[str]
    ports: dict[str, int]  # the address each member is known by at the end


CASES = [
    Case("add a new member", [
        Step(add("a"), True, ["a", "b"], notified=["b"]),
    ], dead=set(), ports={"a": 7000, "b": 7000}),
    Case("add a known live member again: no change, its old address is kept", [
        Step(add("a"), True, ["a", "b"], notified=["b"]),
        Step(add("a"), False, ["a", "b"]),
        Step(add("a", port=7001), False, ["a", "b"]),
    ], dead=set(), ports={"a": 7000, "b": 7000}),
    Case("mark a member dead once; again, unknown and self are refused", [
        Step(add("a"), True, ["a", "b"], notified=["b"]),
        Step(mark_dead("a"), True, ["b"], notified=["a", "b"]),
        Step(mark_dead("a"), False, ["b"]),
        Step(mark_dead("zz"), False, ["b"]),
        Step(mark_dead(ME), False, ["b"]),
    ], dead={"a"}, ports={"a": 7000, "b": 7000}),
    Case("self cannot be marked dead even when alone", [
        Step(mark_dead(ME), False, ["b"]),
    ], dead=set(), ports={"b": 7000}),
    Case("a dead member is never added again under its id, at any address", [
        Step(add("a"), True, ["a", "b"], notified=["b"]),
        Step(mark_dead("a"), True, ["b"], notified=["a", "b"]),
        Step(add("a", port=7001), False, ["b"]),
        Step(mark_dead("a"), False, ["b"]),
    ], dead={"a"}, ports={"a": 7000, "b": 7000}),
    Case("alive ids stay sorted whatever the order of joins and deaths", [
        Step(add("d"), True, ["b", "d"], notified=["b"]),
        Step(add("a"), True, ["a", "b", "d"], notified=["b", "d"]),
        Step(add("c"), True, ["a", "b", "c", "d"], notified=["a", "b", "d"]),
        Step(mark_dead("b"), False, ["a", "b", "c", "d"]),
        Step(mark_dead("c"), True, ["a", "b", "d"], notified=["a", "b", "c", "d"]),
        Step(add("e"), True, ["a", "b", "d", "e"], notified=["a", "b", "d"]),
        Step(mark_dead("a"), True, ["b", "d", "e"], notified=["a", "b", "d", "e"]),
    ], dead={"a", "c"}, ports={"a": 7000, "b": 7000, "c": 7000, "d": 7000, "e": 7000}),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_membership_table(case: Case) -> None:
    m = Membership(member(ME))
    calls: list[list[str]] = []
    seen_by_second: list[tuple[list[str], list[str]]] = []
    m.listeners.append(calls.append)
    m.listeners.append(lambda previous: seen_by_second.append((previous, m.alive_ids())))
    kept: list[tuple[list[str], list[str]]] = []  # (object passed, its value at the call)
    for step in case.steps:
        before = len(calls)
        assert step.op(m) is step.returns
        assert m.alive_ids() == step.alive
        expected = [] if step.notified is None else [step.notified]
        assert calls[before:] == expected
        if step.notified is not None:
            kept.append((calls[-1], list(calls[-1])))
            # every listener runs, after the live list has changed
            assert seen_by_second[-1] == (step.notified, step.alive)
        assert all(m.is_alive(n) for n in step.alive)
    assert len(seen_by_second) == len(calls)
    assert all(obj == value for obj, value in kept)  # no listener's list mutated afterwards
    assert m.dead == case.dead
    assert {n: i.port for n, i in m.members.items()} == case.ports
    assert not any(m.is_alive(n) for n in case.dead | {"never-added"})


def test_owner_is_a_live_member() -> None:
    m = Membership(member(ME))
    for n in "acd":
        m.add(member(n))
    m.mark_dead("c")
    owners = {m.owner(oid) for oid in random_ids(500, seed=1)}
    assert owners == {"a", "b", "d"}


# --- rendezvous ownership ---
def random_ids(n: int, seed: int) -> list[ObjectID]:
    rng = random.Random(seed)
    return [ObjectID(rng.randbytes(20)) for _ in range(n)]


IDS = random_ids(4000, seed=7)
NODES = [f"node-{i}" for i in range(6)]


def owners(nodes: list[str]) -> dict[ObjectID, str]:
    return {oid: rendezvous_owner(oid, nodes) for oid in IDS}


def test_rendezvous_is_deterministic_and_order_free() -> None:
    first = owners(NODES)
    assert owners(list(reversed(NODES))) == first
    assert owners(random.Random(3).sample(NODES, len(NODES))) == first
    assert rendezvous_owner(ObjectID(bytes(20)), ["x"]) == "x"
    # a fixed answer, so a change of hash (which would move every id of a running cluster
    # between versions) cannot pass unnoticed
    golden = ["node-2", "node-1", "node-2", "node-5", "node-0", "node-2", "node-4", "node-0"]
    assert [rendezvous_owner(ObjectID(bytes([i]) * 20), NODES) for i in range(8)] == golden


def reference_owner(oid: ObjectID, nodes: list[str]) -> str:
    """The score as docs/design.md §2.3 states it, one member at a time in Python's integers."""
    def h(data: bytes) -> int:
        return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")

    def score(node: str) -> int:
        z = h(oid.binary()) ^ h(node.encode())
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)
    return max(sorted(nodes), key=score)


@pytest.mark.parametrize("count", [1, 2, 6, VECTOR_MIN - 1, VECTOR_MIN, 1000])
def test_both_ways_of_scoring_give_the_stated_score(count: int) -> None:
    """Small owner sets are scored member by member, larger ones as one numpy operation."""
    nodes = [f"10.0.{i // 250}.{i % 250}:7000" for i in range(count)]
    for oid in IDS[:200]:
        assert rendezvous_owner(oid, nodes) == reference_owner(oid, nodes)


def test_rendezvous_spreads_ids_over_nodes() -> None:
    counts = {n: 0 for n in NODES}
    for owner in owners(NODES).values():
        counts[owner] += 1
    share = len(IDS) / len(NODES)
    assert all(0.8 * share < c < 1.2 * share for c in counts.values()), counts


@pytest.mark.parametrize("gone", NODES)
def test_removing_a_node_moves_only_the_ids_it_owned(gone: str) -> None:
    before = owners(NODES)
    after = owners([n for n in NODES if n != gone])
    moved = {oid for oid in IDS if before[oid] != after[oid]}
    assert moved == {oid for oid in IDS if before[oid] == gone}
    assert moved  # each node owned some
    assert gone not in after.values()


@pytest.mark.parametrize("new", ["node-6", "late-joiner", "a"])
def test_adding_a_node_moves_only_the_ids_it_now_owns(new: str) -> None:
    before = owners(NODES)
    after = owners([*NODES, new])
    moved = {oid for oid in IDS if before[oid] != after[oid]}
    assert moved == {oid for oid in IDS if after[oid] == new}
    assert 0.5 * len(IDS) / 7 < len(moved) < 1.5 * len(IDS) / 7


def test_rendezvous_of_no_nodes_is_an_error() -> None:
    with pytest.raises(ValueError):
        rendezvous_owner(ObjectID(bytes(20)), [])


# --- suspicion: silent live members, before any verdict ---
SUSPICION = [
    # (operations, suspected afterwards, what listeners heard)
    ([("suspect", "a")], {"a"}, [("a", True)]),
    ([("suspect", "a"), ("suspect", "a")], {"a"}, [("a", True)]),  # heard once
    ([("suspect", "a"), ("trust", "a")], set(), [("a", True), ("a", False)]),
    ([("trust", "a")], set(), []),  # never suspected: nothing to hear
    ([("suspect", ME)], set(), []),  # never ourselves
    ([("suspect", "zz")], set(), []),  # not a member
    ([("suspect", "a"), ("dead", "a")], set(), [("a", True)]),  # the verdict supersedes it
    ([("dead", "a"), ("suspect", "a")], set(), []),  # dead already
    ([("suspect", "a"), ("dead", "a"), ("add", "a")], set(), [("a", True)]),  # stays dead
]


def apply(m: Membership, ops: list[tuple[str, str]]) -> None:
    """Carry out ("suspect" | "trust" | "dead" | "add", node) operations in order."""
    for op, node in ops:
        if op == "dead":
            m.mark_dead(node)
        elif op == "add":
            m.add(member(node))
        else:
            m.suspect(node, op == "suspect")


@pytest.mark.parametrize(("ops", "suspected", "heard"), SUSPICION)
def test_suspicion(ops: list[tuple[str, str]], suspected: set[str],
                   heard: list[tuple[str, bool]]) -> None:
    m = Membership(member(ME))
    m.add(member("a"))
    got: list[tuple[str, bool]] = []
    m.suspicion_listeners.append(lambda node, s: got.append((node, s)))
    apply(m, ops)
    assert m.suspected == suspected
    assert got == heard
    assert m.is_trusted("a") == (m.is_alive("a") and "a" not in suspected)
    assert m.owner(ObjectID.random()) in m.owner_ids()  # a trusted member


# --- ownership follows trust: a suspected member's objects are served by a stand-in ---
OWNER_MOVES = [
    # (operations on a cluster of a, b (us), c; owner sets before each move heard; owners after)
    ([("suspect", "a")], [["a", "b", "c"]], ["b", "c"]),
    ([("suspect", "a"), ("trust", "a")], [["a", "b", "c"], ["b", "c"]], ["a", "b", "c"]),
    # the verdict on a suspected member moves nothing more: its stand-ins own its objects
    ([("suspect", "a"), ("dead", "a")], [["a", "b", "c"]], ["b", "c"]),
    ([("dead", "a")], [["a", "b", "c"]], ["b", "c"]),
    # a dead member stays dead: its process comes back under another id
    ([("suspect", "a"), ("dead", "a"), ("add", "a")], [["a", "b", "c"]], ["b", "c"]),
    ([("suspect", "a"), ("suspect", "c")], [["a", "b", "c"], ["b", "c"]], ["b"]),
    ([("suspect", ME)], [], ["a", "b", "c"]),
]


@pytest.mark.parametrize(("ops", "heard", "owners_after"), OWNER_MOVES)
def test_owner_set_follows_trust(ops: list[tuple[str, str]], heard: list[list[str]],
                                 owners_after: list[str]) -> None:
    m = Membership(member(ME))
    m.add(member("a"))
    m.add(member("c"))
    got: list[list[str]] = []
    m.owner_listeners.append(lambda previous: got.append(list(previous.nodes)))
    apply(m, ops)
    assert got == heard
    assert m.owner_ids() == owners_after


def test_a_suspected_members_objects_go_where_its_death_would_send_them() -> None:
    """Stand-ins are the owners a verdict would choose, so suspicion then death moves each
    object once; trust restored gives every object back."""
    m = Membership(member(ME))
    for n in "acd":
        m.add(member(n))
    before = {oid: m.owner(oid) for oid in IDS}
    m.suspect("a", True)
    standing_in = {oid: m.owner(oid) for oid in IDS}
    assert "a" not in standing_in.values()
    assert all(standing_in[oid] == before[oid] for oid in IDS if before[oid] != "a")
    assert standing_in == {oid: rendezvous_owner(oid, ["b", "c", "d"]) for oid in IDS}
    m.suspect("a", False)
    assert {oid: m.owner(oid) for oid in IDS} == before
    m.suspect("a", True)
    m.mark_dead("a")
    assert {oid: m.owner(oid) for oid in IDS} == standing_in


def test_remembered_owners_follow_every_change_of_the_owner_set() -> None:
    """Owners are remembered per id, so a join, a death or a suspicion must forget them all,
    and the memory stays bounded however many ids are asked about."""
    m = Membership(member(ME))
    assert {m.owner(oid) for oid in IDS} == {ME}
    m.add(member("a"))
    m.add(member("c"))
    assert {oid: m.owner(oid) for oid in IDS} == {
        oid: rendezvous_owner(oid, ["a", "b", "c"]) for oid in IDS}
    m.mark_dead("c")
    assert {oid: m.owner(oid) for oid in IDS} == {
        oid: rendezvous_owner(oid, ["a", "b"]) for oid in IDS}
    m.suspect("a", True)
    assert {m.owner(oid) for oid in IDS} == {ME}
    for oid in random_ids(OWNER_CACHE + 100, seed=7):
        assert m.owner(oid) == ME
    assert len(m._owner_of) <= OWNER_CACHE


# --- where a member declared dead joins again ---
REJOIN = [
    # (members besides us (b), their ports, the dead among them, the fencer, seeds in order)
    (["a", "c", "d"], {}, set(), "c", [("h", 3), ("h", 1), ("h", 4)]),  # the fencer first
    (["a", "c", "d"], {}, {"a"}, "d", [("h", 4), ("h", 3), ("h", 1)]),  # the dead last
    # cut off alone, fenced by another node cut off alone: the rest is among our dead
    (["a", "c", "d"], {}, {"a", "d"}, "c", [("h", 3), ("h", 1), ("h", 4)]),
    (["a", "c"], {"c": 1}, set(), "a", [("h", 1)]),  # an address once
    (["a"], {}, set(), "a", [("h", 1)]),
]


@pytest.mark.parametrize(("others", "ports", "dead", "by", "seeds"), REJOIN)
def test_rejoin_seeds(others: list[str], ports: dict[str, int], dead: set[str], by: str,
                      seeds: list[tuple[str, int]]) -> None:
    m = Membership(MemberInfo(node_id=ME, host="h", port=2, socket="", host_id=""))
    for n in others:
        m.add(MemberInfo(node_id=n, host="h", port=ports.get(n, " abcd".index(n)), socket="",
                         host_id=""))
    for n in dead:
        m.mark_dead(n)
    assert rejoin_seeds(m, by) == seeds


def test_only_a_member_declared_dead_is_refused_and_the_refusal_carries_our_live_set() -> None:
    m = Membership(member(ME))
    for n in "acd":
        m.add(member(n))
    m.mark_dead("c")
    assert m.refusal("a") is None and m.refusal("never-added") is None
    refusal = m.refusal("c")
    assert refusal is not None and refusal.code == "declared_dead"
    assert refusal.data == {"by": ME, "alive": "a,b,d"}


@pytest.mark.parametrize(("a", "b", "same"), [
    (["a", "b", "c"], ["c", "a", "b"], True),  # the order does not matter
    (["a", "b", "c"], ["a", "b"], False),
    (["a", "b"], ["a", "b", "c"], False),
    (["ab", "c"], ["a", "bc"], False),  # ids are kept apart
    ([], [], True),
])
def test_roster_digests_are_equal_exactly_for_equal_live_sets(a: list[str], b: list[str],
                                                              same: bool) -> None:
    assert (roster_digest(a) == roster_digest(b)) is same
    assert len(roster_digest(a)) == 16


# --- ids a put's own node owns (docs/design.md §2.4) ---------------------------------------

def drawing(seed: int) -> Callable[[int], list[ObjectID]]:
    """A reproducible ``draw`` for ``owned_id``, counting the ids it hands out."""
    rng = random.Random(seed)

    def draw(n: int) -> list[ObjectID]:
        draw.count += n  # type: ignore[attr-defined]
        return [ObjectID(rng.randbytes(20)) for _ in range(n)]
    draw.count = 0  # type: ignore[attr-defined]
    return draw


@pytest.mark.parametrize("count", [1, 2, 4, 8, VECTOR_MIN - 1, VECTOR_MIN, 33, OWNED_ID_OWNERS])
def test_first_owned_agrees_with_owner(count: int) -> None:
    """The batch's scores are ``owner``'s, ties and all: the id it picks is the first that
    ``owner`` gives to ``me``."""
    nodes = [f"10.0.0.{i}:7000" for i in range(count)]
    owner_set = OwnerSet(nodes)
    for me in nodes[:3]:
        expected = next((oid for oid in IDS[:300] if owner_set.owner(oid) == me), None)
        assert owner_set.first_owned(me, IDS[:300]) == expected


@pytest.mark.parametrize("count", [1, 2, 4, 8, 16, OWNED_ID_OWNERS])
def test_a_put_id_is_owned_by_its_node_while_owners_are_few(count: int) -> None:
    """Of 200 ids chosen for puts on one node of a small cluster, nearly all are owned by that
    node (each batch of N draws finds one with chance 1 - (1 - 1/N)^N), and choosing one
    takes at most OWNED_ID_BATCHES batches of N draws."""
    nodes = [f"node-{i}" for i in range(count)]
    owner_set, draw = OwnerSet(nodes), drawing(count)
    ids = [owned_id(owner_set, nodes[-1], draw) for _ in range(200)]
    mine = sum(owner_set.owner(oid) == nodes[-1] for oid in ids)
    assert mine >= 190 and len(set(ids)) == 200
    assert draw.count <= 200 * OWNED_ID_BATCHES * count  # type: ignore[attr-defined]


@pytest.mark.parametrize("owners,me", [
    ([f"node-{i}" for i in range(OWNED_ID_OWNERS + 1)], "node-0"),  # too many to draw for
    (["node-0", "node-1"], "outsider"),  # owns nothing: not in the owner set
], ids=["many owners", "not an owner"])
def test_a_put_id_is_one_draw_where_owning_it_is_out_of_reach(owners: list[str],
                                                              me: str) -> None:
    draw = drawing(7)
    owned_id(OwnerSet(owners), me, draw)
    assert draw.count == 1  # type: ignore[attr-defined]
