"""IdlePool: which kept data connection a pull reuses, and which kept ones are closed."""

from __future__ import annotations

import math

import pytest

from hoplite_client.wire.errors import InvalidArgumentError
from hoplited.transfer.idle_pool import IdlePool

# Each step: (call, node, connection or None, now) -> (what it returns, idle count of "a" after).
Step = tuple[str, str, str | None, float, object, int]

TABLE: dict[str, list[Step]] = {
    "reuse-newest-first": [
        ("put", "a", "c1", 0.0, [], 1),
        ("put", "a", "c2", 1.0, [], 2),
        ("take", "a", None, 2.0, ("c2", []), 1),
        ("take", "a", None, 2.0, ("c1", []), 0),
        ("take", "a", None, 2.0, (None, []), 0),
    ],
    "bounded-per-source-oldest-closed": [
        ("put", "a", "c1", 0.0, [], 1),
        ("put", "a", "c2", 0.0, [], 2),
        ("put", "a", "c3", 0.0, ["c1"], 2),
        ("put", "b", "d1", 0.0, [], 2),  # another member's bound is its own
        ("take", "a", None, 0.0, ("c3", []), 1),
    ],
    "expired-ones-closed-on-any-call": [
        ("put", "a", "c1", 0.0, [], 1),
        ("put", "a", "c2", 5.0, [], 2),
        ("take", "a", None, 10.0, ("c2", ["c1"]), 0),  # c1 expired at 10
        ("put", "a", "c3", 11.0, [], 1),
        ("expire", "", None, 20.9, [], 1),
        ("expire", "", None, 21.0, ["c3"], 0),
    ],
    "unusable-passed-over-and-closed": [
        ("put", "a", "c1", 0.0, [], 1),
        ("put", "a", "dead", 0.0, [], 2),
        ("take", "a", None, 1.0, ("c1", ["dead"]), 0),
    ],
    "a-death-closes-its-members-only": [
        ("put", "a", "c1", 0.0, [], 1),
        ("put", "b", "d1", 0.0, [], 1),
        ("drop", "a", None, 0.0, ["c1"], 0),
        ("take", "b", None, 0.0, ("d1", []), 0),
    ],
    "closed-while-idle-is-forgotten": [
        ("put", "a", "c1", 0.0, [], 1),
        ("put", "a", "c2", 0.0, [], 2),
        ("forget", "a", "c1", 0.0, True, 1),
        ("forget", "a", "c1", 0.0, False, 1),
        ("forget", "b", "c2", 0.0, False, 1),
        ("take", "a", None, 0.0, ("c2", []), 0),
    ],
}


@pytest.mark.parametrize("steps", TABLE.values(), ids=TABLE.keys())
def test_idle_pool(steps: list[Step]) -> None:
    pool: IdlePool[str] = IdlePool(per_source=2, idle_timeout=10.0)
    for call, node, conn, now, expected, left in steps:
        if call == "put":
            assert conn is not None
            got: object = pool.put(node, conn, now)
        elif call == "take":
            got = pool.take(node, now, lambda c: c != "dead")
        elif call == "forget":
            assert conn is not None
            got = pool.forget(node, conn)
        elif call == "drop":
            got = pool.drop(node)
        else:
            got = pool.expire(now)
        assert got == expected, (call, node, conn, now)
        assert pool.idle("a") == left, (call, node, conn, now)


def test_each_members_newest_kept_ones_never_expire() -> None:
    pool: IdlePool[str] = IdlePool(per_source=3, idle_timeout=10.0, keep=1)
    pool.put("a", "c1", 0.0)
    pool.put("a", "c2", 1.0)
    pool.put("b", "d1", 0.0)
    assert pool.next_expiry() == 10.0  # c1's; c2 and d1 stand
    assert pool.expire(100.0) == ["c1"]
    assert pool.next_expiry() is None
    assert pool.take("a", 1000.0) == ("c2", [])  # standing, however old
    assert pool.drop("b") == ["d1"]  # a death closes standing ones too


