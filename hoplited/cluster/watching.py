"""Who pings whom: each member is watched by a fixed number of others, not by everyone.

With every member pinging every other one, an idle daemon's CPU grows with the cluster (about
0.1% of a core per peer here, a core at 1,000 members; docs/design.md §5, "Watchers"). Here
the live members stand on a ring ordered by a hash of their ids, and each one pings the
``watchers`` members that follow it: every member has exactly that many watchers (its
predecessors), and a member's share of the pinging stays the same however large the cluster.
The rest learn of a silent member from an ``Alarm`` its watchers send, and check it with a
Ping of their own (docs/design.md §5, "Watchers"). Clusters of at most ``watchers + 1``
members are a full mesh: everyone pings everyone.

Every node computes the same ring from the same membership; views that differ for a moment
(a death not yet known everywhere) only shift a few watchers for that moment.
"""

from __future__ import annotations

from collections.abc import Iterable

from hoplite_client.wire.errors import InvalidArgumentError
from hoplited.cluster.membership import node_key

# How many of a silent member's watchers tell each member that does not watch it: enough that
# a watcher that is itself cut off or dead does not keep the news from anyone, few enough that
# one event costs a few messages per member, not one per watcher (docs/design.md §5).
ALARM_COPIES = 3

# How many members are asked to ping a peer we cannot reach before we declare it dead: a few,
# so that one helper cut off from it too, or dead, does not condemn it (docs/design.md §5,
# "A link broken between two members").
VOUCHERS = 3


def _neighbours(node: str, alive: Iterable[str], watchers: int, step: int) -> list[str]:
    """The ``watchers`` members after ``node`` on the ring (``step`` 1) or before it (-1),
    nearest first; every other member when there are no more than that."""
    if watchers < 1:
        raise InvalidArgumentError(f"watchers must be at least 1, not {watchers}")
    ring = sorted({*alive, node}, key=lambda n: (node_key(n), n))
    at = ring.index(node)
    count = min(watchers, len(ring) - 1)
    return [ring[(at + step * i) % len(ring)] for i in range(1, count + 1)]


def watched_by(me: str, alive: Iterable[str], watchers: int) -> frozenset[str]:
    """The members ``me`` pings every interval: the ``watchers`` that follow it on the ring."""
    return frozenset(_neighbours(me, alive, watchers, 1))


def watchers_of(node: str, alive: Iterable[str], watchers: int) -> frozenset[str]:
    """The members that ping ``node`` every interval: the ``watchers`` that precede it."""
    return frozenset(_neighbours(node, alive, watchers, -1))


def to_alarm(me: str, node: str, alive: Iterable[str], watchers: int,
             copies: int = ALARM_COPIES) -> list[str]:
    """Whom a watcher of ``node`` tells that it fell silent, sorted: its share of the live
    members that do not watch ``node`` (none in a full mesh). The others stand in id order
    and the watchers in ring order, and the ``j``-th other is told by the watchers ``j`` to
    ``j + copies - 1`` round the ring: ``copies`` alarms per member, not one per watcher. A
    watcher that is not one in this view (views differ for a moment) tells them all."""
    alive = set(alive)
    around = _neighbours(node, alive, watchers, -1)
    others = sorted(alive - {*around, me, node})
    if me not in around or len(around) <= copies:
        return others
    at, k = around.index(me), len(around)
    return [other for j, other in enumerate(others) if (at - j) % k < copies]


def vouchers(peer: str, trusted: Iterable[str], count: int = VOUCHERS,
             turn: int = 0) -> list[str]:
    """Whom to ask to ping ``peer`` for us: ``count`` of the ``trusted`` members (alive, not
    suspected, not us), those that follow ``peer`` on the ring, the window moved on by
    ``count`` at each ``turn`` so that successive asks try other members."""
    if count < 1:
        raise InvalidArgumentError(f"count must be at least 1, not {count}")
    ring = sorted({*trusted, peer}, key=lambda n: (node_key(n), n))
    at = ring.index(peer)
    after = ring[at + 1:] + ring[:at]
    if len(after) <= count:
        return after
    start = (turn * count) % len(after)
    return [after[(start + i) % len(after)] for i in range(count)]


def roster_partner(me: str, trusted: Iterable[str], turn: int) -> str | None:
    """Whom to compare live sets with at ``turn`` (docs/design.md §5, "Membership converges"):
    the ``turn``-th trusted member after us on the ring, round and round, so that each is asked
    once every len(trusted) turns. None when we trust nobody else."""
    ring = sorted({*trusted, me}, key=lambda n: (node_key(n), n))
    if len(ring) < 2:
        return None
    at = ring.index(me)
    return ring[(at + 1 + turn % (len(ring) - 1)) % len(ring)]