def test_next_expiry_is_the_oldest_connections() -> None:
    pool: IdlePool[str] = IdlePool(per_source=4, idle_timeout=10.0)
    assert pool.next_expiry() is None
    pool.put("a", "c1", 3.0)
    pool.put("b", "d1", 1.0)
    pool.put("a", "c2", 4.0)
    assert pool.next_expiry() == 11.0
    assert sorted(pool.drop_all()) == ["c1", "c2", "d1"]
    assert len(pool) == 0 and pool.next_expiry() is None


def test_a_pool_of_size_zero_keeps_nothing() -> None:
    pool: IdlePool[str] = IdlePool(per_source=0, idle_timeout=10.0)
    assert pool.put("a", "c1", 0.0) == ["c1"]
    assert pool.take("a", 0.0) == (None, [])


@pytest.mark.parametrize("per_source,timeout,keep,spare", [
    (-1, 10.0, 0, 0), (2, 0.0, 0, 0), (2, -1.0, 0, 0), (2, math.nan, 0, 0), (2, 10.0, 3, 0),
    (2, 10.0, -1, 0), (2, 10.0, 0, 3), (2, 10.0, 0, -1)])
def test_bad_settings_are_refused(per_source: int, timeout: float, keep: int,
                                  spare: int) -> None:
    with pytest.raises(InvalidArgumentError):
        IdlePool(per_source, timeout, keep, spare)


# (call, node, now, expected, idle to "a" after): "refill" asks whether to dial one more,
# "dialled" ends such a dial, "put" keeps connection "cN", "take" takes one.
Refill = tuple[str, str, float, object, int]

REFILLS: dict[str, list[Refill]] = {
    "an-empty-pool-dials-one-spare": [
        ("refill", "a", 0.0, True, 0),
        ("refill", "a", 0.0, False, 0),  # one is under way
        ("dialled", "a", 0.0, None, 0),
        ("refill", "a", 0.0, True, 0),  # it failed: dial again
    ],
    "a-spare-kept-idle-asks-for-nothing": [
        ("refill", "a", 0.0, True, 0),
        ("put", "a", 0.0, [], 1),
        ("dialled", "a", 0.0, None, 1),
        ("refill", "a", 0.0, False, 1),
    ],
    "a-take-of-the-last-one-asks-for-another": [
        ("put", "a", 0.0, [], 1),
        ("refill", "a", 0.0, False, 1),
        ("take", "a", 1.0, "c1", 0),
        ("refill", "a", 1.0, True, 0),
        ("refill", "a", 1.0, False, 0),
    ],
    "each-member-counts-its-own": [
        ("refill", "a", 0.0, True, 0),
        ("refill", "b", 0.0, True, 0),
        ("dialled", "b", 0.0, None, 0),
        ("refill", "a", 0.0, False, 0),
        ("refill", "b", 0.0, True, 0),
    ],
}


@pytest.mark.parametrize("steps", REFILLS.values(), ids=REFILLS.keys())
def test_refill_keeps_one_spare(steps: list[Refill]) -> None:
    pool: IdlePool[str] = IdlePool(per_source=4, idle_timeout=10.0, keep=1, spare=1)
    puts = 0
    for call, node, now, expected, left in steps:
        if call == "refill":
            got: object = pool.refill(node)
        elif call == "dialled":
            got = pool.dialled(node)
        elif call == "put":
            puts += 1
            got = pool.put(node, f"c{puts}", now)
        else:
            got = pool.take(node, now)[0]
        assert got == expected, (call, node, now)
        assert pool.idle("a") == left, (call, node, now)


def test_without_spares_nothing_is_dialled_ahead() -> None:
    pool: IdlePool[str] = IdlePool(per_source=4, idle_timeout=10.0)
    assert not pool.refill("a")
